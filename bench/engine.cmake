add_executable(bench_engine bench_engine.c)
target_link_libraries(bench_engine PRIVATE zeroshard zs_bench m)
