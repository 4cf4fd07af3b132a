# bench_fit's search is honest (tests/test_fit.c): on the CPU device with an
# 8 MiB device memory limit it reruns the reported largest GPT (must train
# within the limit) and the next size up (must be out of device memory).
zs_add_test(test_fit SRCS test_fit.c LIBS m LABELS integration TIMEOUT 180)
add_dependencies(test_fit bench_fit zs-server)
