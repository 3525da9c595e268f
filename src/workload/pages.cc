#include "workload/pages.h"

#include <cstring>

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

void Pages::Poison(uint64_t page) {
  for (uint32_t s = 0; s < slots(); ++s) std::memset(Slot(s, page), 0xA5, slot_bytes(s));
}

}  // namespace orbitkv::demo
