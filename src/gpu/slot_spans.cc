#include "gpu/slot_spans.h"

#include <algorithm>
#include <string>
#include <utility>

namespace orbitkv::gpu {

Result<uint64_t> CheckSlotSpans(std::span<const SlotSpan> slots, uint64_t pages,
                                std::vector<uint64_t>* extents, std::vector<uint64_t>* zero_after) {
  if (slots.empty() || slots.size() > kGatherMaxSlots || pages == 0) {
    return Status::InvalidArgument("CreateSlotTable: " + std::to_string(slots.size()) +
                                   " slots over " + std::to_string(pages) + " pages (1.." +
                                   std::to_string(kGatherMaxSlots) + " slots, 1 page at least)");
  }
  extents->clear();
  extents->reserve(slots.size());
  std::vector<std::pair<uint64_t, size_t>> by_offset;  // (offset, slot)
  by_offset.reserve(slots.size());
  const uint64_t last = pages - 1;
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotSpan& sl = slots[i];
    const std::string which = "CreateSlotTable slot " + std::to_string(i) + ": ";
    if (sl.bytes == 0 || sl.bytes > kGatherSlotMaxBytes || sl.offset % 16 != 0 ||
        sl.offset + sl.bytes < sl.offset) {
      return Status::InvalidArgument(which + std::to_string(sl.bytes) + " bytes at object offset " +
                                     std::to_string(sl.offset) + " (1.." +
                                     std::to_string(kGatherSlotMaxBytes) +
                                     " bytes at a 16-byte aligned offset)");
    }
    if ((last != 0 && sl.stride > (UINT64_MAX - sl.bytes) / last) || sl.base == 0 ||
        sl.base + (sl.stride * last + sl.bytes) < sl.base) {
      return Status::InvalidArgument(which + "a null base, or pages past the address space");
    }
    extents->push_back(sl.stride * last + sl.bytes);
    by_offset.emplace_back(sl.offset, i);
  }
  std::sort(by_offset.begin(), by_offset.end());
  zero_after->assign(slots.size(), 0);
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const SlotSpan& prev = slots[by_offset[k - 1].second];
    const uint64_t prev_end = prev.offset + prev.bytes;
    if (by_offset[k].first < prev_end) {
      return Status::InvalidArgument("CreateSlotTable: two slots overlap in the object at offset " +
                                     std::to_string(by_offset[k].first));
    }
    (*zero_after)[by_offset[k - 1].second] = by_offset[k].first - prev_end;
  }
  const SlotSpan& end = slots[by_offset.back().second];
  return end.offset + end.bytes;
}

}  // namespace orbitkv::gpu
