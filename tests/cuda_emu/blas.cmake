# tests/cuda_emu/blas.cmake - tests of the CUDA emulator's cuBLASLt
# (emu_blaslt*.c) and CUB (emu_cub*.cpp, include/cub/) parts, labelled
# `emu`. They link zs_cuda_emu (emu.cmake: the runtime plus every
# emu_*.c/emu_*.cpp here, so our sources are in it) and need NVIDIA's headers
# (cublasLt.h; no GPU, no libcudart/libcublasLt) and OpenBLAS.
#
# emu.cmake has an include guard: including it here makes this file work
# whether or not the project included it first.
# Without NVIDIA's headers there is nothing to build (checked before
# emu.cmake, which would otherwise define a library that cannot compile).
find_path(ZS_EMU_BLAS_CUBLASLT_H cublasLt.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV CUDA_HOME
          /usr/local/cuda PATH_SUFFIXES include)
if(NOT ZS_EMU_BLAS_CUBLASLT_H)
  message(STATUS "zeroshard: cublasLt.h not found: emulator cuBLASLt/CUB tests off")
  return()
endif()
enable_language(CXX)
include(${CMAKE_CURRENT_LIST_DIR}/emu.cmake)

set(ZS_EMU_BLAS_TESTS test_emu_blaslt:c test_emu_blaslt_epilogue:c test_emu_cub:cpp)
foreach(t ${ZS_EMU_BLAS_TESTS})
  string(REPLACE ":" ";" tl ${t})
  list(GET tl 0 name)
  list(GET tl 1 ext)
  if(COMMAND zs_add_test)
    zs_add_test(${name} SRCS ${ZS_EMU_DIR}/${name}.${ext} LIBS zs_cuda_emu LABELS emu TIMEOUT 120)
  else()
    add_executable(${name} ${ZS_EMU_DIR}/${name}.${ext})
    target_link_libraries(${name} PRIVATE zs_cuda_emu)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT 120 LABELS emu)
  endif()
  set_target_properties(${name} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
endforeach()
