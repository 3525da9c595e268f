// Process harness of the cross-process tests (manager_process_test.cc,
// torture_test.cc): child processes with collected output, engine "@ tag
// k=v" result lines, /metrics scrapes over loopback HTTP, and a real
// orbitkv-cache-manager process started on a socket and SSD path. Test-only;
// every call is made from the test's thread unless noted.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/unique_fd.h"

extern char** environ;

namespace orbitkv::integration {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- binaries ------------------------------------------------------------------

inline std::string BinaryFromEnv(const char* var) {
  const char* v = std::getenv(var);
  return v && *v ? v : "";
}

// ---- child processes -----------------------------------------------------------

// A child process whose stdout and stderr are collected by a reader thread.
class Proc {
 public:
  Proc(std::string name, const std::vector<std::string>& argv) : name_(std::move(name)) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      error_ = "pipe2: " + std::string(std::strerror(errno));
      return;
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(p[1]);
    if (rc != 0) {
      ::close(p[0]);
      pid_ = -1;
      error_ = "posix_spawn " + argv[0] + ": " + std::strerror(rc);
      return;
    }
    reader_ = std::thread([this, fd = p[0]] {
      char buf[4096];
      for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        std::lock_guard lock(mu_);
        out_.append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
      ::close(fd);
      std::lock_guard lock(mu_);
      eof_ = true;
      cv_.notify_all();
    });
  }
  ~Proc() {
    if (Running()) {
      ::kill(pid_, SIGKILL);
      WaitExit(10s);
    }
    if (reader_.joinable()) reader_.join();
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  bool started() const { return pid_ > 0; }
  const std::string& error() const { return error_; }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // True while the child has not exited (reaps it when it has).
  bool Running() {
    if (pid_ <= 0 || status_.has_value()) return false;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      return false;
    }
    return r == 0;
  }
  // The raw wait status, or nullopt if the child still runs after `timeout`.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Running()) {
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(2ms);
    }
    return status_;
  }
  void Signal(int sig) {
    if (Running()) ::kill(pid_, sig);
  }
  bool WaitOutput(const std::string& needle, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      return out_.find(needle) != std::string::npos || eof_;
    }) && out_.find(needle) != std::string::npos;
  }
  // Waits until the child's end of the output pipe is closed (everything it
  // wrote has been collected).
  bool WaitEof(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return eof_; });
  }
  std::string Output() {
    std::lock_guard lock(mu_);
    return out_;
  }
  std::string Tail(size_t bytes = 3000) {
    std::string o = Output();
    return o.size() > bytes ? "..." + o.substr(o.size() - bytes) : o;
  }

 private:
  std::string name_;
  std::string error_;
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_;
  bool eof_ = false;
};

inline std::string DescribeStatus(std::optional<int> st) {
  if (!st) return "still running";
  if (WIFEXITED(*st)) return "exit " + std::to_string(WEXITSTATUS(*st));
  if (WIFSIGNALED(*st)) return std::string("signal ") + strsignal(WTERMSIG(*st));
  return "status " + std::to_string(*st);
}

// ---- engine output ---------------------------------------------------------------

struct EngineRun {
  int rc = -1;  // exit code; -1: did not exit normally
  std::string out;
};

// The value of `field` on the engine's "@ <tag> ..." line, or -1.
inline int64_t Field(const std::string& out, const std::string& tag, const std::string& field) {
  std::istringstream in(out);
  std::string line;
  const std::string head = "@ " + tag + " ";
  while (std::getline(in, line)) {
    if (line.rfind(head, 0) != 0) continue;
    std::istringstream words(line.substr(head.size()));
    std::string w;
    while (words >> w) {
      if (w.rfind(field + "=", 0) == 0) {
        const std::string v = w.substr(field.size() + 1);
        if (!v.empty() && std::isdigit(static_cast<unsigned char>(v[0]))) return std::stoll(v);
        return -1;
      }
    }
  }
  return -1;
}

inline std::string StrField(const std::string& out, const std::string& tag,
                            const std::string& field) {
  std::istringstream in(out);
  std::string line;
  const std::string head = "@ " + tag + " ";
  while (std::getline(in, line)) {
    if (line.rfind(head, 0) != 0) continue;
    std::istringstream words(line.substr(head.size()));
    std::string w;
    while (words >> w) {
      if (w.rfind(field + "=", 0) == 0) return w.substr(field.size() + 1);
    }
  }
  return "";
}

// ---- /metrics ------------------------------------------------------------------------

struct Metrics {
  std::map<std::string, double> series;  // "name" or "name{labels}" -> value
  // The sum of every series of `name`; nullopt if there is none.
  std::optional<double> Get(const std::string& name) const {
    std::optional<double> sum;
    for (const auto& [k, v] : series) {
      if (k == name || (k.size() > name.size() && k.rfind(name + "{", 0) == 0)) {
        sum = sum.value_or(0) + v;
      }
    }
    return sum;
  }
};

inline std::optional<Metrics> Scrape(int port, std::string* error) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval tv{3, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    *error = "connect :" + std::to_string(port) + ": " + std::strerror(errno);
    return std::nullopt;
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    *error = "send failed";
    return std::nullopt;
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = std::string("recv: ") + std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  const size_t body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || resp.find(" 200 ") == std::string::npos ||
      body == std::string::npos) {
    *error = "bad response: " + resp.substr(0, 200);
    return std::nullopt;
  }
  Metrics m;
  std::istringstream in(resp.substr(body + 4));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    try {
      m.series[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    } catch (const std::exception&) {
      *error = "bad sample line: " + line;
      return std::nullopt;
    }
  }
  return m;
}

