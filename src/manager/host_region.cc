#include "manager/host_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace orbitkv {

Result<std::unique_ptr<HostRegion>> HostRegion::Map(int fd, uint64_t bytes) {
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  if (fd < 0) return Status::InvalidArgument("host region: no file descriptor");
  if (bytes == 0) return Status::InvalidArgument("host region: zero size");
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return Status::InvalidArgument(
        "host region: fd is not a memfd (F_GET_SEALS: " + std::string(strerror(errno)) + ")");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return Status::InvalidArgument("host region: memfd must be sealed with F_SEAL_SHRINK");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return Status::InvalidArgument(
        "host region: memfd is sealed against writes; restores write pages");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IOError("host region: fstat", errno);
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return Status::InvalidArgument("host region: memfd holds " + std::to_string(st.st_size) +
                                   " bytes, layout declares " + std::to_string(bytes));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::IOError("host region: mmap", errno);
  return std::unique_ptr<HostRegion>(new HostRegion(static_cast<uint8_t*>(p), bytes));
}

HostRegion::~HostRegion() { ::munmap(base_, size_); }

}  // namespace orbitkv
