# The reference GPT model: finite-difference checks of every kernel's
# backward (test_gpt_ops), and test_gpt: the model bound to the CPU device,
# finite differences through it, PyTorch comparison (tests/ref/gpt_torch.py,
# torch required) and a short engine run.
#
# test_gpt's engine part links libzeroshard. With ZS_GPT_TEST_ENGINE=OFF it
# is left out and test_gpt is built from the model's sources and the device
# library only, so the model can be tested where the engine does not build
# (e.g. a branch that changes the engine); the output says part 3 was not
# built.
option(ZS_GPT_TEST_ENGINE "test_gpt: include the engine run (links libzeroshard)" ON)
zs_add_test(test_gpt_ops SRCS test_gpt_ops.c LIBS zs_kernels LABELS unit TIMEOUT 120)
zs_add_test(test_gpt_mixed SRCS test_gpt_mixed.c LIBS zs_kernels LABELS unit TIMEOUT 60)
# zs_op_gemm's blocks follow the shape, not the thread count: checked under
# a GEMM of the test's own whose order of additions follows the shape
zs_add_test(test_gemm_split SRCS test_gemm_split.c LIBS zs_kernels LABELS unit TIMEOUT 60)
if(ZS_GPT_TEST_ENGINE)
  zs_add_test(test_gpt SRCS test_gpt.c LIBS zeroshard LABELS unit TIMEOUT 300)
  target_compile_definitions(test_gpt PRIVATE ZS_TEST_GPT_ENGINE=1)
  # activation checkpointing (issue 16): bitwise against no checkpointing,
  # model and engine (W=1, stages 0-3); activation memory within its formula
  zs_add_test(test_gpt_ckpt SRCS test_gpt_ckpt.c LIBS zeroshard LABELS unit TIMEOUT 300)
  # 16-bit activations (issue 16): activation bytes, loss/gradients within
  # stated bounds of fp32 activations, checkpointing bitwise equal to none
  zs_add_test(test_gpt_act16 SRCS test_gpt_act16.c LIBS zeroshard LABELS unit TIMEOUT 300)
  # flash attention in the model: against unfused (fp32, bf16, fp16 GEMMs),
  # activation bytes, checkpointing bitwise; CUDA part where a GPU is usable
  # (the emulator runs it: emu.cmake)
  zs_add_test(test_gpt_flash SRCS test_gpt_flash.c LIBS zeroshard LABELS unit TIMEOUT 300)
  # 16-bit parameters read in place (issue 16): bitwise against fp32 views
  zs_add_test(test_gpt_param16 SRCS test_gpt_param16.c LIBS zeroshard LABELS unit TIMEOUT 300)
  # engine layers smaller than a block or the embedding (issue 16)
  zs_add_test(test_gpt_split SRCS test_gpt_split.c LIBS zeroshard LABELS unit TIMEOUT 300)
else()
  file(GLOB ZS_GPT_MODEL_SRC CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/worker/model/*.c)
  zs_add_test(test_gpt SRCS test_gpt.c ${ZS_GPT_MODEL_SRC} LIBS zs_dev zs_kernels zs_common
              LABELS unit TIMEOUT 300)
  # headers only: zs_gpt.h declares a zs_model_t (engine), which names the
  # collectives and the configuration
  target_include_directories(test_gpt PRIVATE
    ${PROJECT_SOURCE_DIR}/worker/model ${PROJECT_SOURCE_DIR}/worker/engine
    ${PROJECT_SOURCE_DIR}/worker/coll ${PROJECT_SOURCE_DIR}/worker/config)
endif()
# the op profiler (ZS_GPT_PROFILE=1): results unchanged, every op counted
if(ZS_GPT_TEST_ENGINE)
  zs_add_test(test_gpt_prof SRCS test_gpt_prof.c LIBS zeroshard LABELS unit TIMEOUT 60)
endif()
