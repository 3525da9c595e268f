#include "bench/cuda_fill.h"

#include <algorithm>

#include "workload/slot_words.h"

namespace orbitkv::bench {
namespace {

constexpr uint32_t kThreads = 256;
constexpr uint32_t kWordsPerBlock = kThreads * 16;

__global__ void SlotFillKernel(const SlotFill* slots) {
  const SlotFill s = slots[blockIdx.y];
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < s.words;
       i += uint64_t{gridDim.x} * kThreads) {
    s.dst[i] = demo::SlotWord(s.seed, i);
  }
}

__global__ void SlotSetKernel(const SlotFill* slots, uint64_t word) {
  const SlotFill s = slots[blockIdx.y];
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < s.words;
       i += uint64_t{gridDim.x} * kThreads) {
    s.dst[i] = word;
  }
}

__global__ void SlotCheckKernel(const SlotFill* slots, uint32_t* bad) {
  const SlotFill s = slots[blockIdx.y];
  uint64_t diff = 0;
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < s.words;
       i += uint64_t{gridDim.x} * kThreads) {
    diff |= s.dst[i] ^ demo::SlotWord(s.seed, i);
  }
  if (__syncthreads_or(diff != 0) && threadIdx.x == 0) atomicOr(&bad[blockIdx.y], 1u);
}

// A launch's grid.y is at most 65535 slots: `launch(first, n)` for each run
// of that many, first error returned.
constexpr uint32_t kMaxSlotsPerLaunch = 65535;

template <typename Launch>
cudaError_t ForSlotRuns(uint32_t count, Launch launch) {
  for (uint32_t first = 0; first < count; first += kMaxSlotsPerLaunch) {
    launch(first, std::min(kMaxSlotsPerLaunch, count - first));
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

dim3 Grid(uint32_t count, uint32_t max_words) {
  return dim3((max_words + kWordsPerBlock - 1) / kWordsPerBlock, count);
}

}  // namespace

cudaError_t LaunchSlotFill(const SlotFill* slots, uint32_t count, uint32_t max_words,
                           cudaStream_t stream) {
  if (count == 0 || max_words == 0) return cudaSuccess;
  return ForSlotRuns(count, [&](uint32_t first, uint32_t n) {
    SlotFillKernel<<<Grid(n, max_words), kThreads, 0, stream>>>(slots + first);
  });
}

cudaError_t LaunchSlotSet(const SlotFill* slots, uint32_t count, uint32_t max_words, uint64_t word,
                          cudaStream_t stream) {
  if (count == 0 || max_words == 0) return cudaSuccess;
  return ForSlotRuns(count, [&](uint32_t first, uint32_t n) {
    SlotSetKernel<<<Grid(n, max_words), kThreads, 0, stream>>>(slots + first, word);
  });
}

cudaError_t LaunchSlotCheck(const SlotFill* slots, uint32_t count, uint32_t max_words,
                            uint32_t* bad, cudaStream_t stream) {
  if (count == 0 || max_words == 0) return cudaSuccess;
  return ForSlotRuns(count, [&](uint32_t first, uint32_t n) {
    SlotCheckKernel<<<Grid(n, max_words), kThreads, 0, stream>>>(slots + first, bad + first);
  });
}

}  // namespace orbitkv::bench
