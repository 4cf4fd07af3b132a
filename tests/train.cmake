# zs-train end to end (issue 4): needs zs-train and zs-tokenize.
zs_add_test(test_train SRCS test_train.c LIBS zs_testproc TIMEOUT 900 LABELS integration)
target_compile_definitions(test_train PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_train zs-train zs-tokenize zs-server)
# How zs-train fails before training (issue 9): one error line from rank 0,
# the documented exit codes, --allow-unknown-keys. 2 MPI workers, no servers.
zs_add_test(test_train_exit SRCS test_train_exit.c LIBS zs_testproc TIMEOUT 120 LABELS integration)
target_compile_definitions(test_train_exit PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_train_exit zs-train zs-tokenize)
