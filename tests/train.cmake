# zs-train end to end (issue 4): needs zs-train and zs-tokenize.
zs_add_test(test_train SRCS test_train.c LIBS zs_testproc TIMEOUT 900 LABELS integration)
target_compile_definitions(test_train PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>"
                           ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_train zs-train zs-tokenize zs-server zs-ctl)
# How zs-train fails before training (issue 9): one error line from rank 0,
# the documented exit codes, --allow-unknown-keys. 2 MPI workers, no servers.
zs_add_test(test_train_exit SRCS test_train_exit.c LIBS zs_testproc TIMEOUT 120 LABELS integration)
target_compile_definitions(test_train_exit PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_train_exit zs-train zs-tokenize)
# zs-train --init-from (issue 17): Hugging Face safetensors and llm.c
# checkpoints written by tests/ref/init_from_ref.py, step-1 loss against
# PyTorch, export -> init-from bitwise; 2 zs-servers for the export part.
zs_add_test(test_init_from SRCS test_init_from.c LIBS zeroshard zs_testproc TIMEOUT 300
            LABELS integration)
target_compile_definitions(test_init_from PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>" ZS_CTL="$<TARGET_FILE:zs-ctl>"
                           ZS_GENERATE="$<TARGET_FILE:zs-generate>")
add_dependencies(test_init_from zs-train zs-ctl zs-server zs-generate)
set_tests_properties(test_init_from PROPERTIES SKIP_RETURN_CODE 77)
# Speculative updates with a pre-image window smaller than each server's
# range (issue 18): super_offload on == off bitwise, W = 1 and 2, stages
# 0-3, fp32/bf16/fp16, clipping that rolls every step back.
zs_add_test(test_spec_window SRCS test_spec_window.c LIBS zeroshard zs_testproc TIMEOUT 600
            LABELS integration)
target_compile_definitions(test_spec_window PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_spec_window zs-train zs-tokenize zs-server)
# zs-train with activation checkpointing (issue 16): --activation-checkpointing
# and the config section with cpu_checkpointing give bitwise the parameters of
# the run without, W = 1 and 2, stages 2 and 3; W = 2 offloaded to 2 zs-servers.
zs_add_test(test_train_ckpt SRCS test_train_ckpt.c LIBS zs_testproc TIMEOUT 300 LABELS integration)
target_compile_definitions(test_train_ckpt PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_train_ckpt zs-train zs-tokenize zs-server)
# What zs-train says at start (the config's one line and its table file,
# --print-config) and the GPT-2 vocabulary a token file records: zs-train's
# samples and zs-generate (via zs-ctl export) decode without --vocab-dir.
# 2 zs-servers, 2 MPI workers, a small GPT-2-style vocabulary.
zs_add_test(test_train_vocab SRCS test_train_vocab.c LIBS zeroshard zs_testproc TIMEOUT 300
            LABELS integration)
target_compile_definitions(test_train_vocab PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>" ZS_CTL="$<TARGET_FILE:zs-ctl>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>"
                           ZS_GENERATE="$<TARGET_FILE:zs-generate>")
add_dependencies(test_train_vocab zs-train zs-ctl zs-server zs-tokenize zs-generate)
