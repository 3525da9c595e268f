// Read coalescing: turns requested byte ranges into aligned reads. Ranges in
// the same file whose aligned extents touch or overlap merge into one read of
// at most max_bytes; different files and unrequested aligned gaps stay
// separate. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace orbitkv {

struct ReadRange {
  uint32_t file = 0;    // shard index (or any file id)
  uint64_t offset = 0;  // bytes, need not be aligned
  uint64_t length = 0;  // > 0
};

struct CoalescedRead {
  uint32_t file = 0;
  uint64_t offset = 0;  // multiple of align
  uint64_t length = 0;  // multiple of align, <= max(max_bytes, the largest single aligned range)
  std::vector<size_t> members;  // indices into the input, in offset order
};

// REQUIRES: align is a power of two; max_bytes is a multiple of align.
// A single range larger than max_bytes is split into max_bytes pieces, each a
// CoalescedRead naming that one member. Output is ordered by (file, offset).
std::vector<CoalescedRead> CoalesceReads(std::span<const ReadRange> ranges, uint64_t align = 4096,
                                         uint64_t max_bytes = 4u << 20);

}  // namespace orbitkv
