# common/: status codes, layout, the text buffer.
zs_add_test(test_status SRCS test_status.c LIBS zs_common LABELS unit)
zs_add_test(test_layout SRCS test_layout.c LIBS zs_common LABELS unit)
zs_add_test(test_strbuf SRCS test_strbuf.c LIBS zs_common LABELS unit)
zs_add_test(test_shm SRCS test_shm.c LIBS zs_shm TIMEOUT 120 LABELS unit)
# XXH3 of bulk bytes: the AVX2 form (where the CPU has it) and libxxhash's own
# build, each against libxxhash's value.
zs_add_test(test_hash SRCS test_hash.c LIBS zs_hash LABELS unit)
add_test(NAME test_hash_portable COMMAND test_hash)
set_tests_properties(test_hash_portable PROPERTIES TIMEOUT 300 LABELS unit
                     ENVIRONMENT "ZS_HASH=portable")
