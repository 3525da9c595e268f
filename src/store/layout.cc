// ValidateLayout: the rules are listed in include/orbitkv/layout.h. Every size
// comes from an engine over the socket, so all arithmetic is overflow-checked.
#include "orbitkv/layout.h"

#include <string>
#include <vector>

namespace orbitkv {
namespace {

std::string GroupPrefix(const GroupLayout& g) { return "group " + std::to_string(g.group_id); }

std::string SlotPrefix(const GroupLayout& g, const SlotLayout& s) {
  return GroupPrefix(g) + " slot " + std::to_string(s.slot_id);
}

Status ValidateSlot(const InstanceLayout& layout, const GroupLayout& g, const SlotLayout& s,
                    std::vector<bool>& seen) {
  if (s.slot_id >= g.num_slots) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": slot_id >= num_slots " +
                                   std::to_string(g.num_slots));
  }
  if (seen[s.slot_id]) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": slot_id appears twice in the group");
  }
  seen[s.slot_id] = true;
  if (s.region >= layout.region_bytes.size()) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": region " + std::to_string(s.region) +
                                   " >= region count " +
                                   std::to_string(layout.region_bytes.size()));
  }
  if (s.bytes_per_page != g.slot_bytes[s.slot_id]) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": bytes_per_page " +
                                   std::to_string(s.bytes_per_page) + " != slot_bytes " +
                                   std::to_string(g.slot_bytes[s.slot_id]));
  }
  if (layout.num_pages > 1 && s.page_stride == 0) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": page_stride is 0 with " +
                                   std::to_string(layout.num_pages) + " pages");
  }
  // End of the last page's bytes: offset + (num_pages - 1) * page_stride + bytes_per_page.
  const uint64_t region_bytes = layout.region_bytes[s.region];
  const std::string past_region =
      " past region " + std::to_string(s.region) + " (" + std::to_string(region_bytes) + " bytes)";
  uint64_t span = 0;
  if (__builtin_mul_overflow(layout.num_pages - 1, s.page_stride, &span)) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": page_stride " +
                                   std::to_string(s.page_stride) + " * (num_pages - 1) overflows");
  }
  uint64_t end = 0;
  if (__builtin_add_overflow(s.offset, span, &end) ||
      __builtin_add_overflow(end, s.bytes_per_page, &end)) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": offset " + std::to_string(s.offset) +
                                   " + (num_pages - 1) * page_stride + bytes_per_page overflows");
  }
  if (end > region_bytes) {
    return Status::InvalidArgument(SlotPrefix(g, s) + ": offset " + std::to_string(s.offset) +
                                   " page_stride " + std::to_string(s.page_stride) +
                                   ": last page ends at " + std::to_string(end) + past_region);
  }
  return Status::OK();
}

Status ValidateGroup(const InstanceLayout& layout, const GroupLayout& g) {
  if (g.num_slots == 0 || g.num_slots > kMaxSlotsPerGroup) {
    return Status::InvalidArgument(GroupPrefix(g) + ": num_slots " + std::to_string(g.num_slots) +
                                   " not in [1, " + std::to_string(kMaxSlotsPerGroup) + "]");
  }
  if (g.slot_bytes.size() != g.num_slots) {
    return Status::InvalidArgument(GroupPrefix(g) + ": slot_bytes has " +
                                   std::to_string(g.slot_bytes.size()) + " entries, num_slots " +
                                   std::to_string(g.num_slots));
  }
  for (size_t i = 0; i < g.slot_bytes.size(); ++i) {
    if (g.slot_bytes[i] == 0 || g.slot_bytes[i] > kMaxSlotBytes) {
      return Status::InvalidArgument(GroupPrefix(g) + " slot " + std::to_string(i) +
                                     ": slot_bytes " + std::to_string(g.slot_bytes[i]) +
                                     " not in [1, " + std::to_string(kMaxSlotBytes) + "]");
    }
  }
  if (g.slots.size() > g.num_slots) {
    return Status::InvalidArgument(GroupPrefix(g) + ": " + std::to_string(g.slots.size()) +
                                   " slots listed, num_slots " + std::to_string(g.num_slots));
  }
  std::vector<bool> seen(g.num_slots, false);
  for (const SlotLayout& s : g.slots) {
    ORBITKV_RETURN_IF_ERROR(ValidateSlot(layout, g, s, seen));
  }
  return Status::OK();
}

}  // namespace

Status ValidateLayout(const InstanceLayout& layout) {
  if (layout.num_pages == 0 || layout.num_pages >= kMaxPages) {
    return Status::InvalidArgument("num_pages " + std::to_string(layout.num_pages) +
                                   " not in [1, 2^40)");
  }
  if (layout.region_bytes.size() > kMaxRegions) {
    return Status::InvalidArgument("region_bytes: " + std::to_string(layout.region_bytes.size()) +
                                   " regions > " + std::to_string(kMaxRegions));
  }
  for (size_t r = 0; r < layout.region_bytes.size(); ++r) {
    if (layout.region_bytes[r] == 0) {
      return Status::InvalidArgument("region " + std::to_string(r) + ": region_bytes is 0");
    }
  }
  if (layout.groups.size() > kMaxGroups) {
    return Status::InvalidArgument("groups: " + std::to_string(layout.groups.size()) +
                                   " groups > " + std::to_string(kMaxGroups));
  }
  std::vector<bool> seen(kMaxGroups, false);
  for (const GroupLayout& g : layout.groups) {
    if (g.group_id >= kMaxGroups) {
      return Status::InvalidArgument(GroupPrefix(g) +
                                     ": group_id >= " + std::to_string(kMaxGroups));
    }
    if (seen[g.group_id]) {
      return Status::InvalidArgument(GroupPrefix(g) + ": group_id appears twice");
    }
    seen[g.group_id] = true;
    ORBITKV_RETURN_IF_ERROR(ValidateGroup(layout, g));
  }
  return Status::OK();
}

}  // namespace orbitkv
