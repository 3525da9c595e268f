// Block-wide pieces shared by the CRC32C kernels (gpu/crc32c_kernel.cu,
// gpu/gather_kernel.cu). CUDA device code only; include from .cu files.
#pragma once

#include <cstdint>

#include "gpu/crc32c_grid.h"  // kCrcThreads

namespace orbitkv::gpu {

// XOR of v over a block of kCrcThreads threads; the result is valid in thread
// 0. Every thread of the block must call it (it synchronises the block).
__device__ __forceinline__ uint32_t CrcBlockXor(uint32_t v) {
  static_assert(kCrcThreads % 32 == 0, "whole warps");
  __shared__ uint32_t warp_xor[kCrcThreads / 32];
  for (int off = 16; off > 0; off /= 2) v ^= __shfl_xor_sync(0xffffffffu, v, off);
  if ((threadIdx.x & 31) == 0) warp_xor[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (uint32_t w = 1; w < kCrcThreads / 32; ++w) v ^= warp_xor[w];
  }
  return v;
}

}  // namespace orbitkv::gpu
