// HostRegion: an engine's host page memory, shared with the Manager as a memfd
// and mapped here with mmap. Map() refuses fds that are not memfds sealed
// against shrinking (F_SEAL_SHRINK): otherwise an engine could truncate the
// file under the Manager and turn a page copy into SIGBUS. The mapping is
// released when the object dies. Immutable after Map(); thread-safe to read.
#pragma once

#include <cstdint>
#include <memory>

#include "orbitkv/status.h"

namespace orbitkv {

class HostRegion {
 public:
  // Takes ownership of fd (closed in every case). `bytes` is the size the
  // layout declares; the memfd must be at least that large.
  static Result<std::unique_ptr<HostRegion>> Map(int fd, uint64_t bytes);
  ~HostRegion();
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  uint8_t* data() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  HostRegion(uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  uint8_t* base_;
  uint64_t size_;
};

}  // namespace orbitkv
