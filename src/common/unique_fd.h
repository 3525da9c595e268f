// UniqueFd: sole owner of a file descriptor; closes it on destruction. Move
// only. Used wherever a descriptor is owned (protocol, SSD backend, tests).
// Thread-compatible (like a unique_ptr): one object, one thread at a time.
#pragma once

#include <unistd.h>

#include <utility>

namespace orbitkv {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership without closing.
  [[nodiscard]] int Release() { return std::exchange(fd_, -1); }
  // Closes the owned fd (if any) and owns `fd` instead. Never retries close on
  // EINTR: Linux frees the descriptor either way, and a retry could close a
  // descriptor another thread has just been given.
  void Reset(int fd = -1) {
    if (fd_ >= 0 && fd_ != fd) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace orbitkv
