# GPT-2 BPE (worker/model/zs_bpe*.c, zs-tokenize --gpt2) against tiktoken's
# gpt2 encoding under Node.js; skipped (77) without node and the npm packages
# that deploy/install-deps.sh installs under $ZS_NODE_DIR.
zs_add_test(test_bpe SRCS test_bpe.c LIBS zeroshard zs_testproc LABELS unit TIMEOUT 300)
target_compile_definitions(test_bpe PRIVATE ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_bpe zs-tokenize)
set_tests_properties(test_bpe PROPERTIES SKIP_RETURN_CODE 77)
