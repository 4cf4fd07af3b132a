# tests/cuda_emu/blas.cmake - tests of the CUDA emulator's cuBLASLt
# (emu_blaslt*.c) and CUB (emu_cub*.cpp, include/cub/) parts, labelled
# `emu`. Needs NVIDIA's headers (cublasLt.h, cuda_runtime_api.h; no GPU, no
# libcudart/libcublasLt) and OpenBLAS.
#
# With emu-core's library (zs_cuda_emu, from tests/cuda_emu/emu.cmake, which
# must be included before this file) the tests link it. Until then they link
# zs_emu_blas_stub: our sources plus stub/emu_stub_runtime.c, a synchronous
# stand-in runtime that is never part of the emulator library.

find_path(ZS_EMU_CUDA_INCLUDE cublasLt.h HINTS ENV CUDA_HOME /usr/local/cuda
          PATH_SUFFIXES include)
if(NOT ZS_EMU_CUDA_INCLUDE)
  message(STATUS "zeroshard: cublasLt.h not found: emulator cuBLASLt/CUB tests off")
  return()
endif()
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(ZS_EMU_DIR ${CMAKE_CURRENT_LIST_DIR})

if(TARGET zs_cuda_emu)
  set(ZS_EMU_BLAS_LIB zs_cuda_emu)
else()
  add_library(zs_emu_blas_stub STATIC
    ${ZS_EMU_DIR}/emu_blaslt.c ${ZS_EMU_DIR}/emu_blaslt_matmul.c ${ZS_EMU_DIR}/emu_cub_sort.cpp
    ${ZS_EMU_DIR}/stub/emu_stub_runtime.c)
  # include/ first: it overrides NVIDIA's cub/ (as emu.cmake does for the library)
  target_include_directories(zs_emu_blas_stub BEFORE PUBLIC ${ZS_EMU_DIR}/include)
  target_include_directories(zs_emu_blas_stub PUBLIC ${ZS_EMU_DIR} ${ZS_EMU_CUDA_INCLUDE})
  target_link_libraries(zs_emu_blas_stub PUBLIC PkgConfig::OPENBLAS Threads::Threads m)
  if(ZS_SANITIZE)
    target_compile_options(zs_emu_blas_stub PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer>)
  endif()
  set(ZS_EMU_BLAS_LIB zs_emu_blas_stub)
  set(ZS_EMU_BLAS_STUB ON)
endif()

set(ZS_EMU_TEST_LIBS ${ZS_EMU_BLAS_LIB})

if(COMMAND zs_add_test)
  zs_add_test(test_emu_blaslt SRCS ${ZS_EMU_DIR}/test_emu_blaslt.c LIBS ${ZS_EMU_TEST_LIBS}
              LABELS emu TIMEOUT 120)
  zs_add_test(test_emu_cub SRCS ${ZS_EMU_DIR}/test_emu_cub.cpp LIBS ${ZS_EMU_TEST_LIBS}
              LABELS emu TIMEOUT 120)
else()
  foreach(t test_emu_blaslt:c test_emu_cub:cpp)
    string(REPLACE ":" ";" tl ${t})
    list(GET tl 0 name)
    list(GET tl 1 ext)
    add_executable(${name} ${ZS_EMU_DIR}/${name}.${ext})
    target_link_libraries(${name} PRIVATE ${ZS_EMU_TEST_LIBS})
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT 120 LABELS emu)
  endforeach()
endif()
foreach(t test_emu_blaslt test_emu_cub)
  target_include_directories(${t} BEFORE PRIVATE ${ZS_EMU_DIR}/include)
  target_include_directories(${t} PRIVATE ${ZS_EMU_DIR} ${ZS_EMU_CUDA_INCLUDE}
                             ${PROJECT_SOURCE_DIR}/tests)
  if(ZS_EMU_BLAS_STUB)
    # the stand-in's test controls (stub/emu_stub.h): deferral, sticky error
    target_include_directories(${t} PRIVATE ${ZS_EMU_DIR}/stub)
    target_compile_definitions(${t} PRIVATE ZS_EMU_STUB)
  endif()
  if(ZS_SANITIZE)
    target_compile_options(${t} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer>)
  endif()
endforeach()
