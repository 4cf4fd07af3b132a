# bench_nvme: the driver of bench_nvme.sh (zs-server --nvme-path against fio).
add_executable(bench_nvme bench_nvme.c)
target_link_libraries(bench_nvme PRIVATE zeroshard)
add_dependencies(bench_nvme zs-server)
