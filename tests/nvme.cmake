# The NVMe tier of zs-server (--nvme-path; server/zs_nvme*.c, zs_shard_nvme.c).
zs_add_test(test_nvme_shard SRCS test_nvme_shard.c LIBS zs_server_core zs_testproc TIMEOUT 180 LABELS unit)
# kill -9 of an NVMe-tier zs-server mid-update and mid-checkpoint: resumes
# from the newest checkpoint, bitwise equal to a RAM server fed the same.
zs_add_test(test_nvme_crash SRCS test_nvme_crash.c LIBS zeroshard zs_testproc TIMEOUT 180 LABELS integration)
add_dependencies(test_nvme_crash zs-server)
