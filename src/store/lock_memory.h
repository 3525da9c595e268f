// LockMemory: mlock(2) of a large mapping (the DRAM pool) on several threads.
// Locking faults in and zeroes every page; on one thread that ran at about
// 1 GB/s on a busy host (a 4 GB pool took 4-80 s before the Manager was
// ready). The kernel populates disjoint parts of one mapping concurrently,
// so the range is split into up to `max_threads` parts of at least
// `min_part_bytes` (4 KiB aligned), each locked on its own thread.
// On failure every part is unlocked again and the first error is returned
// (errno of the failing mlock); the memory stays mapped and usable.
#pragma once

#include <cstdint>

#include "orbitkv/status.h"

namespace orbitkv {

struct LockMemoryOptions {
  uint32_t max_threads = 8;
  uint64_t min_part_bytes = 256ull << 20;
};

// REQUIRES: [base, +bytes) is one mapping of this process, base 4 KiB aligned.
// Returns the threads used.
Result<uint32_t> LockMemory(void* base, uint64_t bytes, const LockMemoryOptions& options = {});

}  // namespace orbitkv
