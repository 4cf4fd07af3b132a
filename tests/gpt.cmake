# The reference GPT model on CPU: finite-difference checks of every kernel's
# backward (test_gpt_ops), and of the whole model, PyTorch comparison
# (tests/ref/gpt_torch.py, torch required) and a short engine run (test_gpt).
zs_add_test(test_gpt_ops SRCS test_gpt_ops.c LIBS zeroshard LABELS unit TIMEOUT 120)
zs_add_test(test_gpt SRCS test_gpt.c LIBS zeroshard LABELS unit TIMEOUT 300)
