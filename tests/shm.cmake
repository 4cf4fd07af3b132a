# The shared-memory data plane's server half (docs/protocol.md, "Shared-memory
# data plane"): real zs-server processes, one with the shm socket and one
# without; this test is the co-located worker (raw calls, no worker/client).
zs_add_test(test_shm_server SRCS test_shm_server.c LIBS zs_proto zs_shm zs_testproc TIMEOUT 180
            LABELS integration)
add_dependencies(test_shm_server zs-server)
# One Push / Pull over shared memory in several concurrent streams per server
# (zs_client_opts_t.shm_streams) == one stream == tcp, bitwise.
zs_add_test(test_shm_streams SRCS test_shm_streams.c LIBS zeroshard zs_testproc TIMEOUT 240
            LABELS integration)
add_dependencies(test_shm_streams zs-server)
