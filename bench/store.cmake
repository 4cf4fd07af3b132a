# Checkpoint write/restore throughput of the RocksDB store against raw write()+fsync()/read().
add_executable(bench_ckpt bench_ckpt.c)
target_link_libraries(bench_ckpt PRIVATE zs_store zs_bench)
