# GPU tests (label "gpu"): the CUDA device (worker/dev/zs_dev_cuda*.c) and the
# NCCL collectives (worker/coll/zs_coll_nccl*.c). Built whenever nvcc (and
# NCCL) are found; where no GPU is usable they print "SKIPPED: no GPU: <CUDA's
# reason>" and exit 77, which ctest reports as skipped, never as passed.
# test_nccl_boot_np2 is the exception: the MPI bootstrap (unique id made on
# rank 0, broadcast, local ranks) and the clean "no GPU" refusal of the
# create are real checks that need no GPU; with one GPU it checks that two
# ranks on it are refused, with two it runs the collectives. tests/gpu.sh
# runs all of them on a machine with a GPU.
if(ZS_WITH_CUDA)
  zs_add_test(test_dev_cuda SRCS test_dev_cuda.c zs_devtest.c LIBS zs_dev LABELS "gpu" TIMEOUT 300)
  set_tests_properties(test_dev_cuda PROPERTIES SKIP_RETURN_CODE 77)
  # The whole GPT on CUDA (zs_gpt_ops_cuda.c) against the CPU model: one
  # step on three shapes, 10 AdamW steps, two CUDA runs bitwise equal.
  zs_add_test(test_gpt_cuda SRCS test_gpt_cuda.c LIBS zeroshard LABELS "gpu" TIMEOUT 300)
  set_tests_properties(test_gpt_cuda PROPERTIES SKIP_RETURN_CODE 77)
endif()
if(ZS_WITH_NCCL)
  add_executable(test_nccl_boot test_nccl_boot.c)
  target_include_directories(test_nccl_boot PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(test_nccl_boot PRIVATE zs_coll)
  set(ZS_NCCL_TEST_ENV
      "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1")
  add_test(NAME test_nccl_boot_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_nccl_boot> boot ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_nccl_boot_np2 PROPERTIES
    TIMEOUT 120 LABELS "gpu;mpi" ENVIRONMENT "${ZS_NCCL_TEST_ENV}")
  # NCCL against MPI on the same data, and a rank killed mid-collective
  # (tests/test_nccl.c): W GPUs needed, so on a one-GPU machine these skip;
  # the CUDA emulator runs them at W = 2 and 4 (tests/emu.cmake).
  add_executable(test_nccl test_nccl.c)
  target_include_directories(test_nccl PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(test_nccl PRIVATE zs_coll)
  target_compile_definitions(test_nccl PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  if(ZS_CUDA_EMU)
    target_compile_definitions(test_nccl PRIVATE ZS_TEST_EMU=1)
  endif()
  add_test(NAME test_nccl_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_nccl> vsmpi ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_nccl_np2 PROPERTIES
    TIMEOUT 300 LABELS "gpu;mpi" SKIP_RETURN_CODE 77 ENVIRONMENT "${ZS_NCCL_TEST_ENV}")
  add_test(NAME test_nccl_kill_np2 COMMAND $<TARGET_FILE:test_nccl> kill 2)
  set_tests_properties(test_nccl_kill_np2 PROPERTIES
    TIMEOUT 180 LABELS "gpu;mpi" SKIP_RETURN_CODE 77 ENVIRONMENT "${ZS_NCCL_TEST_ENV}")
  add_test(NAME test_nccl_np1
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:test_nccl_boot> gpu ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_nccl_np1 PROPERTIES
    TIMEOUT 180 LABELS "gpu;mpi" SKIP_RETURN_CODE 77 ENVIRONMENT "${ZS_NCCL_TEST_ENV}")
  # The engine on one GPU through zs-train --device cuda (NCCL, W = 1) vs
  # --device cpu: stages 0-3 x offload off/on with 2 real zs-servers, and
  # kill -9 + resume bitwise. Prebuilt binaries: ZS_TRAIN_BIN, ZS_MPIEXEC_BIN,
  # ZS_SERVER_BIN (tests/gpu.sh run).
  zs_add_test(test_train_cuda SRCS test_train_cuda.c LIBS zeroshard zs_testproc LABELS "gpu;mpi"
              TIMEOUT 900)
  target_compile_definitions(test_train_cuda PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                             ZS_TRAIN="$<TARGET_FILE:zs-train>"
                             ZS_LAUNCH="$<TARGET_FILE:zs-launch>")
  add_dependencies(test_train_cuda zs-train zs-server zs-launch)
  set_tests_properties(test_train_cuda PROPERTIES SKIP_RETURN_CODE 77)
endif()
