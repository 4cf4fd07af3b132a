/*
 * cub/cub.cuh - the CUDA emulator's stand-in for CUB's umbrella header:
 * only the parts the emulator provides (DeviceRadixSort). Anything else of
 * CUB used by emulated code fails to compile rather than silently binding
 * to NVIDIA's device code.
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>
