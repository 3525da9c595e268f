// ManagerProcess: starts orbitkv-cache-manager as a child of a workload driver
// (orbitkv-demo, orbitkv-bench) and waits until it serves its socket. The
// child's stdout and stderr go to a log file; it runs in its own process group,
// so a terminal's Ctrl-C reaches only the driver, which then stops it (and
// PR_SET_PDEATHSIG stops it if the driver dies). Call from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "orbitkv/status.h"
#include "workload/process.h"

namespace orbitkv::demo {

struct ManagerLaunch {
  std::string binary;             // absolute path of orbitkv-cache-manager
  std::vector<std::string> args;  // flags other than --socket and --metrics-port
  std::vector<std::string> env;   // "NAME=value" set in its environment
  std::string socket;             // --socket; must not be served by another Manager
  std::string log_path;           // truncated, then receives stdout and stderr
  uint16_t metrics_port = 0;      // 0: a free ephemeral port, retried if taken meanwhile
  std::chrono::seconds ready_timeout{30};
  const std::atomic<bool>* interrupted = nullptr;  // polled while waiting; may be null
};

struct RunningManager {
  Child child;
  uint16_t metrics_port = 0;
};

// Spawns the Manager and returns once its socket accepts connections.
// Cancelled if *interrupted became true (the child is stopped); otherwise the
// error message says what happened and quotes the log's last lines.
Result<RunningManager> StartManager(const ManagerLaunch& launch);

// The Manager binary: `explicit_path` if non-empty, else $ORBITKV_MANAGER_BINARY,
// else ../server/orbitkv-cache-manager next to this executable; made canonical.
// NotFound (naming the path) when it is not executable.
Result<std::string> FindManagerBinary(const std::string& explicit_path);

// The last `lines` lines of a text file, each indented by four spaces.
std::string TailLines(const std::string& path, size_t lines);

}  // namespace orbitkv::demo
