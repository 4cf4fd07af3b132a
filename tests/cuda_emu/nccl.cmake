# The emulated NCCL's own tests (tests/cuda_emu/emu_nccl*.c): test_emu_nccl
# under mpiexec at np 2 and 4 (MPI only starts the ranks and broadcasts the
# unique id; the ranks rendezvous in POSIX shared memory), and the kill
# tests without MPI (the test forks its ranks: a rank killed under mpiexec
# would make mpiexec kill the others). Labelled `emu`.
#
# The emulator's sources are built into zs_cuda_emu by emu-core's emu.cmake
# (it globs emu_*.c). Until that library exists, the tests build the NCCL
# sources with the stand-in runtime stub/emu_stub_nccl_rt.c.
find_path(ZS_EMU_NCCL_INCLUDE nccl.h HINTS /usr/local/cuda/include ENV NCCL_HOME
          PATH_SUFFIXES include)
find_path(ZS_EMU_CUDA_INCLUDE cuda_runtime_api.h HINTS /usr/local/cuda/include)
if(NOT ZS_EMU_NCCL_INCLUDE OR NOT ZS_EMU_CUDA_INCLUDE)
  message(STATUS "cuda_emu nccl: nccl.h / CUDA headers not found: emulated NCCL tests off")
  return()
endif()

set(_emu_dir ${CMAKE_CURRENT_LIST_DIR})
if(TARGET zs_cuda_emu)
  set(_emu_lib zs_cuda_emu)
else()
  file(GLOB _emu_nccl_srcs ${_emu_dir}/emu_nccl*.c)
  add_library(zs_emu_nccl_stub STATIC ${_emu_nccl_srcs} ${_emu_dir}/stub/emu_stub_nccl_rt.c)
  target_include_directories(zs_emu_nccl_stub PUBLIC ${_emu_dir} ${ZS_EMU_NCCL_INCLUDE}
                             ${ZS_EMU_CUDA_INCLUDE})
  target_link_libraries(zs_emu_nccl_stub PUBLIC Threads::Threads m rt)
  set(_emu_lib zs_emu_nccl_stub)
endif()

add_executable(test_emu_nccl ${_emu_dir}/test_emu_nccl.c ${_emu_dir}/test_emu_nccl_faults.c)
target_include_directories(test_emu_nccl PRIVATE ${_emu_dir} ${ZS_EMU_NCCL_INCLUDE})
target_link_libraries(test_emu_nccl PRIVATE ${_emu_lib} MPI::MPI_C)

set(_emu_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_mpi_yield_when_idle=1;ZS_EMU_NCCL_TIMEOUT=60")
foreach(np 2 4)
  add_test(NAME test_emu_nccl_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                   ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_emu_nccl> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_emu_nccl_np${np} PROPERTIES
    TIMEOUT 180 LABELS "emu;mpi" ENVIRONMENT "${_emu_mpi_env}")
endforeach()
# A rank killed (SIGKILL) in the middle of / before a collective: the others
# report ncclRemoteError within 2.5 s; the test's own alarm() is the hard
# timeout, ctest's TIMEOUT the backstop.
foreach(mode kill kill-before)
  add_test(NAME test_emu_nccl_${mode} COMMAND test_emu_nccl --${mode} 3)
  set_tests_properties(test_emu_nccl_${mode} PROPERTIES TIMEOUT 120 LABELS "emu"
                       ENVIRONMENT "ZS_EMU_NCCL_TIMEOUT=60")
endforeach()
