// Pages: an engine's host KV pages in a split layout (orbitkv::SplitLayout: one
// region per slot, i.e. one tensor per layer and K/V). Each region is a
// HostMemory (a sealed memfd, as the Manager requires) mapped here so the
// engine can write and check pages.
#pragma once

#include <cstdint>
#include <vector>

#include "orbitkv/host_memory.h"
#include "orbitkv/layout.h"
#include "orbitkv/status.h"

namespace orbitkv::demo {

class Pages {
 public:
  static Result<Pages> Create(const InstanceLayout& layout);
  Pages(Pages&& other) noexcept = default;
  Pages& operator=(Pages&&) = delete;
  Pages(const Pages&) = delete;

  // The region fds, for RegisterInstance (the client sends them; we keep ours).
  const std::vector<int>& fds() const { return fds_; }
  uint32_t slots() const { return static_cast<uint32_t>(layout_.groups[0].slots.size()); }
  uint64_t slot_bytes(uint32_t slot) const { return layout_.groups[0].slots[slot].bytes_per_page; }
  uint8_t* Slot(uint32_t slot, uint64_t page) {
    const SlotLayout& s = layout_.groups[0].slots[slot];
    return maps_[s.region] + SlotPageOffset(s, page);
  }
  // Overwrites every slot of `page` with a poison pattern, so a restore that
  // did not write it cannot pass verification with stale bytes.
  void Poison(uint64_t page);

 private:
  explicit Pages(const InstanceLayout& layout) : layout_(layout) {}
  InstanceLayout layout_;
  std::vector<HostMemory> memory_;
  std::vector<int> fds_;        // memory_[i].fd()
  std::vector<uint8_t*> maps_;  // memory_[i].data()
};

}  // namespace orbitkv::demo
