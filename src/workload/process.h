// Process: the demo's child processes (the Manager and the engines), started
// with fork/exec. A child gets SIGTERM if the demo dies (PR_SET_PDEATHSIG), so
// nothing outlives an interrupted demo.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "orbitkv/status.h"

namespace orbitkv::demo {

struct SpawnOptions {
  int stdout_fd = -1;              // -1: inherit
  int stderr_fd = -1;              // -1: inherit
  std::vector<int> inherit_fds;    // fds that stay open across exec
  bool own_process_group = false;  // keep terminal SIGINT away (the parent stops it)
  std::vector<std::string> env;    // "NAME=value": set (or replaced) in the child's environment
};

class Child {
 public:
  static Result<Child> Spawn(const std::vector<std::string>& argv, const SpawnOptions& options);
  Child() = default;
  Child(Child&& o) noexcept : pid_(o.pid_), status_(o.status_) { o.pid_ = -1; }
  Child& operator=(Child&& o) noexcept;
  ~Child();  // kills (SIGKILL) and reaps a child still running

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Reaps without blocking; true (and the wait status) once it has exited.
  bool Poll(int* wait_status);
  // Sends `sig`, waits up to `timeout`, then SIGKILLs. Returns the wait status.
  int Stop(int sig, std::chrono::milliseconds timeout);
  // Waits up to `timeout` for the child to exit on its own, then Stop(SIGTERM, 5 s).
  int Wait(std::chrono::milliseconds timeout);
  void Signal(int sig);

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// "exited with status 1", "killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);
bool ExitedZero(int wait_status);

// A port that was free on 127.0.0.1 a moment ago (bind to 0 and read it back).
Result<uint16_t> PickFreePort();
// True if a server accepts connections on the Unix socket `path`.
bool SocketAccepts(const std::string& path);

}  // namespace orbitkv::demo
