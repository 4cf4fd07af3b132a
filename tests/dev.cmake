# Unit tests of the device interface (worker/dev): the CPU device's memory
# accounting, streams, events, sticky errors and vector ops.
zs_add_test(test_dev SRCS test_dev.c LIBS zs_dev LABELS unit TIMEOUT 120)
