// AddressRanges: how the CUDA device classifies the addresses of a copy call
// (gpu/cuda_platform.cc) without a lock or a driver call per address. Pure
// lookups, no CUDA: built and tested everywhere.
//
// A copy call names two addresses per op: a Publish or restore of the 70B
// TP=8 rank is 160 ops per block, each between the pinned pool and one of
// 160 page allocations (IPC mappings, one per slot), and four engines of it
// are 641 ranges. The device keeps an immutable AddressRangeTable of the
// memory it knows without asking the driver (its allocations and mappings,
// the registered host ranges), rebuilt only when that memory changes; each
// call looks up in it through a RangeLookup, which tries the two most
// recently used answers, then the index that last answered an address of
// the same 2 MiB granule on this thread, before a binary search. Issue 18: the per-call
// locked map lookups and searches were 23% of the request threads' CPU in a
// 70B Publish under perf on the H100, 20% with this (docs/bench/history.md,
// session 17).
//
// Thread-safety: an AddressRangeTable is immutable (share it freely; Find's
// per-thread guesses are thread_local); a RangeLookup belongs to one call on
// one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace orbitkv::gpu {

// What an address is to one device. kMappedHost: pinned host memory the
// device reads and writes at the same address.
enum class MemoryKind : uint8_t { kThisDevice, kElsewhere, kMappedHost, kUnknown };

struct AddressRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
  MemoryKind kind = MemoryKind::kUnknown;
  // [address, +bytes) lies wholly inside (an empty range at `end` does not).
  bool Holds(uint64_t address, uint64_t bytes) const {
    return address >= begin && address - begin < end - begin && bytes <= end - address;
  }
};

class AddressRangeTable {
 public:
  static constexpr size_t npos = static_cast<size_t>(-1);

  AddressRangeTable() = default;
  // Sorts `ranges`. REQUIRES: each begin < end; no two overlap.
  explicit AddressRangeTable(std::vector<AddressRange> ranges);

  // The index of the range wholly holding [address, +bytes), or npos. The
  // index that last answered for the address's 2 MiB granule on this thread
  // (any table's) is checked first: a steady workload's addresses are found
  // without the binary search.
  size_t Find(uint64_t address, uint64_t bytes) const;
  const AddressRange& operator[](size_t i) const { return sorted_[i]; }
  size_t size() const { return sorted_.size(); }

 private:
  std::vector<AddressRange> sorted_;  // by begin
};

// One copy call's classification: the device's table, then the ranges this
// call learned from the driver (Keep), with its latest answers tried first.
// Valid only within the call: the caller keeps its memory allocated until
// the copies ran, but an address may name other memory in a later call.
class RangeLookup {
 public:
  // REQUIRES: `known` outlives this.
  explicit RangeLookup(const AddressRangeTable& known) : known_(known) {}

  // The kind of the range wholly holding [address, +bytes), when one is known.
  bool Find(uint64_t address, uint64_t bytes, MemoryKind* kind);
  // Keeps [begin, end) of `kind` (an allocation's extent, as the driver
  // answered) for the call's later ops; returns `kind`. REQUIRES: begin < end;
  // disjoint from the table's and the kept ranges.
  MemoryKind Keep(uint64_t begin, uint64_t end, MemoryKind kind);
  // Finds that the last two answers did not settle (tests, diagnostics).
  uint64_t slow_finds() const { return slow_finds_; }

 private:
  // The two most recently used answers, most recent first: a new answer
  // goes first and the older one second, and a hit on the second moves it
  // first. A copy call's ops alternate between one range on one side (the
  // pool) and many on the other (a page per slot): the pool stays, and each
  // op asks the table once, for its page (round-robin replacement evicted
  // the pool every other op).
  void Remember(const AddressRange& r) {
    recent_[1] = recent_[0];
    recent_[0] = r;
  }

  const AddressRangeTable& known_;
  AddressRange recent_[2];
  uint64_t slow_finds_ = 0;
  std::vector<AddressRange> kept_;  // sorted by begin
};

}  // namespace orbitkv::gpu
