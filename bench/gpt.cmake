# bench_gpt: tokens/s of the CPU GPT model's train step (forward, backward,
# AdamW), with and without the engine at W=1; baselines are quoted llm.c figures.
add_executable(bench_gpt bench_gpt.c)
target_link_libraries(bench_gpt PRIVATE zeroshard zs_bench m)
