// Helpers shared by the protocol tests: fd counting, memfds, a recording
// SessionHandler, socket paths. Test-only.
#pragma once

#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "protocol/server.h"

namespace orbitkv::protocol::testing {

// Threads of this process (/proc/self/status), -1 if unreadable.
inline int CountThreads() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int n = -1;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::sscanf(line, "Threads: %d", &n) == 1) break;
  }
  std::fclose(f);
  return n;
}

// Open file descriptors of this process.
inline int CountOpenFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n - 1;  // the DIR's own fd
}

// A memfd holding `data`.
inline UniqueFd MemfdWith(const std::string& data) {
  UniqueFd fd(::memfd_create("orbitkv-test", MFD_CLOEXEC));
  if (!fd) return fd;
  if (::pwrite(fd.get(), data.data(), data.size(), 0) != static_cast<ssize_t>(data.size())) {
    return UniqueFd();
  }
  return fd;
}

inline std::string ReadAll(int fd, size_t max = 1 << 20) {
  std::string out(max, '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

struct SocketPair {
  UniqueFd a, b;
};
inline SocketPair MakeSocketPair() {
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return {};
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Records every callback; optionally runs `on_frame` for each frame.
class RecordingHandler : public SessionHandler {
 public:
  std::function<void(Session&, Frame&&)> on_frame;
  std::function<bool(const Session&)> may_close_idle;  // default: true

  bool MayCloseIdle(const Session& s) override { return !may_close_idle || may_close_idle(s); }

  void OnOpen(Session& s) override {
    std::lock_guard lock(mu_);
    opens_[s.id()]++;
    sessions_.push_back(s.Ref());
    cv_.notify_all();
  }
  void OnFrame(Session& s, Frame&& f) override {
    if (on_frame) {
      on_frame(s, std::move(f));
    }
    std::lock_guard lock(mu_);
    frames_++;
    cv_.notify_all();
  }
  int frames() {
    std::lock_guard lock(mu_);
    return frames_;
  }
  bool WaitFrames(int n, std::chrono::milliseconds t = std::chrono::seconds(10)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, t, [&] { return frames_ >= n; });
  }
  void OnClose(Session& s) override {
    std::lock_guard lock(mu_);
    closes_[s.id()]++;
    cv_.notify_all();
  }

  bool WaitOpens(size_t n, std::chrono::milliseconds t = std::chrono::seconds(10)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, t, [&] { return opens_.size() >= n; });
  }
  bool WaitCloses(size_t n, std::chrono::milliseconds t = std::chrono::seconds(10)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, t, [&] { return closes_.size() >= n; });
  }
  std::map<uint64_t, int> opens() {
    std::lock_guard lock(mu_);
    return opens_;
  }
  std::map<uint64_t, int> closes() {
    std::lock_guard lock(mu_);
    return closes_;
  }
  std::vector<std::shared_ptr<Session>> sessions() {
    std::lock_guard lock(mu_);
    return sessions_;
  }
  // Drops the handler's references (sessions are kept alive by them otherwise).
  void ForgetSessions() {
    std::lock_guard lock(mu_);
    sessions_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, int> opens_;
  std::map<uint64_t, int> closes_;
  std::vector<std::shared_ptr<Session>> sessions_;
  int frames_ = 0;
};

}  // namespace orbitkv::protocol::testing
