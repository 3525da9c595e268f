#include "fill_pattern.h"

namespace orbitkv::gpu::testing {
namespace {

__device__ uint32_t DevicePatternWord(size_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  x ^= x >> 16;
  return x * 0x45d9f3bu + static_cast<uint32_t>(i >> 32);
}

__global__ void FillPatternKernel(uint32_t* out, size_t words, uint32_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    out[i] = DevicePatternWord(i, seed);
  }
}

}  // namespace

cudaError_t LaunchFillPattern(uint32_t* out, size_t words, uint32_t seed, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  const size_t wanted = (words + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 1024 ? (wanted > 0 ? wanted : 1) : 1024);
  FillPatternKernel<<<blocks, kThreads, 0, stream>>>(out, words, seed);
  return cudaGetLastError();
}

}  // namespace orbitkv::gpu::testing
