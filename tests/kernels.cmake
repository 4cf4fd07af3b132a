# Unit tests of the CPU kernels (kernels/) and the thread pool (common/zs_pool).
# test_adam also runs tests/ref/adam_torch.py with ZS_PYTHON (torch required).
zs_add_test(test_cast SRCS test_cast.c LIBS zs_kernels LABELS unit TIMEOUT 120)
zs_add_test(test_adam SRCS test_adam.c LIBS zs_kernels LABELS unit TIMEOUT 120)
zs_add_test(test_pool SRCS test_pool.c LIBS zs_common LABELS unit TIMEOUT 120)
