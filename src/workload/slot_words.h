// The words of a block slot's KV bytes (FillBlockSlot, workload.h): word i of
// a slot is SlotWord(seed, i), little-endian, with the seed from
// BlockSlotSeed(key, slot). Host and device code (orbitkv-bench fills and
// checks CUDA pages with a kernel, src/bench/cuda_fill.cu): plain C++17, no
// includes beyond <cstdint>.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORBITKV_HOST_DEVICE __host__ __device__
#else
#define ORBITKV_HOST_DEVICE
#endif

namespace orbitkv::demo {

ORBITKV_HOST_DEVICE inline uint64_t SlotMix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Word i of a slot: a counter-mode mix, fast enough to fill and check GB/s.
ORBITKV_HOST_DEVICE inline uint64_t SlotWord(uint64_t seed, uint64_t i) {
  return SlotMix(seed + i * 0xD1B54A32D192ED03ULL);
}

}  // namespace orbitkv::demo
