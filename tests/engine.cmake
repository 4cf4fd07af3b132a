# The ZeRO engine: a test model, an MPI worker program, and the driver test
# that runs it under mpirun with real zs-server processes.
add_executable(zs_engine_worker engine_worker.c zs_mlp.c)
target_include_directories(zs_engine_worker PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(zs_engine_worker PRIVATE zeroshard)
zs_add_test(test_engine SRCS test_engine.c LIBS zs_testproc TIMEOUT 1200 LABELS integration)
target_compile_definitions(test_engine PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_ENGINE_WORKER="$<TARGET_FILE:zs_engine_worker>")
add_dependencies(test_engine zs_engine_worker zs-server)
# Section 7 of test_engine alone: the delayed parameter update
# (offload_optimizer.delayed_update_after), offload == in process bitwise,
# against the delaying reference, kill -9 and resume, stages 0 and 3 refused.
add_test(NAME test_engine_delayed COMMAND test_engine delayed)
set_tests_properties(test_engine_delayed PROPERTIES TIMEOUT 600 LABELS integration)
# The shared-memory transport (docs/engine.md, "Shared-memory transport"):
# engine_worker over shm == over tcp bitwise (stages 0-3, W 1 and 2, three
# dtypes, speculation, streamed pulls, resume), and a server without a
# socket named by --transport shm (zs-train exits 5) and logged under auto.
zs_add_test(test_engine_shm SRCS test_engine_shm.c LIBS zs_testproc TIMEOUT 900 LABELS integration)
target_compile_definitions(test_engine_shm PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_ENGINE_WORKER="$<TARGET_FILE:zs_engine_worker>"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_engine_shm zs_engine_worker zs-server zs-train zs-tokenize)
# MiCS (mics_shard_size, mics_hierarchical_params_gather; docs/engine.md
# "MiCS"): engine_worker at W = 4 with G = 2 against the single-process
# reference, bytes within and across nodes (ZS_RANKS_PER_NODE), memory at
# G = 2 vs 4, resume with another W and G from the servers, refusals.
zs_add_test(test_mics SRCS test_mics.c LIBS zs_testproc TIMEOUT 900 LABELS integration)
target_compile_definitions(test_mics PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_ENGINE_WORKER="$<TARGET_FILE:zs_engine_worker>")
add_dependencies(test_mics zs_engine_worker zs-server)
