// The CUDA page target's fill and check kernels (cuda_pages_cuda.cc): the
// KV bytes of FillBlockSlot (workload/slot_words.h) written into, or compared
// with, the slots of one page on the GPU, so that the bench's engines make
// and verify pages at HBM speed instead of through 32 KiB host copies (which
// bounded the verified restore and publish figures, not the Manager).
// CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace orbitkv::bench {

// One slot of a page: `words` 8-byte words at `dst` (8-byte aligned), word i
// being SlotWord(seed, i).
struct SlotFill {
  uint64_t* dst;
  uint64_t words;
  uint64_t seed;
};

// Writes every slot of `slots` (device memory, `count` entries) on `stream`.
cudaError_t LaunchSlotFill(const SlotFill* slots, uint32_t count, uint32_t max_words,
                           cudaStream_t stream);
// Sets every word of every slot to `word` (Poison: a page no restore wrote).
cudaError_t LaunchSlotSet(const SlotFill* slots, uint32_t count, uint32_t max_words, uint64_t word,
                          cudaStream_t stream);
// Sets bad[k] (device memory, zeroed by the caller) non-zero when slot k's
// words differ from its fill.
cudaError_t LaunchSlotCheck(const SlotFill* slots, uint32_t count, uint32_t max_words,
                            uint32_t* bad, cudaStream_t stream);

}  // namespace orbitkv::bench
