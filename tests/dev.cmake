# Unit tests of the device interface (worker/dev): the CPU device's memory
# accounting, streams, events, sticky errors and vector ops; the checks every
# device shares live in zs_devtest.c (test_dev_cuda runs them on CUDA).
zs_add_test(test_dev SRCS test_dev.c zs_devtest.c LIBS zs_dev LABELS unit TIMEOUT 120)
