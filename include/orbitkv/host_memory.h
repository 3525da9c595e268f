// HostMemory: engine page memory in host RAM that the Manager can map: a memfd
// sealed against shrinking and growing (the Manager refuses anything else, so
// an engine can never truncate memory under a copy), mapped here read-write.
// Pass fd() in RegisterInstance's region fds (the kernel duplicates it).
// Move-only; unmaps and closes on destruction. Thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "orbitkv/status.h"

namespace orbitkv {

class HostMemory {
 public:
  // `name` shows in /proc/PID/fd for debugging. InvalidArgument for size 0.
  static Result<HostMemory> Create(uint64_t size, const std::string& name = "orbitkv-pages");
  HostMemory() = default;  // empty: fd() -1, data() null
  HostMemory(HostMemory&& other) noexcept;
  HostMemory& operator=(HostMemory&& other) noexcept;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  ~HostMemory();

  int fd() const { return fd_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  HostMemory(int fd, uint8_t* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}
  void Reset();
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace orbitkv
