# The emulated NCCL's own tests (tests/cuda_emu/emu_nccl*.c): test_emu_nccl
# under mpiexec at np 2 and 4 (MPI only starts the ranks and broadcasts the
# unique id; the ranks rendezvous in POSIX shared memory), and the kill
# tests without MPI (the test forks its ranks: a rank killed under mpiexec
# would make mpiexec kill the others). Labelled `emu`.
#
# The emulator's sources (emu_nccl*.c among them) are built into
# zs_cuda_emu by emu-core's emu.cmake (include_guard: including it again is
# harmless). nccl.h comes from the CUDA include directory it adds.
# zs_cuda_emu has C++ sources (the kernel part); the project enables only C.
get_property(_emu_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
if(NOT "CXX" IN_LIST _emu_langs)
  enable_language(CXX)
endif()
include(${CMAKE_CURRENT_LIST_DIR}/emu.cmake)
find_path(ZS_EMU_NCCL_INCLUDE nccl.h HINTS ${ZS_EMU_CUDA_INCLUDE} /usr/local/cuda/include
          ENV NCCL_HOME PATH_SUFFIXES include)
if(NOT ZS_EMU_NCCL_INCLUDE)
  message(STATUS "cuda_emu nccl: nccl.h not found: emulated NCCL tests off")
  return()
endif()
set(_emu_dir ${CMAKE_CURRENT_LIST_DIR})
set(_emu_lib zs_cuda_emu)

add_executable(test_emu_nccl ${_emu_dir}/test_emu_nccl.c ${_emu_dir}/test_emu_nccl_faults.c)
target_include_directories(test_emu_nccl PRIVATE ${_emu_dir} ${ZS_EMU_NCCL_INCLUDE})
target_link_libraries(test_emu_nccl PRIVATE ${_emu_lib} MPI::MPI_C)

# detect_leaks=0: in the ASan build (ZS_SANITIZE) Open MPI's own allocations
# (ompi_op_base_op_select, opal_argv, its dlclosed components) are reported
# at exit; the emulator's own were checked clean (its tombstones stay
# reachable). Harmless in other builds.
set(_emu_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1;ZS_EMU_NCCL_TIMEOUT=60;ASAN_OPTIONS=detect_leaks=0")
foreach(np 2 4)
  add_test(NAME test_emu_nccl_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_emu_nccl> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_emu_nccl_np${np} PROPERTIES
    TIMEOUT 180 LABELS "emu;mpi" ENVIRONMENT "${_emu_mpi_env}")
endforeach()
# Point-to-point (ncclSend/ncclRecv, emu_nccl_p2p.c) and ncclCommSplit, at
# np 2 and 4 like test_emu_nccl.
add_executable(test_emu_nccl_p2p ${_emu_dir}/test_emu_nccl_p2p.c)
target_include_directories(test_emu_nccl_p2p PRIVATE ${_emu_dir} ${ZS_EMU_NCCL_INCLUDE})
target_link_libraries(test_emu_nccl_p2p PRIVATE ${_emu_lib} MPI::MPI_C)
foreach(np 2 4)
  add_test(NAME test_emu_nccl_p2p_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_emu_nccl_p2p> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_emu_nccl_p2p_np${np} PROPERTIES
    TIMEOUT 180 LABELS "emu;mpi" ENVIRONMENT "${_emu_mpi_env}")
  # The last rank SIGKILLed in the middle of an all-to-all (forked, no MPI).
  add_test(NAME test_emu_nccl_p2p_kill_${np} COMMAND test_emu_nccl_p2p --kill ${np})
  set_tests_properties(test_emu_nccl_p2p_kill_${np} PROPERTIES TIMEOUT 120 LABELS "emu"
                       ENVIRONMENT "ZS_EMU_NCCL_TIMEOUT=60")
endforeach()
# A rank killed (SIGKILL) in the middle of / before a collective: the others
# report ncclRemoteError within 2.5 s; the test's own alarm() is the hard
# timeout, ctest's TIMEOUT the backstop.
foreach(mode kill kill-before)
  foreach(n 2 4)
    add_test(NAME test_emu_nccl_${mode}_${n} COMMAND test_emu_nccl --${mode} ${n})
    set_tests_properties(test_emu_nccl_${mode}_${n} PROPERTIES TIMEOUT 120 LABELS "emu"
                         ENVIRONMENT "ZS_EMU_NCCL_TIMEOUT=60")
  endforeach()
endforeach()
# A buffer freed before its collective runs: a sticky illegal address.
add_test(NAME test_emu_nccl_freed COMMAND test_emu_nccl --freed)
set_tests_properties(test_emu_nccl_freed PROPERTIES TIMEOUT 60 LABELS "emu")
