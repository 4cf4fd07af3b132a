# The GPU tests on the CUDA emulator (label "emu"), in every run that has
# nvcc's headers (tests/cuda_emu/README.md). The main build configures the
# same sources twice more as external projects: build/emu (ZS_CUDA_EMU=ON:
# the .cu files as host C++, linked with the emulator instead of CUDA) and
# build/emu-asan (the same with ASan + UBSan, device memory on the heap).
# Only the binaries the tests run are built there. The emulated tests are
# the real GPU tests, unchanged: test_dev_cuda, test_cuda_ops,
# test_gpt_cuda, test_train_cuda (and test_nccl_boot, test_nccl where the
# emulator has NCCL). Each runs under more than one thread schedule (ZS_EMU_SCHEDULE),
# so an ordering bug in a kernel shows as a wrong result.
# ZS_EMU_TESTS=OFF leaves all of it out (a quicker build for other work).
option(ZS_EMU_TESTS "build the CUDA code for the emulator too and run the GPU tests on it" ON)
if(NOT ZS_WITH_CUDA OR ZS_CUDA_EMU OR NOT ZS_EMU_TESTS)
  return()
endif()
include(ExternalProject)

set(ZS_EMU_TARGETS test_dev_cuda test_cuda_ops test_gpt_cuda test_train_cuda zs-train zs-server zs-launch
    test_train_zeropp test_train_mics test_gpt_flash test_cuda_attn)
set(ZS_EMU_ASAN_TARGETS test_dev_cuda test_cuda_ops test_emu_runtime test_emu_kernel
    test_emu_wmma test_cuda_attn)
file(GLOB ZS_EMU_NCCL_SRC ${PROJECT_SOURCE_DIR}/tests/cuda_emu/emu_nccl*.c)
if(ZS_EMU_NCCL_SRC)
  list(APPEND ZS_EMU_TARGETS test_nccl_boot test_nccl test_coll_zeropp)
endif()
foreach(v emu emu-asan)
  if(v STREQUAL "emu")
    set(args -DZS_SANITIZE=OFF)
    set(targets ${ZS_EMU_TARGETS})
  else()
    set(args -DZS_SANITIZE=ON)
    set(targets ${ZS_EMU_ASAN_TARGETS})
  endif()
  # $(MAKE): the inner build shares the outer make's job slots (-j)
  ExternalProject_Add(zs_build_${v}
    SOURCE_DIR ${PROJECT_SOURCE_DIR}
    BINARY_DIR ${PROJECT_BINARY_DIR}/${v}
    CMAKE_ARGS -DZS_CUDA_EMU=ON -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE} ${args}
    BUILD_COMMAND $(MAKE) ${targets}
    INSTALL_COMMAND ""
    BUILD_ALWAYS ON
    USES_TERMINAL_BUILD OFF)
endforeach()

set(ZS_EMU ${PROJECT_BINARY_DIR}/emu/tests)
set(ZS_EMU_ASAN ${PROJECT_BINARY_DIR}/emu-asan/tests)
# ASan: Open MPI's allocations are reported as leaks; the quarantine looks
# like memory growth (README, Sanitizers); the tests ask for absurd sizes
# on purpose to see them refused (allocator_may_return_null)
set(ZS_EMU_ASAN_ENV "ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=0:allocator_may_return_null=1;UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")

# zs_emu_test(NAME BINARY SCHEDULE TIMEOUT [ENV...]): one emulated run.
function(zs_emu_test name bin schedule timeout)
  add_test(NAME ${name} COMMAND ${bin} ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "emu" TIMEOUT ${timeout} SKIP_RETURN_CODE 77
                       ENVIRONMENT "ZS_EMU_SCHEDULE=${schedule};ZS_EMU_DEVICES=1")
endfunction()

