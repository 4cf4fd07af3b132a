# The NVMe tier of zs-server (--nvme-path; server/zs_nvme*.c, zs_shard_nvme.c).
zs_add_test(test_nvme_shard SRCS test_nvme_shard.c LIBS zs_server_core zs_testproc TIMEOUT 180 LABELS unit)
# kill -9 of an NVMe-tier zs-server mid-update and mid-checkpoint: resumes
# from the newest checkpoint, bitwise equal to a RAM server fed the same.
zs_add_test(test_nvme_crash SRCS test_nvme_crash.c LIBS zeroshard zs_testproc TIMEOUT 180 LABELS integration)
add_dependencies(test_nvme_crash zs-server)
# The engine and zs-train on NVMe-tier servers: == RAM servers bitwise
# (stages 0-3, W 1 and 2, three dtypes, speculation asked or not, resume);
# offload_optimizer.device "nvme" trains there and names a RAM server;
# zs-ctl export and reshard from them.
zs_add_test(test_nvme_engine SRCS test_nvme_engine.c LIBS zs_testproc TIMEOUT 900 LABELS integration)
target_compile_definitions(test_nvme_engine PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_ENGINE_WORKER="$<TARGET_FILE:zs_engine_worker>"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>"
                           ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_nvme_engine zs_engine_worker zs-server zs-train zs-tokenize zs-ctl)
# offload_param.device "nvme" (worker/engine/zs_engine_nvme.c): the stage-3
# parameter partitions in files, bitwise offload_param cpu (W 1 and 2, fp32
# and bf16, max_in_cpu, unstreamed pulls, in-process AdamW, resume); params
# in host memory within the buffers (the allocator's table); refusals.
add_executable(zs_nvme_param_worker nvme_param_worker.c zs_mlp.c)
target_include_directories(zs_nvme_param_worker PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(zs_nvme_param_worker PRIVATE zeroshard)
zs_add_test(test_nvme_param SRCS test_nvme_param.c LIBS zs_testproc TIMEOUT 300 LABELS integration)
target_compile_definitions(test_nvme_param PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_NVME_PARAM_WORKER="$<TARGET_FILE:zs_nvme_param_worker>")
add_dependencies(test_nvme_param zs_nvme_param_worker zs-server)
