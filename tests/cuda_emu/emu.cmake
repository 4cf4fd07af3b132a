# emu.cmake - the CUDA emulator (tests/cuda_emu/): a CMake fragment to
# include from any CMakeLists once CUDAToolkit has been found (only its
# headers are used: nothing links libcudart or needs a GPU, and the CUDA
# language need not be enabled).
#
# Defines:
#  - zs_cuda_emu: a STATIC library of tests/cuda_emu/emu_*.c and emu_*.cpp
#    (globbed, so the cuBLASLt, CUB and NCCL parts join by being there);
#  - zs_emu_cu_sources(<target> <file.cu>...): compiles .cu files into
#    <target> with g++ as C++17 through emu_shim.h, and links zs_cuda_emu;
#  - the emu tests (ctest label "emu"), through zs_add_test when the
#    project defines it.
# Does not: choose the sanitizer (set CMAKE_C_FLAGS / CMAKE_CXX_FLAGS with
# -fsanitize=address,undefined for the ASan build; emu_core.h switches the
# device-memory protection off by itself there).
include_guard(GLOBAL)

set(ZS_EMU_DIR ${CMAKE_CURRENT_LIST_DIR})
find_package(Threads REQUIRED)
if(NOT CUDAToolkit_INCLUDE_DIRS)
  find_package(CUDAToolkit QUIET)
endif()
set(ZS_EMU_CUDA_INCLUDE ${CUDAToolkit_INCLUDE_DIRS})
if(NOT ZS_EMU_CUDA_INCLUDE)
  set(ZS_EMU_CUDA_INCLUDE /usr/local/cuda/include)
endif()

file(GLOB ZS_EMU_SOURCES CONFIGURE_DEPENDS ${ZS_EMU_DIR}/emu_*.c ${ZS_EMU_DIR}/emu_*.cpp)
add_library(zs_cuda_emu STATIC ${ZS_EMU_SOURCES})
set_target_properties(zs_cuda_emu PROPERTIES C_STANDARD 11 CXX_STANDARD 17
  CXX_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
# include/ first: the CUB part may put a cub/ override there.
target_include_directories(zs_cuda_emu PUBLIC ${ZS_EMU_DIR}/include ${ZS_EMU_DIR}
  ${ZS_EMU_CUDA_INCLUDE})
# OpenBLAS (or a cblas) behind the emulated cuBLASLt's fp32 GEMMs.
find_library(ZS_EMU_BLAS NAMES openblas cblas)
if(ZS_EMU_BLAS)
  target_link_libraries(zs_cuda_emu PUBLIC ${ZS_EMU_BLAS})
endif()
target_link_libraries(zs_cuda_emu PUBLIC Threads::Threads m ${CMAKE_DL_LIBS})

# zs_emu_cu_sources(<target> <file.cu>...)
# Each .cu becomes a generated <build>/zs_emu_cu/<target>/<name>.cpp (see
# emu_rewrite.cmake: dynamic shared memory and shared-memory poisoning; a
# #line keeps the original file name), compiled as C++17 with
#   -include <tests/cuda_emu>/emu_shim.h -ffp-contract=off -iquote <dir of .cu>
# so NVIDIA's headers come first and quoted includes resolve as beside the
# .cu. Works whether or not the CUDA language is enabled.
function(zs_emu_cu_sources target)
  foreach(src ${ARGN})
    get_filename_component(abs "${src}" ABSOLUTE)
    get_filename_component(dir "${abs}" DIRECTORY)
    get_filename_component(name "${abs}" NAME)
    set(out "${CMAKE_CURRENT_BINARY_DIR}/zs_emu_cu/${target}/${name}.cpp")
    add_custom_command(OUTPUT "${out}"
      COMMAND ${CMAKE_COMMAND} -DIN=${abs} -DOUT=${out} -P ${ZS_EMU_DIR}/emu_rewrite.cmake
      DEPENDS "${abs}" "${ZS_EMU_DIR}/emu_rewrite.cmake"
      COMMENT "cuda-emu: ${name} -> C++" VERBATIM)
    target_sources(${target} PRIVATE "${out}")
    set_source_files_properties("${out}" PROPERTIES LANGUAGE CXX GENERATED TRUE
      OBJECT_DEPENDS "${ZS_EMU_DIR}/emu_shim.h"
      COMPILE_OPTIONS "-include;${ZS_EMU_DIR}/emu_shim.h;-ffp-contract=off;-iquote;${dir}")
  endforeach()
  set_target_properties(${target} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  target_link_libraries(${target} PRIVATE zs_cuda_emu)
endfunction()

# ---- Tests (label emu) ----
if(COMMAND zs_add_test)
  zs_add_test(test_emu_runtime SRCS ${ZS_EMU_DIR}/test_emu_runtime.c LIBS zs_cuda_emu
    TIMEOUT 300 LABELS emu)
  zs_add_test(test_emu_kernel LIBS zs_cuda_emu TIMEOUT 300 LABELS emu)
  zs_emu_cu_sources(test_emu_kernel ${ZS_EMU_DIR}/test_emu_kernel.cu)
  zs_add_test(test_emu_wmma LIBS zs_cuda_emu TIMEOUT 300 LABELS emu)
  zs_emu_cu_sources(test_emu_wmma ${ZS_EMU_DIR}/test_emu_wmma.cu)
  zs_add_test(test_emu_eager LIBS zs_cuda_emu TIMEOUT 300 LABELS emu)
  zs_emu_cu_sources(test_emu_eager ${ZS_EMU_DIR}/test_emu_eager.cu)
else()
  add_executable(test_emu_runtime ${ZS_EMU_DIR}/test_emu_runtime.c)
  target_link_libraries(test_emu_runtime PRIVATE zs_cuda_emu)
  add_executable(test_emu_kernel)
  zs_emu_cu_sources(test_emu_kernel ${ZS_EMU_DIR}/test_emu_kernel.cu)
  add_executable(test_emu_wmma)
  zs_emu_cu_sources(test_emu_wmma ${ZS_EMU_DIR}/test_emu_wmma.cu)
  add_executable(test_emu_eager)
  zs_emu_cu_sources(test_emu_eager ${ZS_EMU_DIR}/test_emu_eager.cu)
  if(COMMAND add_test)
    add_test(NAME test_emu_runtime COMMAND test_emu_runtime)
    add_test(NAME test_emu_kernel COMMAND test_emu_kernel)
    add_test(NAME test_emu_wmma COMMAND test_emu_wmma)
    add_test(NAME test_emu_eager COMMAND test_emu_eager)
    set_tests_properties(test_emu_runtime test_emu_kernel test_emu_wmma test_emu_eager PROPERTIES
                         LABELS emu TIMEOUT 300)
  endif()
endif()
