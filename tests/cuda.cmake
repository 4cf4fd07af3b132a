# The formulas shared by the CPU and CUDA kernels (kernels/zs_math.h), checked
# on CPU in every run; and the CUDA ops against their CPU twins, which need a
# GPU: without one test_cuda_ops prints "SKIPPED: <reason>" and exits 77,
# which ctest reports as skipped (never passed).
zs_add_test(test_math SRCS test_math.c LIBS zs_kernels LABELS unit TIMEOUT 120)
if(ZS_WITH_CUDA)
  zs_add_test(test_cuda_ops SRCS test_cuda_ops.c LIBS zs_cuda_kernels zs_kernels zs_cudart
              LABELS gpu TIMEOUT 300)
  set_tests_properties(test_cuda_ops PROPERTIES SKIP_RETURN_CODE 77)
  # the fused attention at kernel level (every case, T = 1024 included, on
  # a GPU; the emulated runs pick subsets: tests/emu.cmake)
  zs_add_test(test_cuda_attn SRCS test_cuda_attn.c LIBS zs_cuda_kernels zs_kernels zs_cudart
              LABELS gpu TIMEOUT 300)
  set_tests_properties(test_cuda_attn PROPERTIES SKIP_RETURN_CODE 77)
endif()
