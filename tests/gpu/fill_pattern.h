// Test kernels for the GPU tier's device tests: fill device memory with a
// position-dependent pattern, and the host-side value to compare against.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace orbitkv::gpu::testing {

// The value FillPattern stores at word `i` for `seed`.
inline uint32_t PatternWord(size_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  x ^= x >> 16;
  return x * 0x45d9f3bu + static_cast<uint32_t>(i >> 32);
}

// Enqueues a kernel on `stream` writing PatternWord(i, seed) to out[i] for
// i < words. Returns the launch status (cudaGetLastError after the launch).
cudaError_t LaunchFillPattern(uint32_t* out, size_t words, uint32_t seed, cudaStream_t stream);

}  // namespace orbitkv::gpu::testing
