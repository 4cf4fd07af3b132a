# bench_rpc: zs-server push/pull GB/s against a raw TCP socket, and the unary
# round trip. Spawns zs-server through the test process helpers (tests/zs_proc.c).
add_executable(bench_rpc bench_rpc.c)
if(TARGET zs_testproc)
  target_link_libraries(bench_rpc PRIVATE zeroshard zs_bench zs_testproc)
else()
  target_sources(bench_rpc PRIVATE ${PROJECT_SOURCE_DIR}/tests/zs_proc.c)
  target_include_directories(bench_rpc PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(bench_rpc PRIVATE ZS_BINARY_DIR="${PROJECT_BINARY_DIR}")
  target_link_libraries(bench_rpc PRIVATE zeroshard zs_bench)
endif()
add_dependencies(bench_rpc zs-server)
