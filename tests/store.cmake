# Checkpoint store tests: unit (API, corruption, cleanup) and a kill -9 crash test.
zs_add_test(test_store SRCS test_store.c LIBS zs_store zs_testproc TIMEOUT 120 LABELS unit)
zs_add_test(test_store_crash SRCS test_store_crash.c LIBS zs_store TIMEOUT 180 LABELS integration)
