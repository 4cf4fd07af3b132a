# Token data (worker/model/zs_data.c), the byte-level tokenizer (zs-tokenize) and
# the memory estimator (zs-ctl estimate).
zs_add_test(test_data SRCS test_data.c LIBS zeroshard LABELS unit)
zs_add_test(test_tokenize SRCS test_tokenize.c LIBS zeroshard LABELS unit)
target_compile_definitions(test_tokenize PRIVATE ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_tokenize zs-tokenize)
# (test_estimate links libzeroshard: its activation estimate is compared with
# what the GPT allocates on the CPU device)
zs_add_test(test_estimate SRCS test_estimate.c LIBS zs_estimate zeroshard LABELS unit)
target_compile_definitions(test_estimate PRIVATE ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_estimate zs-ctl)
# llm.c .bin shards and lists/globs of token files (issue 17), and zs-train on
# them (2 MPI workers, no servers).
zs_add_test(test_data_llmc SRCS test_data_llmc.c LIBS zeroshard zs_testproc TIMEOUT 300
            LABELS integration)
target_compile_definitions(test_data_llmc PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>")
add_dependencies(test_data_llmc zs-train)
