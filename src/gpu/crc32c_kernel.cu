#include "gpu/crc32c_kernel.h"

#include <algorithm>

#include "store/crc32c_math.h"

namespace orbitkv::gpu {
namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ uint64_t Min(uint64_t a, uint64_t b) { return a < b ? a : b; }

struct CrcParams {
  uint64_t data[kCrcOpsPerLaunch];
  uint64_t bytes[kCrcOpsPerLaunch];
  uint32_t* out;
  uint32_t count;
};
static_assert(sizeof(CrcParams) <= 4000, "kernel parameters must stay under 4 KiB");

__global__ void __launch_bounds__(kThreads) Crc32cKernel(const __grid_constant__ CrcParams p) {
  __shared__ uint32_t table[4][256];
  __shared__ uint32_t partial[kThreads];
  const unsigned tid = threadIdx.x;
  for (unsigned i = tid; i < 256; i += blockDim.x) {
    table[0][i] = crc32c::ByteStep(0, static_cast<uint8_t>(i));
  }
  __syncthreads();
  for (unsigned i = tid; i < 256; i += blockDim.x) {
    uint32_t c = table[0][i];
    for (int t = 1; t < 4; ++t) {
      c = (c >> 8) ^ table[0][c & 0xff];
      table[t][i] = c;
    }
  }
  __syncthreads();

  const unsigned op = blockIdx.x;
  const uint64_t n = p.bytes[op];
  const auto* data = reinterpret_cast<const uint8_t*>(p.data[op]);
  // Chunks of a multiple of 16 bytes; thread 0 carries the ~0 initial value.
  const uint64_t chunk = ((n + kThreads - 1) / kThreads + 15) & ~uint64_t{15};
  const uint64_t begin = Min(n, static_cast<uint64_t>(tid) * chunk);
  const uint64_t end = Min(n, begin + chunk);
  uint32_t reg = tid == 0 ? 0xFFFFFFFFu : 0u;
  const uint8_t* q = data + begin;
  uint64_t len = end - begin;
  while (len > 0 && (reinterpret_cast<uintptr_t>(q) & 3) != 0) {
    reg = table[0][(reg ^ *q++) & 0xff] ^ (reg >> 8);
    --len;
  }
  for (; len >= 4; len -= 4, q += 4) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(q) ^ reg;
    reg = table[3][w & 0xff] ^ table[2][(w >> 8) & 0xff] ^ table[1][(w >> 16) & 0xff] ^
          table[0][w >> 24];
  }
  for (; len > 0; --len) reg = table[0][(reg ^ *q++) & 0xff] ^ (reg >> 8);
  partial[tid] = reg;
  __syncthreads();
  if (tid != 0) return;
  // reg(A || B) = shift_|B|(reg(A)) ^ reg0(B), chunk by chunk.
  const uint32_t shift_chunk = crc32c::ShiftOperator(chunk);
  uint32_t r = partial[0];
  for (unsigned t = 1; t < kThreads; ++t) {
    const uint64_t b = Min(n, static_cast<uint64_t>(t) * chunk);
    const uint64_t e = Min(n, b + chunk);
    if (e == b) break;
    const uint32_t shift = e - b == chunk ? shift_chunk : crc32c::ShiftOperator(e - b);
    r = crc32c::MultModP(shift, r) ^ partial[t];
  }
  p.out[op] = ~r;
}

}  // namespace

cudaError_t LaunchCrc32c(const CrcDesc* ops, size_t count, uint32_t* out, cudaStream_t stream) {
  for (size_t first = 0; first < count; first += kCrcOpsPerLaunch) {
    CrcParams p{};
    p.count = static_cast<uint32_t>(std::min(kCrcOpsPerLaunch, count - first));
    p.out = out + first;
    for (uint32_t i = 0; i < p.count; ++i) {
      p.data[i] = ops[first + i].data;
      p.bytes[i] = ops[first + i].bytes;
    }
    Crc32cKernel<<<p.count, kThreads, 0, stream>>>(p);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace orbitkv::gpu
