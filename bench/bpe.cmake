# bench_bpe: GPT-2 BPE encode MB/s (worker/model/zs_bpe*.c) against tiktoken's
# gpt2 encoding under Node.js, in the same run.
add_executable(bench_bpe bench_bpe.c)
target_link_libraries(bench_bpe PRIVATE zeroshard zs_bench)
target_compile_definitions(bench_bpe PRIVATE ZS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
