# ZeRO++ (qwZ; topology and byte counters of the collectives): the CPU
# block quantizer (test_zeropp_quant), ...
zs_add_test(test_zeropp_quant SRCS test_zeropp_quant.c LIBS zs_kernels LABELS unit TIMEOUT 120)
# The collectives' topology (ZS_RANKS_PER_NODE and MPI's own view), the
# intra/inter-node communicators, the byte counters and the quantized
# all-gather, over MPI on the CPU: 4 ranks as 2 nodes, 4 ranks as one
# node (MPI's view), 2 ranks as 2 nodes of 1.
add_executable(test_coll_zeropp test_coll_zeropp.c)
target_include_directories(test_coll_zeropp PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(test_coll_zeropp PRIVATE zs_coll)
target_compile_definitions(test_coll_zeropp PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}")
set(ZS_ZPP_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1")
foreach(c "4;2" "4;0" "2;1")
  list(GET c 0 np)
  list(GET c 1 rpn)
  add_test(NAME test_coll_zeropp_np${np}_rpn${rpn}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_coll_zeropp> mpi ${MPIEXEC_POSTFLAGS})
  if(rpn STREQUAL "0")
    set(envx "")
  else()
    set(envx ";ZS_RANKS_PER_NODE=${rpn}")
  endif()
  set_tests_properties(test_coll_zeropp_np${np}_rpn${rpn} PROPERTIES TIMEOUT 120 LABELS "unit;mpi"
                       ENVIRONMENT "${ZS_ZPP_MPI_ENV}${envx}")
endforeach()
# The same on the emulated NCCL (tests/emu.cmake builds test_coll_zeropp in
# build/emu): the NCCL intra/inter-node communicators, and the CUDA qwZ and
# qgZ kernels (kernels/cuda/zs_cuda_quant.cu) bitwise against the CPU twin.
if(ZS_WITH_CUDA AND NOT ZS_CUDA_EMU AND ZS_EMU_TESTS AND ZS_EMU_NCCL_SRC)
  # np 2 as 2 nodes of 1 (qgZ's one-rank-per-node path), np 4 as 2 x 2
  foreach(np 2 4)
    math(EXPR rpn "${np} / 2")
    add_test(NAME emu_test_coll_zeropp_nccl_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     ${MPIEXEC_PREFLAGS} ${ZS_EMU}/test_coll_zeropp nccl ${MPIEXEC_POSTFLAGS})
    set_tests_properties(emu_test_coll_zeropp_nccl_np${np} PROPERTIES LABELS "emu;mpi" TIMEOUT 300
                         SKIP_RETURN_CODE 77
                         ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_SCHEDULE=random:5;ZS_EMU_DEVICES=${np};ZS_RANKS_PER_NODE=${rpn}")
  endforeach()
  # zs-train --device cuda on 4 emulated GPUs as 2 nodes x 2 (NCCL's
  # intra/inter communicators, the CUDA qwZ kernels in the engine): hpZ
  # bitwise, bytes, refusals; qgZ over ncclSend/ncclRecv (8 steps: emulated steps
  # are slow)
  add_test(NAME emu_test_train_zeropp COMMAND ${ZS_EMU}/test_train_zeropp)
  set_tests_properties(emu_test_train_zeropp PROPERTIES LABELS "emu;mpi" TIMEOUT 1800
                       SKIP_RETURN_CODE 77
                       ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=4;ZS_TEST_ZEROPP_DEVICE=cuda;ZS_TEST_ZEROPP_STEPS=8")
  # MiCS on the NCCL collectives (4 emulated GPUs, 2 nodes x 2): W = 4,
  # G = 2 bitwise ZeRO-3 at W = 2; G = 4 with the two-hop gather bitwise
  # ZeRO-3 at W = 4, half its gather bytes across nodes; resumed at step 1
  # with another W and G, bitwise (2 steps: ~65 s)
  add_test(NAME emu_test_train_mics_np4 COMMAND ${ZS_EMU}/test_train_mics)
  set_tests_properties(emu_test_train_mics_np4 PROPERTIES LABELS "emu;mpi" TIMEOUT 900
                       SKIP_RETURN_CODE 77
                       ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_SCHEDULE=forward;ZS_EMU_DEVICES=4;ZS_TEST_MICS_DEVICE=cuda;ZS_TEST_MICS_STEPS=2")
  # a rank killed in its node's all-gather (2 nodes x 2 ranks): every
  # survivor stops within the watchdog's deadline
  add_test(NAME emu_test_coll_zeropp_kill_np4 COMMAND ${ZS_EMU}/test_coll_zeropp kill 4)
  set_tests_properties(emu_test_coll_zeropp_kill_np4 PROPERTIES LABELS "emu;mpi" TIMEOUT 180
                       SKIP_RETURN_CODE 77
                       ENVIRONMENT "${ZS_EMU_MPI_ENV};ZS_EMU_DEVICES=4;ZS_EMU_NCCL_CHUNK=16384")
endif()
# zs-train with qwZ against plain ZeRO-3 at W = 4 as 2 nodes x 2 ranks (one
# zs-server, MPI workers on 127.0.0.1): loss within 2%, fewer bytes across
# nodes (CSV and Prometheus), one node counting nothing across, qwZ at
# stage 2 refused.
zs_add_test(test_train_zeropp SRCS test_train_zeropp.c LIBS zs_testproc TIMEOUT 900
            LABELS integration)
target_compile_definitions(test_train_zeropp PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_train_zeropp zs-train zs-tokenize zs-server)
# MiCS in zs-train (CPU workers here; emu_test_train_mics_np4 above on
# NCCL): W = 4 with G = 2 bitwise ZeRO-3 at W = 2 (the same order of
# gradient sums), G = 4 with the two-hop gather bitwise ZeRO-3 at W = 4.
zs_add_test(test_train_mics SRCS test_train_mics.c LIBS zs_testproc TIMEOUT 600
            LABELS integration)
target_compile_definitions(test_train_mics PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>")
add_dependencies(test_train_mics zs-train zs-tokenize zs-server)
