// Layout: where an engine's KV pages live, and how they group into stored
// objects. An instance registers memory regions (host memfds now, CUDA IPC
// allocations with the GPU tier) and, per storage group, the slots it owns:
// slot s of page p lives at region[s.region] + s.offset + p * s.page_stride and
// is s.bytes_per_page long. Split layouts (one tensor per layer: one region per
// slot, stride = bytes per page) and page-first layouts (one region, all slots
// of a page adjacent: stride = page size, offset = slot offset inside the page)
// are both expressible. Slot sizes need not be multiples of 512 or 4096.
// A group's shape (slot count and sizes) is fixed per namespace; instances of
// one namespace (TP/PP writers) may each own a subset of its slots.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "orbitkv/status.h"

namespace orbitkv {

inline constexpr uint32_t kMaxGroups = 64;
inline constexpr uint32_t kMaxSlotsPerGroup = 4096;
inline constexpr uint32_t kMaxRegions = 4096;
inline constexpr uint64_t kMaxSlotBytes = 1ull << 30;
inline constexpr uint64_t kMaxPages = 1ull << 40;  // num_pages < kMaxPages

struct SlotLayout {
  uint32_t slot_id = 0;         // index in the group, < GroupLayout::num_slots
  uint32_t region = 0;          // index into the instance's regions
  uint64_t offset = 0;          // bytes from the region start to page 0's slot
  uint64_t page_stride = 0;     // bytes between consecutive pages' slots (> 0 unless one page)
  uint64_t bytes_per_page = 0;  // slot bytes per page (> 0)
};

struct GroupLayout {
  uint32_t group_id = 0;             // < kMaxGroups, unique per instance
  uint32_t num_slots = 0;            // slots in the whole group (all writers)
  std::vector<uint64_t> slot_bytes;  // size of every slot of the group (num_slots entries)
  std::vector<SlotLayout> slots;     // the slots this instance holds
};

struct InstanceLayout {
  uint64_t num_pages = 0;              // page ids are [0, num_pages); 1 <= num_pages < kMaxPages
  std::vector<uint64_t> region_bytes;  // size of each registered region
  std::vector<GroupLayout> groups;
};

// Checks every rule above, and that every page of every slot lies inside its
// region (overflow-safe). The error (InvalidArgument) names the group, slot and
// field. Overlap is not checked, neither between slots nor between pages of one
// slot (page_stride < bytes_per_page): engines may alias memory on purpose.
Status ValidateLayout(const InstanceLayout& layout);

// Split layout (one tensor per slot, e.g. per layer): region s holds slot s of
// every page, stride = slot bytes. One group, every slot held.
inline InstanceLayout SplitLayout(uint64_t pages, const std::vector<uint64_t>& slot_bytes,
                                  uint32_t group_id = 0) {
  InstanceLayout l;
  l.num_pages = pages;
  GroupLayout g;
  g.group_id = group_id;
  g.num_slots = static_cast<uint32_t>(slot_bytes.size());
  g.slot_bytes = slot_bytes;
  for (uint32_t s = 0; s < slot_bytes.size(); ++s) {
    l.region_bytes.push_back(pages * slot_bytes[s]);
    g.slots.push_back({s, s, 0, slot_bytes[s], slot_bytes[s]});
  }
  l.groups.push_back(std::move(g));
  return l;
}

// Page-first layout: one region; a page holds all its slots back to back.
inline InstanceLayout PageFirstLayout(uint64_t pages, const std::vector<uint64_t>& slot_bytes,
                                      uint32_t group_id = 0) {
  InstanceLayout l;
  l.num_pages = pages;
  GroupLayout g;
  g.group_id = group_id;
  g.num_slots = static_cast<uint32_t>(slot_bytes.size());
  g.slot_bytes = slot_bytes;
  uint64_t page_bytes = 0;
  for (uint64_t b : slot_bytes) page_bytes += b;
  uint64_t off = 0;
  for (uint32_t s = 0; s < slot_bytes.size(); ++s) {
    g.slots.push_back({s, 0, off, page_bytes, slot_bytes[s]});
    off += slot_bytes[s];
  }
  l.region_bytes.push_back(pages * page_bytes);
  l.groups.push_back(std::move(g));
  return l;
}

// Byte offset of (slot, page) inside its region. REQUIRES: layout validated, page < num_pages.
inline uint64_t SlotPageOffset(const SlotLayout& s, uint64_t page) {
  return s.offset + page * s.page_stride;
}

}  // namespace orbitkv
