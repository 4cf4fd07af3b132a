# test_gpu_carry: `tests/gpu.sh pack` into a temporary folder from this build
# (the GPU binaries must be built; nothing is rebuilt) and `tests/gpu.sh
# check` of it: in a private mount namespace with the carried Debian packages
# hidden, the carried binaries must load and `gpu.sh run` must end every step
# PASS or SKIP, and the carried orterun -np 2 zs-train --device cpu must train
# 10 steps against the carried zs-server (tests/gpu_carry_check.sh). Skipped
# (77, with the reason) without root, unshare -m, apt-get, network for
# `apt-get download`, or the CUDA parts built.
add_test(NAME test_gpu_carry
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu_carry_check.sh --selftest ${PROJECT_BINARY_DIR})
set_tests_properties(test_gpu_carry PROPERTIES TIMEOUT 300 LABELS integration SKIP_RETURN_CODE 77)
