# Token data (worker/model/zs_data.c), the byte-level tokenizer (zs-tokenize) and
# the memory estimator (zs-ctl estimate).
zs_add_test(test_data SRCS test_data.c LIBS zeroshard LABELS unit)
zs_add_test(test_tokenize SRCS test_tokenize.c LIBS zeroshard LABELS unit)
target_compile_definitions(test_tokenize PRIVATE ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_tokenize zs-tokenize)
zs_add_test(test_estimate SRCS test_estimate.c LIBS zs_estimate LABELS unit)
target_compile_definitions(test_estimate PRIVATE ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_estimate zs-ctl)
