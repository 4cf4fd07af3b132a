# common/: status codes, layout, the text buffer.
zs_add_test(test_status SRCS test_status.c LIBS zs_common LABELS unit)
zs_add_test(test_layout SRCS test_layout.c LIBS zs_common LABELS unit)
zs_add_test(test_strbuf SRCS test_strbuf.c LIBS zs_common LABELS unit)
zs_add_test(test_shm SRCS test_shm.c LIBS zs_shm TIMEOUT 120 LABELS unit)
