#include "workload/manager_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "workload/machine.h"

namespace orbitkv::demo {

std::string TailLines(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "    " + all[i] + "\n";
  return out;
}

Result<std::string> FindManagerBinary(const std::string& explicit_path) {
  std::string manager = explicit_path;
  if (manager.empty()) {
    const char* env = std::getenv("ORBITKV_MANAGER_BINARY");
    manager = env && *env ? env : SelfDir() + "/../server/orbitkv-cache-manager";
  }
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(manager, ec);
  if (!ec) manager = p.string();
  if (::access(manager.c_str(), X_OK) != 0) {
    return Status::NotFound("no Manager binary at " + manager +
                            " (build orbitkv-cache-manager, or pass --manager / "
                            "ORBITKV_MANAGER_BINARY)");
  }
  return manager;
}

Result<RunningManager> StartManager(const ManagerLaunch& launch) {
  auto interrupted = [&] { return launch.interrupted && launch.interrupted->load(); };
  for (int attempt = 0;; ++attempt) {
    uint16_t port = launch.metrics_port;
    if (port == 0) {
      ORBITKV_ASSIGN_OR_RETURN(port, PickFreePort());
    }
    int log_fd = ::open(launch.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return Status::IOError("cannot write " + launch.log_path + ": " + std::strerror(errno),
                             errno);
    }
    std::vector<std::string> argv = {launch.binary};
    argv.insert(argv.end(), launch.args.begin(), launch.args.end());
    argv.insert(argv.end(), {"--socket", launch.socket, "--metrics-port", std::to_string(port)});
    SpawnOptions so;
    so.stdout_fd = log_fd;
    so.stderr_fd = log_fd;
    so.own_process_group = true;
    so.env = launch.env;
    Result<Child> c = Child::Spawn(argv, so);
    ::close(log_fd);
    if (!c.ok()) return c.status();
    RunningManager m;
    m.child = std::move(c).value();
    m.metrics_port = port;
    const auto deadline = std::chrono::steady_clock::now() + launch.ready_timeout;
    int st = 0;
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline && !interrupted()) {
      if (m.child.Poll(&st)) {
        exited = true;
        break;
      }
      if (SocketAccepts(launch.socket)) return m;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (interrupted()) {
      m.child.Stop(SIGTERM, std::chrono::seconds(10));
      return Status::Cancelled("interrupted while the Manager started");
    }
    if (exited) {
      const std::string tail = TailLines(launch.log_path, 5);
      // An ephemeral port picked here may have been taken meanwhile: try another.
      if (launch.metrics_port == 0 && attempt < 2 &&
          tail.find("--metrics-port") != std::string::npos)
        continue;
      return Status::Unavailable("the Manager " + DescribeWaitStatus(st) + " before serving " +
                                 launch.socket + "; last lines of " + launch.log_path + ":\n" +
                                 tail);
    }
    m.child.Stop(SIGKILL, std::chrono::seconds(1));
    return Status::DeadlineExceeded("the Manager did not serve " + launch.socket + " within " +
                                    std::to_string(launch.ready_timeout.count()) + " s; see " +
                                    launch.log_path);
  }
}

}  // namespace orbitkv::demo
