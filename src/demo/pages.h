// Pages: an engine's host KV pages in a split layout (one region per slot,
// i.e. one tensor per layer and K/V; slot s of page p at region s + p * slot
// bytes). Each region is a memfd sealed against shrinking and growing, as the
// Manager requires, mapped here so the engine can write and check pages.
#pragma once

#include <cstdint>
#include <vector>

#include "orbitkv/layout.h"
#include "orbitkv/status.h"

namespace orbitkv::demo {

// Split layout of `pages` pages for one group (id 0) with these slot sizes.
InstanceLayout SplitLayout(uint64_t pages, const std::vector<uint64_t>& slot_bytes);

class Pages {
 public:
  static Result<Pages> Create(const InstanceLayout& layout);
  Pages(Pages&& other) noexcept;
  Pages& operator=(Pages&&) = delete;
  Pages(const Pages&) = delete;
  ~Pages();

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
  std::vector<int> fds_;
  std::vector<uint8_t*> maps_;
};

}  // namespace orbitkv::demo
