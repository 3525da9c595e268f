#include "workload/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace orbitkv::demo {

Result<Child> Child::Spawn(const std::vector<std::string>& argv, const SpawnOptions& o) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The child's environment, built before fork: ours with o.env set over it.
  std::vector<std::string> env_store;
  std::vector<char*> envp;
  if (!o.env.empty()) {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view cur(*e);
      const std::string_view name = cur.substr(0, cur.find('='));
      bool replaced = false;
      for (const std::string& set : o.env) replaced |= set.substr(0, set.find('=')) == name;
      if (!replaced) env_store.emplace_back(cur);
    }
    env_store.insert(env_store.end(), o.env.begin(), o.env.end());
    for (std::string& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::IOError("fork", errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    if (o.own_process_group) ::setpgid(0, 0);
    if (o.stdout_fd >= 0) ::dup2(o.stdout_fd, STDOUT_FILENO);
    if (o.stderr_fd >= 0) ::dup2(o.stderr_fd, STDERR_FILENO);
    for (int fd : o.inherit_fds) ::fcntl(fd, F_SETFD, 0);
    if (envp.empty()) {
      ::execv(args[0], args.data());
    } else {
      ::execve(args[0], args.data(), envp.data());
    }
    const char* msg = ": exec failed: ";
    (void)!::write(STDERR_FILENO, program_invocation_short_name,
                   std::strlen(program_invocation_short_name));
    (void)!::write(STDERR_FILENO, msg, std::strlen(msg));
    (void)!::write(STDERR_FILENO, args[0], std::strlen(args[0]));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  Child c;
  c.pid_ = pid;
  return c;
}

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    if (running()) Stop(SIGKILL, std::chrono::milliseconds(0));
    pid_ = o.pid_;
    status_ = o.status_;
    o.pid_ = -1;
  }
  return *this;
}

Child::~Child() {
  if (running()) Stop(SIGKILL, std::chrono::milliseconds(0));
}

bool Child::Poll(int* wait_status) {
  if (pid_ <= 0) {
    if (wait_status) *wait_status = status_;
    return true;
  }
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = st;
    pid_ = -1;
    if (wait_status) *wait_status = st;
    return true;
  }
  return false;
}

void Child::Signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int Child::Stop(int sig, std::chrono::milliseconds timeout) {
  int st = 0;
  if (Poll(&st)) return st;
  ::kill(pid_, sig);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Poll(&st)) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (Poll(&st)) return st;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  status_ = st;
  pid_ = -1;
  return st;
}

int Child::Wait(std::chrono::milliseconds timeout) {
  int st = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Poll(&st)) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Stop(SIGTERM, std::chrono::seconds(5));
}

std::string DescribeWaitStatus(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    return "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) +
           ")";
  }
  return "ended with wait status " + std::to_string(st);
}

bool ExitedZero(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

Result<uint16_t> PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int e = errno;
    ::close(fd);
    return Status::IOError("bind 127.0.0.1:0", e);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

bool SocketAccepts(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return false;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace orbitkv::demo
