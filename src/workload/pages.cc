#include "workload/pages.h"

#include <cstring>

#include "workload/workload.h"

namespace orbitkv::demo {

Result<Pages> Pages::Create(const InstanceLayout& layout) {
  Pages p(layout);
  for (uint64_t bytes : layout.region_bytes) {
    ORBITKV_ASSIGN_OR_RETURN(HostMemory m, HostMemory::Create(bytes, "orbitkv-demo-pages"));
    p.fds_.push_back(m.fd());
    p.maps_.push_back(m.data());
    p.memory_.push_back(std::move(m));
  }
  return p;
}

void Pages::Poison(uint32_t group, uint64_t page) {
  for (uint32_t s = 0; s < slots(group); ++s)
    std::memset(Slot(group, s, page), 0xA5, slot_bytes(group, s));
}

void Pages::Fill(uint32_t group, const BlockKey& key, uint64_t page) {
  for (uint32_t s = 0; s < slots(group); ++s)
    FillBlockSlot(key, s, Slot(group, s, page), slot_bytes(group, s));
}

bool Pages::Check(uint32_t group, const BlockKey& key, uint64_t page) {
  for (uint32_t s = 0; s < slots(group); ++s)
    if (!CheckBlockSlot(key, s, Slot(group, s, page), slot_bytes(group, s))) return false;
  return true;
}

}  // namespace orbitkv::demo
