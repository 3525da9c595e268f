#include "demo/pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace orbitkv::demo {

InstanceLayout SplitLayout(uint64_t pages, const std::vector<uint64_t>& slot_bytes) {
  InstanceLayout l;
  l.num_pages = pages;
  GroupLayout g;
  g.group_id = 0;
  g.num_slots = static_cast<uint32_t>(slot_bytes.size());
  g.slot_bytes = slot_bytes;
  for (uint32_t s = 0; s < slot_bytes.size(); ++s) {
    l.region_bytes.push_back(pages * slot_bytes[s]);
    g.slots.push_back({s, s, 0, slot_bytes[s], slot_bytes[s]});
  }
  l.groups.push_back(std::move(g));
  return l;
}

Result<Pages> Pages::Create(const InstanceLayout& layout) {
  Pages p(layout);
  for (uint64_t bytes : layout.region_bytes) {
    int fd = ::memfd_create("orbitkv-demo-pages", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return Status::IOError("memfd_create", errno);
    p.fds_.push_back(fd);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      return Status::IOError("ftruncate memfd", errno);
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
      return Status::IOError("seal memfd", errno);
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return Status::IOError("mmap memfd", errno);
    p.maps_.push_back(static_cast<uint8_t*>(m));
  }
  return p;
}

Pages::Pages(Pages&& o) noexcept
    : layout_(std::move(o.layout_)), fds_(std::move(o.fds_)), maps_(std::move(o.maps_)) {
  o.fds_.clear();
  o.maps_.clear();
}

Pages::~Pages() {
  for (size_t i = 0; i < maps_.size(); ++i) ::munmap(maps_[i], layout_.region_bytes[i]);
  for (int fd : fds_) ::close(fd);
}

void Pages::Poison(uint64_t page) {
  for (uint32_t s = 0; s < slots(); ++s) std::memset(Slot(s, page), 0xA5, slot_bytes(s));
}

}  // namespace orbitkv::demo