// Every gauge that must return to zero once no client is connected.
inline const std::vector<std::string> kReleaseGauges = {
    "orbitkv_queries_active",    "orbitkv_restores_inflight", "orbitkv_query_budget_used_bytes",
    "orbitkv_pool_pinned_bytes", "orbitkv_ssd_leases_active", "orbitkv_ssd_read_pinned_bytes",
    "orbitkv_instances",         "orbitkv_sessions"};

inline std::string Describe(const Metrics& m, const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) {
    std::optional<double> v = m.Get(n);
    s += " " + n + "=" + (v ? std::to_string(static_cast<int64_t>(*v)) : "MISSING");
  }
  return s;
}

inline int FreeTcpPort() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 0;
  socklen_t len = sizeof a;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

inline int CountFds(pid_t pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

// ---- the Manager process ---------------------------------------------------------

struct ManagerFlags {
  std::string pool = "8mib";
  bool ssd = true;
  std::string ssd_capacity = "64mib";
  int shards = 2;
  int io_workers = 2;
  int queue_depth = 64;
  std::vector<std::string> extra = {};  // more flags, as given
};

class ManagerProc {
 public:
  // Starts the Manager on `socket` (SSD cache at `ssd_path`) and waits until it
  // logs that it is ready. On failure, error() says why.
  ManagerProc(const std::string& binary, const std::string& socket, const std::string& ssd_path,
              const ManagerFlags& f)
      : socket_(socket) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      port_ = FreeTcpPort();
      std::vector<std::string> argv = {binary,
                                       "--socket",
                                       socket,
                                       "--pool-size",
                                       f.pool,
                                       "--metrics-port",
                                       std::to_string(port_),
                                       "--ssd-io-workers",
                                       std::to_string(f.io_workers),
                                       "--ssd-queue-depth",
                                       std::to_string(f.queue_depth),
                                       "--log-level",
                                       "info"};
      argv.insert(argv.end(), f.extra.begin(), f.extra.end());
      if (f.ssd) {
        for (const std::string& a :
             {std::string("--ssd-cache-path"), ssd_path, std::string("--ssd-cache-capacity"),
              f.ssd_capacity, std::string("--ssd-shards"), std::to_string(f.shards)}) {
          argv.push_back(a);
        }
      }
      proc_ = std::make_unique<Proc>("orbitkv-cache-manager", argv);
      if (!proc_->started()) {
        error_ = proc_->error();
        return;
      }
      if (proc_->WaitOutput("orbitkv-cache-manager ready", 30s)) {
        error_.clear();
        return;
      }
      error_ = "not ready (" + DescribeStatus(proc_->WaitExit(100ms)) + "): " + proc_->Tail();
      // Someone may have taken the port between our probe and the bind: retry.
      if (proc_->Output().find("--metrics-port") == std::string::npos) return;
    }
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  pid_t pid() const { return proc_->pid(); }
  int port() const { return port_; }
  const std::string& socket() const { return socket_; }
  Proc& proc() { return *proc_; }
  bool Running() { return proc_->Running(); }
  bool stopped_by_test() const { return stopped_by_test_; }

  std::optional<Metrics> Scrape(std::string* error) { return integration::Scrape(port_, error); }

  // Polls /metrics until every gauge in `names` reads 0.
  ::testing::AssertionResult GaugesReachZero(const std::vector<std::string>& names,
                                             std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string last;
    for (;;) {
      std::string err;
      std::optional<Metrics> m = Scrape(&err);
      bool zero = m.has_value();
      if (m) {
        for (const std::string& n : names) {
          std::optional<double> v = m->Get(n);
          zero = zero && v.has_value() && *v == 0;
        }
        last = Describe(*m, names);
      } else {
        last = "scrape failed: " + err;
      }
      if (zero) return ::testing::AssertionSuccess();
      if (Clock::now() >= deadline) {
        return ::testing::AssertionFailure()
               << "gauges not back to 0 after " << timeout.count() << " ms:" << last;
      }
      std::this_thread::sleep_for(50ms);
    }
  }

  // Polls /metrics until gauge `name` reads at least `min`.
  bool WaitGaugeAtLeast(const std::string& name, double min, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    do {
      std::string err;
      std::optional<Metrics> m = Scrape(&err);
      if (m && m->Get(name).value_or(0) >= min) return true;
    } while (Clock::now() < deadline);
    return false;
  }

  // SIGTERM; the Manager must exit 0 (and log a clean shutdown) in time.
  ::testing::AssertionResult Stop() {
    stopped_by_test_ = true;
    proc_->Signal(SIGTERM);
    std::optional<int> st = proc_->WaitExit(30s);
    if (!st || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
      return ::testing::AssertionFailure() << "Manager did not exit 0 on SIGTERM ("
                                           << DescribeStatus(st) << "): " << proc_->Tail();
    }
    if (!proc_->WaitOutput("shutdown complete", 2s)) {
      return ::testing::AssertionFailure()
             << "no 'shutdown complete' in the log: " << proc_->Tail();
    }
    return ::testing::AssertionSuccess();
  }
  void Kill() {
    stopped_by_test_ = true;
    proc_->Signal(SIGKILL);
    proc_->WaitExit(10s);
  }

 private:
  std::string socket_;
  int port_ = 0;
  std::unique_ptr<Proc> proc_;
  std::string error_;
  bool stopped_by_test_ = false;
};

}  // namespace orbitkv::integration
