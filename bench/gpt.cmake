# bench_gpt: tokens/s of the CPU GPT model's train step (forward, backward,
# AdamW), with and without the engine at W=1; baselines are quoted llm.c figures.
# --device cuda: bench_gpt_cuda.c (GPT-2 124M / 1.5B on one GPU, tokens/s and
# MFU, the engine with the optimizer on 2 zs-servers it starts itself).
add_executable(bench_gpt bench_gpt.c bench_gpt_cuda.c)
target_link_libraries(bench_gpt PRIVATE zeroshard zs_bench m)
target_compile_definitions(bench_gpt PRIVATE ZS_SERVER_PATH="$<TARGET_FILE:zs-server>")
