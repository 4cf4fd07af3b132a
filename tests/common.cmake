# common/: status codes, layout.
zs_add_test(test_status SRCS test_status.c LIBS zs_common LABELS unit)
zs_add_test(test_layout SRCS test_layout.c LIBS zs_common LABELS unit)
