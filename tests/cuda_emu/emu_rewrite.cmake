# emu_rewrite.cmake - cmake -DIN=<file.cu> -DOUT=<file.cpp> -P emu_rewrite.cmake
#
# Makes the C++ translation unit that g++ compiles for a .cu file in the
# CUDA emulator (tests/cuda_emu/, see emu.cmake's zs_emu_cu_sources). Two
# rewrites that a force-included header cannot do, everything else is left
# to emu_shim.h:
#  - `extern __shared__ T name[];` (dynamic shared memory, CUDA C++
#    Programming Guide, Variable Memory Space Specifiers, __shared__) becomes
#    a pointer to the launch's per-block buffer;
#  - after each `__shared__ T name...;` a note that poisons the variable
#    when the first thread of each block reaches it (shared memory is not
#    initialised on a GPU).
# A `#line` keeps __FILE__ and diagnostics on the original file. Does not
# rewrite headers the .cu includes, nor declarations listing several names
# (only the last one gets the note).
file(READ "${IN}" src)
set(nl "\n")
string(REGEX REPLACE
  "extern[ \t]+__shared__[ \t]+([^;${nl}]*[^A-Za-z0-9_;${nl}])([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\[[ \t]*\\][ \t]*;"
  "\\1*const \\2 = (\\1*)zs_emu_dyn_shared();" src "${src}")
string(REGEX REPLACE
  "__shared__([^;${nl}]*[^A-Za-z0-9_;${nl}])([A-Za-z_][A-Za-z0-9_]*)([ \t]*(\\[[^;${nl}]*)?;)"
  "__shared__\\1\\2\\3 ZS_EMU_SHARED_NOTE(\\2);" src "${src}")
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
