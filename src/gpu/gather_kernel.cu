#include "gpu/gather_kernel.h"

#include <algorithm>

#include "gpu/crc32c_block.cuh"
#include "gpu/crc32c_grid.h"

namespace orbitkv::gpu {
namespace {

static_assert(kCrcThreads % 32 == 0 && kCrcThreads >= 256 / 2, "two table entries per thread");

__device__ const CrcShiftTables kShifts = MakeCrcShiftTables();

template <size_t N>
struct GatherLaunch {
  GatherObjectDesc objects[N];
};
static_assert(sizeof(GatherLaunch<kGatherObjectsPerSmallLaunch>) <= 4000,
              "a small launch's parameters stay under 4 KiB");
static_assert(sizeof(GatherLaunch<kGatherObjectsPerLaunch>) <= 32000,
              "kernel parameters must stay under 32 KiB");

// Grid: one block per (object, slot), object-major; crcs[o * slots + j].
template <size_t N>
__global__ void __launch_bounds__(kCrcThreads)
    GatherObjectsKernel(const __grid_constant__ GatherLaunch<N> l,
                        const GatherSlotDesc* __restrict__ table, uint32_t slots,
                        uint32_t* __restrict__ crcs) {
  __shared__ CrcSliceTables tables;
  for (uint32_t b = threadIdx.x; b < 256; b += kCrcThreads) FillCrcSliceEntry(&tables, b);
  const uint32_t o = blockIdx.x / slots;
  const uint32_t j = blockIdx.x - o * slots;
  const GatherSlotDesc sl = table[j];
  const GatherObjectDesc d = l.objects[o];
  const auto* src = reinterpret_cast<const uint8_t*>(sl.base + d.page * sl.stride);
  auto* dst = reinterpret_cast<uint8_t*>(d.object + sl.offset);
  const uint64_t n = sl.bytes;
  uint64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const uint64_t words = n / 16;
    const auto* s4 = reinterpret_cast<const uint4*>(src);
    auto* d4 = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = threadIdx.x; i < words; i += kCrcThreads) d4[i] = __ldg(s4 + i);
    done = words * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < n; i += kCrcThreads) dst[i] = src[i];
  for (uint64_t i = threadIdx.x; i < sl.zero_after; i += kCrcThreads) dst[n + i] = 0;
  __syncthreads();  // the tables are filled
  const uint32_t v = CrcBlockXor(CrcLeafOfShortRange(tables, kShifts, src, n, threadIdx.x));
  if (threadIdx.x == 0) crcs[uint64_t{o} * slots + j] = ~v;
}

template <size_t N>
cudaError_t Launch(const GatherSlotDesc* table, uint32_t slots, const GatherObjectDesc* objects,
                   size_t count, uint32_t* crcs, cudaStream_t stream) {
  GatherLaunch<N> l;
  std::copy(objects, objects + count, l.objects);
  GatherObjectsKernel<N>
      <<<static_cast<unsigned>(count * slots), kCrcThreads, 0, stream>>>(l, table, slots, crcs);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGatherObjects(const GatherSlotDesc* table, uint32_t slots,
                                const GatherObjectDesc* objects, size_t count, uint32_t* crcs,
                                cudaStream_t stream) {
  if (slots == 0) return count == 0 ? cudaSuccess : cudaErrorInvalidValue;
  for (size_t first = 0; first < count;) {
    const size_t n = std::min(count - first, kGatherObjectsPerLaunch);
    uint32_t* const out = crcs + first * slots;
    const cudaError_t e =
        n <= kGatherObjectsPerSmallLaunch
            ? Launch<kGatherObjectsPerSmallLaunch>(table, slots, objects + first, n, out, stream)
            : Launch<kGatherObjectsPerLaunch>(table, slots, objects + first, n, out, stream);
    if (e != cudaSuccess) return e;
    first += n;
  }
  return cudaSuccess;
}

}  // namespace orbitkv::gpu