# (The emulator's own tests, test_emu_*, run in this build: tests/cuda_emu/*.cmake.)
# The GPU tests, forward and reverse thread order; random (seeded) for the kernels.
zs_emu_test(emu_test_cuda_ops ${ZS_EMU}/test_cuda_ops forward 600)
zs_emu_test(emu_test_cuda_ops_reverse ${ZS_EMU}/test_cuda_ops reverse 600)
zs_emu_test(emu_test_cuda_ops_random ${ZS_EMU}/test_cuda_ops random:7 600)
zs_emu_test(emu_test_dev_cuda ${ZS_EMU}/test_dev_cuda forward 300)
zs_emu_test(emu_test_dev_cuda_random ${ZS_EMU}/test_dev_cuda random:11 300)
zs_emu_test(emu_test_gpt_cuda ${ZS_EMU}/test_gpt_cuda reverse 900)
# flash attention in the model, the CUDA part on the emulated GPU (hs 16
# and 64, bf16 and fp16), under the three schedules
zs_emu_test(emu_test_gpt_flash_attn_random ${ZS_EMU}/test_gpt_flash random:5 600)
zs_emu_test(emu_test_gpt_flash_attn_forward ${ZS_EMU}/test_gpt_flash forward 600)
zs_emu_test(emu_test_gpt_flash_attn_reverse ${ZS_EMU}/test_gpt_flash reverse 600)
# the fused attention at kernel level (tests/test_cuda_attn.c): the small
# cases (T 1, 7, 64, 130; hs 64, 128; bf16, fp16) under each schedule, the
# masked-block checks under two, and the four T = 1024 cases (hs x dtype)
# spread over the three; ASan the small cases and the masked blocks
zs_emu_test(emu_test_cuda_attn_forward ${ZS_EMU}/test_cuda_attn forward 600 small skip
            long=128/bf16)
zs_emu_test(emu_test_cuda_attn_reverse ${ZS_EMU}/test_cuda_attn reverse 600 small
            long=64/bf16,64/fp16)
zs_emu_test(emu_test_cuda_attn_random ${ZS_EMU}/test_cuda_attn random:7 600 small skip
            long=128/fp16)
zs_emu_test(emu_test_cuda_attn_eager ${ZS_EMU}/test_cuda_attn eager 600 small skip long=128/bf16)
zs_emu_test(emu_test_train_cuda ${ZS_EMU}/test_train_cuda forward 900)
# kill and resume over 30 steps, not 100: an emulated step is slow
# stages 0 and 3 on one GPU (stages 1 and 2 partition nothing with one rank;
# their code runs on 2 and 4 emulated GPUs below)
set_tests_properties(emu_test_train_cuda PROPERTIES LABELS "emu;mpi" ENVIRONMENT
                     "ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=1;ZS_TEST_TRAIN_CUDA_KR_STEPS=30;ZS_TEST_TRAIN_CUDA_STAGES=03")
# The shared-memory transport on an emulated GPU (test_train_cuda part 5):
# the staging segment registered with the device (cudaHostRegister), shm
# and tcp bitwise equal
zs_emu_test(emu_test_train_cuda_shm ${ZS_EMU}/test_train_cuda forward 900)
set_tests_properties(emu_test_train_cuda_shm PROPERTIES LABELS "emu;mpi" ENVIRONMENT
                     "ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=1;ZS_TEST_TRAIN_CUDA_PART=shm")
# The fused attention in zs-train (test_train_cuda part 6): --attention
# flash on 2 emulated GPUs against the CPU engine at W = 2, bf16, stages 0
# and 3 (the attention is inside the model: no stage changes what it
# computes; stage 3 gathers its weights; ~80 s)
zs_emu_test(emu_test_train_cuda_flash_attn ${ZS_EMU}/test_train_cuda forward 900)
set_tests_properties(emu_test_train_cuda_flash_attn PROPERTIES LABELS "emu;mpi" ENVIRONMENT
                     "ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=2;ZS_TEST_TRAIN_CUDA_NP=2;ZS_TEST_TRAIN_CUDA_PART=flash;ZS_TEST_TRAIN_CUDA_STAGES=03")
# The delayed parameter update on 2 emulated GPUs (test_train_cuda part 7):
# stage 2, bf16, offload == in process bitwise, against the CPU engine
zs_emu_test(emu_test_train_cuda_dpu ${ZS_EMU}/test_train_cuda forward 900)
set_tests_properties(emu_test_train_cuda_dpu PROPERTIES LABELS "emu;mpi" ENVIRONMENT
                     "ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=2;ZS_TEST_TRAIN_CUDA_NP=2;ZS_TEST_TRAIN_CUDA_PART=dpu")
