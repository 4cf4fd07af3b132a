# The shard (state, optimizer driver, checkpoints), its gRPC service, zs-server.
# zs_service_shm.c and zs_shm_sessions.c: the shared-memory data plane of
# co-located workers (Push/Pull by reference; the shm socket's sessions).
# zs_nvme*.c, zs_shard_nvme.c: the NVMe tier (--nvme-path; liburing).
add_library(zs_server_core STATIC zs_shard.c zs_shard_push.c zs_shard_spec.c zs_shard_io.c zs_shard_ckpt.c zs_service.c zs_budget.c
            zs_service_shm.c zs_shm_sessions.c zs_nvme.c zs_nvme_pass.c zs_shard_nvme.c)
target_include_directories(zs_server_core PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(zs_server_core PUBLIC zs_store zs_kernels zs_proto zs_shm zs_common PkgConfig::URING)
add_executable(zs-server zs_server_main.c zs_server_metrics.c)
target_link_libraries(zs-server PRIVATE zs_server_core zs_metrics)
