// HostPages: engine-side host page memory for tests: one HostMemory (sealed
// memfd) per layout region, with byte patterns to fill and check pages.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "orbitkv/host_memory.h"
#include "orbitkv/layout.h"

namespace orbitkv::testing {

class HostPages {
 public:
  explicit HostPages(const InstanceLayout& layout) : layout_(layout) {
    for (uint64_t bytes : layout.region_bytes) {
      Result<HostMemory> m = HostMemory::Create(bytes, "orbitkv-test-pages");
      if (!m.ok()) throw std::runtime_error(m.status().ToString());
      fds_.push_back(m->fd());
      maps_.push_back(m->data());
      memory_.push_back(std::move(m).value());
    }
  }
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;

  // Duplicates of the region fds, for a RegisterInstance call that takes ownership.
  std::vector<int> DupFds() const {
    std::vector<int> out;
    for (int fd : fds_) out.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    return out;
  }
  const std::vector<int>& fds() const { return fds_; }

  uint8_t* Slot(uint32_t group_index, size_t slot_index, uint64_t page) {
    const SlotLayout& s = layout_.groups[group_index].slots[slot_index];
    return maps_[s.region] + SlotPageOffset(s, page);
  }
  // Fills every slot of `page` in group `gi` with bytes derived from `seed`.
  void Fill(uint32_t gi, uint64_t page, uint64_t seed) {
    const GroupLayout& g = layout_.groups[gi];
    for (size_t i = 0; i < g.slots.size(); ++i) {
      uint8_t* p = Slot(gi, i, page);
      for (uint64_t b = 0; b < g.slots[i].bytes_per_page; ++b) {
        p[b] = Byte(seed, g.slots[i].slot_id, b);
      }
    }
  }
  void Clear(uint32_t gi, uint64_t page) {
    const GroupLayout& g = layout_.groups[gi];
    for (size_t i = 0; i < g.slots.size(); ++i)
      std::memset(Slot(gi, i, page), 0, g.slots[i].bytes_per_page);
  }
  // True if every slot of `page` holds exactly what Fill(gi, _, seed) wrote.
  bool Holds(uint32_t gi, uint64_t page, uint64_t seed) {
    const GroupLayout& g = layout_.groups[gi];
    for (size_t i = 0; i < g.slots.size(); ++i) {
      const uint8_t* p = Slot(gi, i, page);
      for (uint64_t b = 0; b < g.slots[i].bytes_per_page; ++b) {
        if (p[b] != Byte(seed, g.slots[i].slot_id, b)) return false;
      }
    }
    return true;
  }
  static uint8_t Byte(uint64_t seed, uint32_t slot, uint64_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + slot * 0xBF58476D1CE4E5B9ULL + i;
    x ^= x >> 29;
    x *= 0x94D049BB133111EBULL;
    return static_cast<uint8_t>(x >> 32);
  }

 private:
  InstanceLayout layout_;
  std::vector<HostMemory> memory_;
  std::vector<int> fds_;        // memory_[i].fd()
  std::vector<uint8_t*> maps_;  // memory_[i].data()
};

using ::orbitkv::PageFirstLayout;
using ::orbitkv::SplitLayout;

}  // namespace orbitkv::testing