# Several GPUs: zs-train --device cuda with W ranks on W emulated GPUs
# (NCCL emulated across the processes) against the CPU engine at the same
# W, stages 0 and 2 (W = 2) or 1 and 3 (W = 4), so each stage runs on
# several emulated GPUs in every run within the suite's time (W = 1 runs
# 0 and 3), x offload off/on, bf16 (test_train_cuda part 3; at W = 1
# and 2 only: it adds nothing at W = 4 but ~35 s of the suite), then one
# rank SIGKILLed and zs-launch resuming on W-1 GPUs (part 4)
foreach(w 2 4)
  if(w EQUAL 4)
    set(stages 13)
    set(bf16 0)
  else()
    set(stages 02)
    set(bf16 1)
  endif()
  zs_emu_test(emu_test_train_cuda_w${w} ${ZS_EMU}/test_train_cuda forward 900)
  set_tests_properties(emu_test_train_cuda_w${w} PROPERTIES LABELS "emu;mpi" ENVIRONMENT
                       "ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=${w};ZS_TEST_TRAIN_CUDA_NP=${w};ZS_TEST_TRAIN_CUDA_STAGES=${stages};ZS_TEST_TRAIN_CUDA_BF16=${bf16}")
endforeach()
# ASan + UBSan: the kernels' device memory is heap memory there
foreach(t tests/test_cuda_ops tests/test_dev_cuda test_emu_runtime test_emu_kernel test_emu_wmma)
  get_filename_component(n ${t} NAME)
  add_test(NAME emu_asan_${n} COMMAND ${PROJECT_BINARY_DIR}/emu-asan/${t})
  set_tests_properties(emu_asan_${n} PROPERTIES LABELS "emu;asan" TIMEOUT 900 SKIP_RETURN_CODE 77
                       ENVIRONMENT "ZS_EMU_SCHEDULE=random:3;ZS_EMU_DEVICES=1;${ZS_EMU_ASAN_ENV}")
endforeach()

add_test(NAME emu_asan_test_cuda_attn COMMAND ${ZS_EMU_ASAN}/test_cuda_attn small skip)
set_tests_properties(emu_asan_test_cuda_attn PROPERTIES LABELS "emu;asan" TIMEOUT 900
                     SKIP_RETURN_CODE 77
                     ENVIRONMENT "ZS_EMU_SCHEDULE=random:3;ZS_EMU_DEVICES=1;${ZS_EMU_ASAN_ENV}")

# NCCL on emulated GPUs (the emulated NCCL: processes meet in shared
# memory): one rank; two ranks on one emulated GPU (refused, as on a real
# one-GPU machine); two and four ranks on GPUs of their own (in-place
# layouts, a group of 100 all-gathers, the watchdog on a hung collective).
if(ZS_EMU_NCCL_SRC)
  set(ZS_EMU_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1;ZS_EMU_NCCL_TIMEOUT=120")
  foreach(c "1;1;gpu" "2;1;boot" "2;2;boot" "4;4;boot")
    list(GET c 0 np)
    list(GET c 1 ndev)
    list(GET c 2 mode)
    set(n emu_test_nccl_np${np}_dev${ndev})
    add_test(NAME ${n} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                               ${MPIEXEC_PREFLAGS} ${ZS_EMU}/test_nccl_boot ${mode} ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${n} PROPERTIES LABELS "emu;mpi" TIMEOUT 300 SKIP_RETURN_CODE 77
                         ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_SCHEDULE=random:5;ZS_EMU_DEVICES=${ndev}")
  endforeach()
  # NCCL against MPI on the same data (bitwise where the order of additions
  # cannot matter, and the emulator's rank-order fold), a group of 120; a
  # rank SIGKILLed mid-collective (small chunks: the all-reduce is still
  # running when it dies), the survivors stopped by our watchdog.
  foreach(np 2 4)
    add_test(NAME emu_test_nccl_vsmpi_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     ${MPIEXEC_PREFLAGS} ${ZS_EMU}/test_nccl vsmpi ${MPIEXEC_POSTFLAGS})
    set_tests_properties(emu_test_nccl_vsmpi_np${np} PROPERTIES LABELS "emu;mpi" TIMEOUT 300
                         SKIP_RETURN_CODE 77
                         ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_SCHEDULE=random:9;ZS_EMU_DEVICES=${np}")
    add_test(NAME emu_test_nccl_kill_np${np} COMMAND ${ZS_EMU}/test_nccl kill ${np})
    set_tests_properties(emu_test_nccl_kill_np${np} PROPERTIES LABELS "emu;mpi" TIMEOUT 180
                         SKIP_RETURN_CODE 77
                         ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_DEVICES=${np};ZS_EMU_NCCL_CHUNK=16384")
  endforeach()
endif()
