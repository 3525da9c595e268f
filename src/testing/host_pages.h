// HostPages: engine-side host page memory for tests and the demo engine: one
// memfd per region, sealed against shrinking and growing (what the Manager
// requires), mapped here for writing and checking page bytes.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "orbitkv/layout.h"

namespace orbitkv::testing {

class HostPages {
 public:
  explicit HostPages(const InstanceLayout& layout) : layout_(layout) {
    for (uint64_t bytes : layout.region_bytes) {
      int fd = ::memfd_create("orbitkv-pages", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
          ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        throw std::runtime_error("memfd setup failed");
      }
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
      fds_.push_back(fd);
      maps_.push_back(static_cast<uint8_t*>(p));
    }
  }
  ~HostPages() {
    for (size_t i = 0; i < maps_.size(); ++i) {
      ::munmap(maps_[i], layout_.region_bytes[i]);
      ::close(fds_[i]);
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
  std::vector<int> fds_;
  std::vector<uint8_t*> maps_;
};

// Split layout: one region per slot (a tensor per layer), stride = slot bytes.
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
  l.groups.push_back(g);
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
  l.groups.push_back(g);
  return l;
}

}  // namespace orbitkv::testing
