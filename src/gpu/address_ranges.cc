#include "gpu/address_ranges.h"

#include <algorithm>
#include <array>
#include <utility>

namespace orbitkv::gpu {
namespace {

// The index of the range of `sorted` (by begin) wholly holding [address,
// +bytes), or npos.
size_t Search(const std::vector<AddressRange>& sorted, uint64_t address, uint64_t bytes) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), address,
                             [](uint64_t a, const AddressRange& r) { return a < r.begin; });
  if (it == sorted.begin() || !std::prev(it)->Holds(address, bytes)) {
    return AddressRangeTable::npos;
  }
  return static_cast<size_t>(std::prev(it) - sorted.begin());
}

}  // namespace

AddressRangeTable::AddressRangeTable(std::vector<AddressRange> ranges)
    : sorted_(std::move(ranges)) {
  std::sort(sorted_.begin(), sorted_.end(),
            [](const AddressRange& a, const AddressRange& b) { return a.begin < b.begin; });
}

size_t AddressRangeTable::Find(uint64_t address, uint64_t bytes) const {
  // Per thread: which index answered an address of each 2 MiB granule (by a
  // multiplicative hash). An entry is only a guess, checked against the
  // range it names: an index from another table, or from before this table
  // changed, that holds the address is the right answer (ranges are
  // disjoint), and one that does not costs the search it saves.
  constexpr int kBucketBits = 13;
  thread_local std::array<uint32_t, size_t{1} << kBucketBits> last_hit{};
  const size_t bucket = ((address >> 21) * 0x9E3779B97F4A7C15ull) >> (64 - kBucketBits);
  const uint32_t guess = last_hit[bucket];
  if (guess < sorted_.size() && sorted_[guess].Holds(address, bytes)) return guess;
  const size_t found = Search(sorted_, address, bytes);
  if (found != npos) last_hit[bucket] = static_cast<uint32_t>(found);
  return found;
}

bool RangeLookup::Find(uint64_t address, uint64_t bytes, MemoryKind* kind) {
  if (recent_[0].Holds(address, bytes)) {
    *kind = recent_[0].kind;
    return true;
  }
  if (recent_[1].Holds(address, bytes)) {
    std::swap(recent_[0], recent_[1]);
    *kind = recent_[0].kind;
    return true;
  }
  ++slow_finds_;
  if (size_t i = known_.Find(address, bytes); i != AddressRangeTable::npos) {
    Remember(known_[i]);
    *kind = known_[i].kind;
    return true;
  }
  if (size_t i = Search(kept_, address, bytes); i != AddressRangeTable::npos) {
    Remember(kept_[i]);
    *kind = kept_[i].kind;
    return true;
  }
  return false;
}

MemoryKind RangeLookup::Keep(uint64_t begin, uint64_t end, MemoryKind kind) {
  const AddressRange r{begin, end, kind};
  auto it = std::upper_bound(kept_.begin(), kept_.end(), begin,
                             [](uint64_t a, const AddressRange& x) { return a < x.begin; });
  kept_.insert(it, r);
  Remember(r);
  return kind;
}

}  // namespace orbitkv::gpu
