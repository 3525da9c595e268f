#include "gpu/address_ranges.h"

#include <algorithm>

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

size_t AddressRangeTable::Find(uint64_t address, uint64_t bytes, size_t hint) const {
  if (hint < sorted_.size()) {
    // The next allocation first: a call's ops mostly walk up the table.
    for (size_t i : {hint + 1, hint, hint - 1}) {
      if (i < sorted_.size() && sorted_[i].Holds(address, bytes)) return i;
    }
  }
  return Search(sorted_, address, bytes);
}

bool RangeLookup::Find(uint64_t address, uint64_t bytes, MemoryKind* kind) {
  for (const AddressRange& r : recent_) {
    if (r.Holds(address, bytes)) {
      *kind = r.kind;
      return true;
    }
  }
  if (size_t i = known_.Find(address, bytes, hint_); i != AddressRangeTable::npos) {
    hint_ = i;
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
