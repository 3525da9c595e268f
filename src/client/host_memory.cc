#include "orbitkv/host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace orbitkv {

Result<HostMemory> HostMemory::Create(uint64_t size, const std::string& name) {
  if (size == 0) return Status::InvalidArgument("host memory of 0 bytes");
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::IOError("memfd_create " + name, errno);
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(std::string(what) + " " + name, err);
  };
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("ftruncate");
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return fail("seal");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  return HostMemory(fd, static_cast<uint8_t*>(p), size);
}

HostMemory::HostMemory(HostMemory&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

HostMemory& HostMemory::operator=(HostMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

HostMemory::~HostMemory() { Reset(); }

void HostMemory::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace orbitkv
