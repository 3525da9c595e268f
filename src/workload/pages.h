// Pages: an engine's host KV pages in any layout (split: one region per slot,
// i.e. one tensor per layer and K/V; page-first; one group or a hybrid
// model's several). Each region is a HostMemory (a sealed memfd, as the
// Manager requires) mapped here so the engine can write and check pages.
// Groups are indices into the layout's groups.
#pragma once

#include <cstdint>
#include <vector>

#include "orbitkv/cache_api.h"
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
  uint32_t slots(uint32_t group = 0) const {
    return static_cast<uint32_t>(layout_.groups[group].slots.size());
  }
  uint64_t slot_bytes(uint32_t group, uint32_t slot) const {
    return layout_.groups[group].slots[slot].bytes_per_page;
  }
  uint8_t* Slot(uint32_t group, uint32_t slot, uint64_t page) {
    const SlotLayout& s = layout_.groups[group].slots[slot];
    return maps_[s.region] + SlotPageOffset(s, page);
  }
  // Overwrites every slot of `page` of `group` with a poison pattern, so a
  // restore that did not write it cannot pass verification with stale bytes.
  void Poison(uint32_t group, uint64_t page);
  // FillBlockSlot / CheckBlockSlot over every slot of `page` of `group`.
  void Fill(uint32_t group, const BlockKey& key, uint64_t page);
  bool Check(uint32_t group, const BlockKey& key, uint64_t page);

 private:
  explicit Pages(const InstanceLayout& layout) : layout_(layout) {}
  InstanceLayout layout_;
  std::vector<HostMemory> memory_;
  std::vector<int> fds_;        // memory_[i].fd()
  std::vector<uint8_t*> maps_;  // memory_[i].data()
};

}  // namespace orbitkv::demo
