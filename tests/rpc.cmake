# proto/, server/ and the client: unit tests and integration tests with real
# zs-server processes on 127.0.0.1.
add_library(zs_testproc STATIC zs_proc.c)
target_compile_definitions(zs_testproc PRIVATE ZS_BINARY_DIR="${PROJECT_BINARY_DIR}")
target_include_directories(zs_testproc PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})

zs_add_test(test_server SRCS test_server.c LIBS zeroshard zs_testproc TIMEOUT 600
            LABELS integration)
set_tests_properties(test_server PROPERTIES DEPENDS zs-server)
# Protocol versions (docs/protocol.md, "Versions and negotiation"): version-1
# clients against a new server; the client and the engine against a server
# held to version 1 (--protocol-version 1) and a stand-in of a released
# version-1 server.
zs_add_test(test_protocol SRCS test_protocol.c LIBS zeroshard zs_testproc TIMEOUT 300
            LABELS integration)
target_compile_definitions(test_protocol PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_ENGINE_WORKER="$<TARGET_FILE:zs_engine_worker>")
add_dependencies(test_protocol zs-server zs_engine_worker)
# Parameter groups (protocol version 3): the ranges' checks and cutting, and
# two real zs-servers training, checkpointing and restoring with them.
zs_add_test(test_adam_groups SRCS test_adam_groups.c LIBS zeroshard zs_testproc TIMEOUT 120
            LABELS integration)
target_compile_definitions(test_adam_groups PRIVATE ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_adam_groups zs-server zs-ctl)
