# The NVMe tier of zs-server (--nvme-path; server/zs_nvme*.c, zs_shard_nvme.c).
zs_add_test(test_nvme_shard SRCS test_nvme_shard.c LIBS zs_server_core zs_testproc TIMEOUT 180 LABELS unit)
