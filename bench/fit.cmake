# bench_fit: the largest GPT that trains on one device with the optimizer
# offloaded to zs-servers it starts (stage 3 + offload_param, stage 2), found
# by real trials (child processes); --device cpu needs --mem-limit (the CPU
# device's memory limit), --device cuda skips (77) without a GPU.
add_executable(bench_fit bench_fit.c bench_fit_trial.c)
target_link_libraries(bench_fit PRIVATE zeroshard zs_bench zs_estimate m)
target_compile_definitions(bench_fit PRIVATE ZS_SERVER_PATH="$<TARGET_FILE:zs-server>")
add_dependencies(bench_fit zs-server)
