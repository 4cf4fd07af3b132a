# bench_adam: fused AdamW kernel vs a memory-bound kernel and vs torch.optim.AdamW.
if(NOT ZS_PYTHON)
  set(ZS_PYTHON /usr/bin/python3)
endif()
add_executable(bench_adam bench_adam.c)
target_link_libraries(bench_adam PRIVATE zs_kernels zs_bench)
target_compile_definitions(bench_adam PRIVATE ZS_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                              ZS_PYTHON="${ZS_PYTHON}")
# bench_membound: AdamW's bytes per element with no math, one thread (the
# memory bound bench_spec.sh compares the servers' passes with).
add_executable(bench_membound bench_membound.c)
target_link_libraries(bench_membound PRIVATE zs_bench)
