#include "protocol/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "common/thread_name.h"
#include "orbitkv/logging.h"
#include "protocol/wire.h"

namespace orbitkv::protocol {
namespace {

constexpr int kListenBacklog = 128;
// How long the acceptor backs off when accept fails for lack of resources.
constexpr int kAcceptBackoffMs = 100;
// Event-loop tick: timeouts are checked this often.
constexpr int kTickMs = 100;
// The most bytes the loop reads from one connection before serving others.
constexpr size_t kReadSlice = 4u << 20;
constexpr uint64_t kListenToken = ~0ull;
constexpr uint64_t kWakeToken = ~0ull - 1;

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

Result<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty()) return Status::InvalidArgument("socket path is empty");
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is longer than " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

void Wake(int event_fd) {
  const uint64_t one = 1;
  // An eventfd write fails only when the counter would overflow, and then a
  // wakeup is pending anyway.
  ssize_t n;
  do {
    n = ::write(event_fd, &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
}

void WarnIfParentUnsafe(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  struct stat st {};
  if (::stat(parent.c_str(), &st) != 0) return;  // bind will report it
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
    OKV_LOG_WARN(
        "socket directory {} is world-writable without the sticky bit: another user could "
        "replace the socket; use a private directory",
        parent.string());
  }
}

// Clears the way for bind: nothing there, or a stale socket (removed).
Status PreparePath(const std::string& path, const sockaddr_un& addr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::IOError("lstat " + path, errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Status::FailedPrecondition(path + " exists and is not a socket; refusing to replace it");
  }
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe) return Status::IOError("socket(AF_UNIX)", errno);
  int rc;
  do {
    rc = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    std::string who;
    if (::getsockopt(probe.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      who = " (uid " + std::to_string(cred.uid) + ", pid " + std::to_string(cred.pid) + ")";
      if (cred.uid != ::geteuid()) {
        who += ": another user's process holds the path; stop it or use another --socket";
      }
    }
    return Status::AlreadyExists("a server is already listening on " + path + who);
  }
  if (errno != ECONNREFUSED && errno != ENOENT) {
    return Status::FailedPrecondition("cannot tell whether socket " + path +
                                      " is stale: " + std::strerror(errno));
  }
  OKV_LOG_INFO("removing stale socket {}", path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::IOError("unlink stale socket " + path, errno);
  }
  return Status::OK();
}

}  // namespace

Status EnsurePrivateDirectory(const std::string& dir, bool create) {
  if (create && ::mkdir(dir.c_str(), S_IRWXU) != 0 && errno != EEXIST) {
    return Status::IOError("mkdir " + dir, errno);
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound("socket directory " + dir + " does not exist");
    return Status::IOError("lstat " + dir, errno);
  }
  const uid_t self = ::geteuid();
  if (S_ISLNK(st.st_mode)) {
    return Status::PermissionDenied("socket directory " + dir + " is a symlink (owned by uid " +
                                    std::to_string(st.st_uid) +
                                    "); refusing it: remove it or pass --socket");
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::PermissionDenied("socket directory " + dir + " is not a directory");
  }
  if (st.st_uid != self) {
    return Status::PermissionDenied("socket directory " + dir + " is owned by uid " +
                                    std::to_string(st.st_uid) + ", not " + std::to_string(self) +
                                    ": another user may be squatting it to impersonate the "
                                    "Manager; remove it or pass --socket");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::PermissionDenied("socket directory " + dir + " has mode " + mode +
                                    ": only its owner may use it (chmod 0700 " + dir + ")");
  }
  return Status::OK();
}

// ---- Session ------------------------------------------------------------------

Session::Session(uint64_t id, UniqueFd fd, pid_t pid, uid_t uid, gid_t gid)
    : id_(id), fd_(std::move(fd)), peer_pid_(pid), peer_uid_(uid), peer_gid_(gid) {}

Session::~Session() {
  {
    std::lock_guard<std::mutex> l(outbox_mu_);
    writer_stop_ = true;
  }
  outbox_cv_.notify_all();
  // The writer never holds a reference, so the last one is never dropped on it.
  if (writer_.joinable()) writer_.join();
}

void Session::SendAsync(std::vector<uint8_t> payload) {
  if (closed()) return;
  bool overflow = false;
  {
    std::lock_guard<std::mutex> l(outbox_mu_);
    if (writer_stop_) return;
    if (outbox_.size() >= kMaxQueuedFrames) {
      overflow = true;
    } else {
      outbox_.push_back(std::move(payload));
      if (!writer_running_) {
        // A writer that ran out of work has returned (or is returning) from
        // WriterLoop without touching outbox_mu_ again: joining it here is brief.
        if (writer_.joinable()) writer_.join();
        writer_running_ = true;
        writer_ = std::thread([this] { WriterLoop(); });
      }
    }
  }
  if (overflow) {
    Close();  // the client stopped reading: its replies cannot be delivered
    return;
  }
  outbox_cv_.notify_one();
}

void Session::WriterLoop() {
  SetThreadName("okv-send");
  while (true) {
    std::vector<uint8_t> frame;
    {
      std::unique_lock<std::mutex> l(outbox_mu_);
      outbox_cv_.wait_for(l, kWriterLinger, [&] { return writer_stop_ || !outbox_.empty(); });
      if (outbox_.empty()) {
        writer_running_ = false;  // SendAsync starts another when needed
        return;
      }
      frame = std::move(outbox_.front());
      outbox_.pop_front();
    }
    if (!Send(frame).ok()) {
      std::lock_guard<std::mutex> l(outbox_mu_);
      outbox_.clear();  // Send closed the session; nothing more can be delivered
    }
  }
}

Status Session::Send(std::span<const uint8_t> payload, std::span<const int> fds) {
  if (closed()) return Status::Cancelled("session closed");
  std::lock_guard lock(send_mu_);
  if (closed()) return Status::Cancelled("session closed");
  Status st = SendFrame(fd_.get(), payload, fds);
  if (!st.ok()) {
    const bool was_closed = closed();
    Close();
    if (was_closed) return Status::Cancelled("session closed");
    return st.WithContext("session " + std::to_string(id_));
  }
  return st;
}

void Session::Close() {
  if (!closed_.exchange(true, std::memory_order_acq_rel)) {
    // Wakes the reader (recvmsg returns 0) and any sender blocked in sendmsg.
    ::shutdown(fd_.get(), SHUT_RDWR);
  }
}

// ---- SocketServer ------------------------------------------------------------------

Status ServerOptions::Validate() const {
  if (max_connections == 0) return Status::InvalidArgument("max connections must be > 0");
  if (max_connections_per_uid == 0) {
    return Status::InvalidArgument("max connections per uid must be > 0");
  }
  if (worker_threads == 0) return Status::InvalidArgument("worker threads must be > 0");
  if (max_buffered_bytes < max_frame_payload) {
    return Status::InvalidArgument("the request buffer cap (" + std::to_string(max_buffered_bytes) +
                                   " bytes) is below the frame limit (" +
                                   std::to_string(max_frame_payload) + " bytes)");
  }
  return Status::OK();
}

// The aggregate buffer budget. Shared with the frames that hold part of it,
// which may outlive the server.
struct SocketServer::Budget {
  std::mutex mu;
  uint64_t used = 0;  // guarded by mu
  const uint64_t cap;
  const int wake_fd;  // the loop's eventfd; written while the server lives
  std::atomic<bool> alive{true};
  Budget(uint64_t c, int w) : cap(c), wake_fd(w) {}

  bool TryTake(uint64_t n) {
    std::lock_guard l(mu);
    if (used + n > cap) return false;
    used += n;
    return true;
  }
  void Give(uint64_t n) {
    {
      std::lock_guard l(mu);
      used -= n;
      // Under mu, so Stop (which clears alive under mu) cannot close the
      // eventfd meanwhile.
      if (alive.load(std::memory_order_relaxed)) Wake(wake_fd);
    }
  }
  uint64_t Used() {
    std::lock_guard l(mu);
    return used;
  }
};

struct SocketServer::Conn {
  std::shared_ptr<Session> session;
  FrameReader reader;
  std::shared_ptr<void> lease;  // budget of the frame being read
  int64_t frame_start_ns = 0;   // when the current frame's first byte (or grant) came
  bool waiting = false;         // in budget_waiters_
  Conn(std::shared_ptr<Session> s, const ServerOptions& o)
      : session(std::move(s)), reader(o.max_frame_payload, o.max_fds_per_frame) {}
};

SocketServer::SocketServer(ServerOptions options, SessionHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

SocketServer::~SocketServer() { Stop(); }

Result<std::unique_ptr<SocketServer>> SocketServer::Start(ServerOptions options,
                                                          SessionHandler* handler) {
  if (handler == nullptr) return Status::InvalidArgument("SocketServer needs a handler");
  ORBITKV_RETURN_IF_ERROR(options.Validate());
  ORBITKV_ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(options.path));
  const std::string path = options.path;
  WarnIfParentUnsafe(path);
  ORBITKV_RETURN_IF_ERROR(PreparePath(path, addr));

  std::unique_ptr<SocketServer> server(new SocketServer(std::move(options), handler));
  server->listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!server->listen_fd_) return Status::IOError("socket(AF_UNIX)", errno);
  const int lfd = server->listen_fd_.get();
  // The socket file takes the socket inode's mode (less the umask) at bind, so
  // fchmod before bind creates it 0600 with no window where it is wider. This
  // avoids umask(), which is process-wide and would race with other threads
  // creating files.
  if (::fchmod(lfd, S_IRUSR | S_IWUSR) != 0) return Status::IOError("fchmod socket", errno);
  if (::bind(lfd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EADDRINUSE) return Status::AlreadyExists("socket path " + path + " was taken");
    return Status::IOError("bind " + path, errno);
  }
  // From here on the file is ours; remove it on failure.
  auto fail = [&](Status st) {
    ::unlink(path.c_str());
    return st;
  };
  if (::chmod(path.c_str(), S_IRUSR | S_IWUSR) != 0)
    return fail(Status::IOError("chmod " + path, errno));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return fail(Status::IOError("lstat " + path, errno));
  server->sock_dev_ = st.st_dev;
  server->sock_ino_ = st.st_ino;
  if (::listen(lfd, kListenBacklog) != 0) return fail(Status::IOError("listen " + path, errno));
  server->wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->wake_fd_) return fail(Status::IOError("eventfd", errno));
  server->epoll_fd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!server->epoll_fd_) return fail(Status::IOError("epoll_create1", errno));
  server->spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenToken;
  if (::epoll_ctl(server->epoll_fd_.get(), EPOLL_CTL_ADD, lfd, &ev) != 0) {
    return fail(Status::IOError("epoll_ctl(listen socket)", errno));
  }
  ev.data.u64 = kWakeToken;
  if (::epoll_ctl(server->epoll_fd_.get(), EPOLL_CTL_ADD, server->wake_fd_.get(), &ev) != 0) {
    return fail(Status::IOError("epoll_ctl(eventfd)", errno));
  }
  server->budget_ =
      std::make_shared<Budget>(server->options_.max_buffered_bytes, server->wake_fd_.get());
  try {
    for (uint32_t i = 0; i < server->options_.worker_threads; ++i) {
      server->workers_.emplace_back(&SocketServer::WorkerThread, server.get());
    }
    server->loop_ = std::thread(&SocketServer::LoopThread, server.get());
  } catch (const std::system_error& e) {
    server->Stop();
    return fail(Status::Internal(std::string("cannot start the server threads: ") + e.what()));
  }
  OKV_LOG_INFO("listening on {}", path);
  return server;
}

void SocketServer::Stop() {
  std::lock_guard stop_lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true, std::memory_order_release);
  if (loop_.joinable()) {
    Wake(wake_fd_.get());
    loop_.join();  // the loop closes every connection on its way out
  }
  {
    std::lock_guard lock(pool_mu_);
    workers_stop_ = true;
  }
  pool_cv_.notify_all();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();  // workers finish every queued task (OnClose) first
  }
  workers_.clear();
  listen_fd_.Reset();
  // Remove the socket file only if it is still the one we bound.
  struct stat st {};
  if (::lstat(options_.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == sock_dev_ &&
      st.st_ino == sock_ino_) {
    ::unlink(options_.path.c_str());
  }
  if (budget_) {
    std::lock_guard l(budget_->mu);
    budget_->alive.store(false, std::memory_order_relaxed);
  }
}

ServerStats SocketServer::Stats() const {
  ServerStats s;
  s.accepted = accepted_.load(std::memory_order_relaxed);
  s.rejected_peer = rejected_peer_.load(std::memory_order_relaxed);
  s.rejected_full = rejected_full_.load(std::memory_order_relaxed);
  s.rejected_frame = rejected_frame_.load(std::memory_order_relaxed);
  s.closed_timeout = closed_timeout_.load(std::memory_order_relaxed);
  s.active = active_.load(std::memory_order_relaxed);
  s.waiting_for_buffer = waiting_.load(std::memory_order_relaxed);
  s.frames_polled = frames_polled_.load(std::memory_order_relaxed);
  s.buffered_bytes = budget_ ? budget_->Used() : 0;
  return s;
}

void SocketServer::Arm(const Session& session, uint32_t events) {
  epoll_event ev{};
  ev.events = events | EPOLLONESHOT;
  ev.data.u64 = session.id();
  // ENOENT: the loop closed the connection meanwhile; nothing to arm.
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, session.fd_.get(), &ev);
}

void SocketServer::Enqueue(const std::shared_ptr<Session>& session, Session::Task task) {
  {
    std::lock_guard lock(pool_mu_);
    session->tasks_.push_back(std::move(task));
    if (session->scheduled_) return;
    session->scheduled_ = true;
    ready_.push_back(session);
    ready_count_.store(ready_.size(), std::memory_order_release);
    // A spinning worker takes a lone task without a wake.
    if (spinners_ > 0 && ready_.size() == 1) return;
  }
  pool_cv_.notify_one();
}

void SocketServer::WorkerThread() {
  SetThreadName("okv-req");
  std::unique_lock lock(pool_mu_);
  bool ran = false;  // a task ran since this worker last slept
  for (;;) {
    // ServerOptions::worker_spin: poll for the next task before sleeping.
    // spinners_ changes only under pool_mu_, so Enqueue (which skips its
    // notify for a spinner) never misses a worker that went to sleep.
    if (ran && ready_.empty() && !workers_stop_ && options_.worker_spin.count() > 0 &&
        spinners_ == 0) {
      spinners_ = 1;
      lock.unlock();
      const auto end = std::chrono::steady_clock::now() + options_.worker_spin;
      while (ready_count_.load(std::memory_order_acquire) == 0 &&
             std::chrono::steady_clock::now() < end) {
        // Yield, not pause: where runnable threads outnumber cores, a pausing
        // spinner keeps its core for its whole window while the thread it
        // waits for (the loop, woken by the frame) waits for a core.
        ::sched_yield();
      }
      lock.lock();
      spinners_ = 0;
    }
    ran = false;
    pool_cv_.wait(lock, [&] { return workers_stop_ || !ready_.empty(); });
    if (ready_.empty()) return;  // stopping, and nothing left to run
    ran = true;
    std::shared_ptr<Session> session = std::move(ready_.front());
    ready_.pop_front();
    ready_count_.store(ready_.size(), std::memory_order_release);
    Session::Task task = std::move(session->tasks_.front());
    session->tasks_.pop_front();
    lock.unlock();
    switch (task.kind) {
      case Session::Task::kOpen:
        handler_->OnOpen(*session);
        break;
      case Session::Task::kFrame:
        task.frame.dispatched_ns = SteadyNowNs();
        handler_->OnFrame(*session, std::move(task.frame));
        task.frame = Frame{};  // returns its budget before the next frame is read
        session->idle_since_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
        session->in_handler_.store(false, std::memory_order_release);
        Arm(*session, EPOLLIN);
        break;
      case Session::Task::kClose:
        active_.fetch_sub(1, std::memory_order_relaxed);  // closed before OnClose sees it
        handler_->OnClose(*session);
        break;
    }
    lock.lock();
    if (session->tasks_.empty()) {
      session->scheduled_ = false;
    } else {
      ready_.push_back(std::move(session));  // behind the others: one task per turn
      ready_count_.store(ready_.size(), std::memory_order_release);
    }
  }
}

void SocketServer::LoopThread() {
  SetThreadName("okv-epoll");
  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  int64_t next_tick = SteadyNowNs();
  // ServerOptions::worker_spin: after events (a frame read, a handler's
  // buffer returned, which comes with its reply) the loop polls without
  // blocking for this long, so that a connection's next frame, which often
  // follows its reply within microseconds, needs no wake of this thread.
  // Idle, it blocks: one window after the last event. It yields between
  // polls, as a spinning worker does.
  const int64_t spin_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.worker_spin).count();
  int64_t spin_until_ns = 0;
  while (!stopping_.load(std::memory_order_acquire)) {
    const bool spinning = spin_ns > 0 && SteadyNowNs() < spin_until_ns;
    const int n = ::epoll_wait(epoll_fd_.get(), events, kMaxEvents, spinning ? 0 : kTickMs);
    if (n > 0 && spin_ns > 0) spin_until_ns = SteadyNowNs() + spin_ns;
    if (n == 0 && spinning) ::sched_yield();
    polling_ = spinning;
    if (n < 0 && errno != EINTR) {
      OKV_LOG_ERROR("epoll_wait on {} failed: {}", options_.path, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(kAcceptBackoffMs));
      continue;
    }
    bool woke = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == kListenToken) {
        AcceptAll();
      } else if (token == kWakeToken) {
        uint64_t v;
        while (::read(wake_fd_.get(), &v, sizeof(v)) < 0 && errno == EINTR) {
        }
        woke = true;
      } else {
        OnReadable(token);
      }
    }
    if (woke && !budget_waiters_.empty()) GrantWaiters();
    if (SteadyNowNs() >= next_tick) {
      next_tick = SteadyNowNs() + int64_t{kTickMs} * 1000000;
      CheckTimeouts();
    }
  }
  std::vector<uint64_t> ids;
  ids.reserve(conns_.size());
  for (auto& [id, conn] : conns_) ids.push_back(id);
  for (uint64_t id : ids) CloseConn(id);
}

void SocketServer::AcceptAll() {
  const int lfd = listen_fd_.get();
  for (int i = 0; i < 64; ++i) {
    const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      Admit(UniqueFd(c));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    const int err = errno;
    if ((err == EMFILE || err == ENFILE) && spare_fd_) {
      // Give the spare descriptor up to take the connection and tell it why.
      spare_fd_.Reset();
      UniqueFd refused(::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (refused) {
        rejected_full_.fetch_add(1, std::memory_order_relaxed);
        const std::vector<uint8_t> why = EncodeError(
            0, Status::ResourceExhausted("the Manager is out of file descriptors (RLIMIT_NOFILE); "
                                         "connection refused"));
        SendFrame(refused.get(), why).IgnoreError("the connection is refused either way");
      }
      refused.Reset();
      spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      OKV_LOG_WARN("accept on {} failed: {}; refused a connection", options_.path,
                   std::strerror(err));
      return;
    }
    // ENOBUFS, ENOMEM: back off (the listen socket stays readable).
    OKV_LOG_WARN("accept on {} failed: {}", options_.path, std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(kAcceptBackoffMs));
    return;
  }
}

void SocketServer::Admit(UniqueFd fd) {
  // Reasons go out without blocking the loop: a peer that does not read them
  // just sees the connection close.
  auto refuse = [&](const Status& why) {
    const std::vector<uint8_t> bytes = EncodeError(0, why);
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
    SendFrame(fd.get(), bytes).IgnoreError("the connection is refused either way");
  };
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    OKV_LOG_WARN("SO_PEERCRED on {} failed: {}; closing the connection", options_.path,
                 std::strerror(errno));
    rejected_peer_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uid_t self = ::geteuid();
  if (cred.uid != self && cred.uid != 0) {
    rejected_peer_.fetch_add(1, std::memory_order_relaxed);
    OKV_LOG_WARN("refused connection on {} from pid {} uid {} (serving uid {} and root only)",
                 options_.path, cred.pid, cred.uid, self);
    refuse(Status::PermissionDenied("uid " + std::to_string(cred.uid) +
                                    " may not connect: this Manager serves uid " +
                                    std::to_string(self) + " and root only"));
    return;
  }
  if (conns_.size() >= options_.max_connections) {
    rejected_full_.fetch_add(1, std::memory_order_relaxed);
    OKV_LOG_WARN("refused connection on {} from pid {}: {} connections open (the limit)",
                 options_.path, cred.pid, options_.max_connections);
    refuse(Status::ResourceExhausted(std::to_string(options_.max_connections) +
                                     " connections are open, the Manager's limit "
                                     "(--max-connections); connection refused"));
    return;
  }
  uint32_t& mine = per_uid_[cred.uid];
  if (mine >= options_.max_connections_per_uid) {
    rejected_full_.fetch_add(1, std::memory_order_relaxed);
    OKV_LOG_WARN("refused connection on {} from pid {}: uid {} has {} connections open (the limit)",
                 options_.path, cred.pid, cred.uid, mine);
    refuse(Status::ResourceExhausted(
        "uid " + std::to_string(cred.uid) + " has " + std::to_string(mine) +
        " connections open, the Manager's per-uid limit (--max-connections-per-uid); "
        "connection refused"));
    return;
  }
  timeval tv{};
  tv.tv_sec = options_.send_timeout.count() / 1000;
  tv.tv_usec = (options_.send_timeout.count() % 1000) * 1000;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    OKV_LOG_WARN("SO_SNDTIMEO failed: {}", std::strerror(errno));
  }
  const uint64_t id = next_session_id_++;
  auto session = std::make_shared<Session>(id, std::move(fd), cred.pid, cred.uid, cred.gid);
  session->idle_since_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, session->fd_.get(), &ev) != 0) {
    OKV_LOG_ERROR("epoll_ctl(add) for pid {}: {}", cred.pid, std::strerror(errno));
    return;
  }
  ++mine;
  // Counted before OnOpen runs, so that a peer which saw its first reply also
  // sees itself counted.
  active_.fetch_add(1, std::memory_order_relaxed);
  accepted_.fetch_add(1, std::memory_order_relaxed);
  conns_.emplace(id, std::make_unique<Conn>(session, options_));
  Enqueue(session, Session::Task{Session::Task::kOpen, {}});
}

void SocketServer::OnReadable(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  Conn& conn = *it->second;
  Session& session = *conn.session;
  if (conn.waiting) {
    // Armed for EPOLLRDHUP only while waiting for room: the peer left (or the
    // session was closed).
    CloseConn(conn_id);
    return;
  }
  if (session.closed()) {
    CloseConn(conn_id);
    return;
  }
  const bool was_started = conn.reader.started();
  Result<FrameReader::Progress> p = conn.reader.Read(session.fd_.get(), kReadSlice);
  if (!was_started && conn.reader.started()) conn.frame_start_ns = SteadyNowNs();
  if (!p.ok()) {
    if (p.status().code() == StatusCode::kResourceExhausted) {
      rejected_frame_.fetch_add(1, std::memory_order_relaxed);
      Refuse(conn, p.status());
    } else {
      if (!p.status().IsCancelled()) {
        OKV_LOG_WARN("session {} (pid {}): {}; closing it", session.id(), session.peer_pid(),
                     p.status().ToString());
      }
      CloseConn(conn_id);
    }
    return;
  }
  switch (*p) {
    case FrameReader::Progress::kClosed:
      CloseConn(conn_id);
      return;
    case FrameReader::Progress::kWouldBlock:
      Arm(session, EPOLLIN);
      return;
    case FrameReader::Progress::kHeader: {
      const uint64_t need = conn.reader.announced();
      if (budget_waiters_.empty() && budget_->TryTake(need)) {
        conn.lease =
            std::shared_ptr<void>(nullptr, [budget = budget_, need](void*) { budget->Give(need); });
        conn.reader.Grant();
        conn.frame_start_ns = SteadyNowNs();
        // Read on at once: the bytes are likely there.
        OnReadable(conn_id);
        return;
      }
      conn.waiting = true;
      waiting_.fetch_add(1, std::memory_order_relaxed);
      budget_waiters_.push_back(conn_id);
      Arm(session, EPOLLRDHUP);
      return;
    }
    case FrameReader::Progress::kFrame: {
      Frame frame = conn.reader.Take();
      frame.hold = std::move(conn.lease);
      frame.read_ns = SteadyNowNs();
      if (polling_) frames_polled_.fetch_add(1, std::memory_order_relaxed);
      session.in_handler_.store(true, std::memory_order_release);
      // Not armed again until the handler is done with it (WorkerThread).
      Enqueue(conn.session, Session::Task{Session::Task::kFrame, std::move(frame)});
      return;
    }
  }
}

void SocketServer::GrantWaiters() {
  while (!budget_waiters_.empty()) {
    auto it = conns_.find(budget_waiters_.front());
    if (it == conns_.end()) {
      budget_waiters_.pop_front();
      continue;
    }
    Conn& conn = *it->second;
    const uint64_t need = conn.reader.announced();
    if (!budget_->TryTake(need)) return;  // strictly in order: no frame waits forever
    budget_waiters_.pop_front();
    conn.waiting = false;
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    conn.lease =
        std::shared_ptr<void>(nullptr, [budget = budget_, need](void*) { budget->Give(need); });
    conn.reader.Grant();
    conn.frame_start_ns = SteadyNowNs();
    Arm(*conn.session, EPOLLIN);
  }
}

void SocketServer::CheckTimeouts() {
  const int64_t now = SteadyNowNs();
  const int64_t frame_ns = int64_t{options_.frame_timeout.count()} * 1000000;
  const int64_t idle_ns = int64_t{options_.idle_timeout.count()} * 1000000;
  std::vector<std::pair<uint64_t, Status>> expired;
  for (auto& [id, c] : conns_) {
    Conn& conn = *c;
    Session& s = *conn.session;
    if (conn.waiting || s.in_handler_.load(std::memory_order_acquire)) continue;
    if (conn.reader.started()) {
      if (frame_ns > 0 && now - conn.frame_start_ns > frame_ns) {
        expired.emplace_back(
            id, Status::DeadlineExceeded("a frame was begun and not completed within " +
                                         Ms(options_.frame_timeout) +
                                         " (--frame-timeout-ms); connection closed"));
      }
    } else if (idle_ns > 0 && now - s.idle_since_ns_.load(std::memory_order_relaxed) > idle_ns &&
               handler_->MayCloseIdle(s)) {
      expired.emplace_back(
          id, Status::DeadlineExceeded("idle for " + Ms(options_.idle_timeout) +
                                       " without a registered instance (--idle-timeout-ms); "
                                       "connection closed"));
    }
  }
  for (auto& [id, why] : expired) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    closed_timeout_.fetch_add(1, std::memory_order_relaxed);
    OKV_LOG_INFO("session {} (pid {}): {}", id, it->second->session->peer_pid(), why.message());
    Refuse(*it->second, why);
  }
}

void SocketServer::Refuse(Conn& conn, const Status& why) {
  Session& s = *conn.session;
  // Only when no reply is being written (the reason must not land inside
  // another frame) and the socket takes it at once (the loop must not block).
  std::unique_lock lock(s.send_mu_, std::try_to_lock);
  if (lock.owns_lock() && !s.closed()) {
    const std::vector<uint8_t> bytes = EncodeError(0, why);
    std::vector<uint8_t> frame(kFrameHeaderBytes + bytes.size());
    const auto n = static_cast<uint32_t>(bytes.size());
    for (size_t i = 0; i < kFrameHeaderBytes; ++i) frame[i] = static_cast<uint8_t>(n >> (8 * i));
    std::memcpy(frame.data() + kFrameHeaderBytes, bytes.data(), bytes.size());
    ssize_t sent;
    do {
      sent = ::send(s.fd_.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
  }
  if (lock.owns_lock()) lock.unlock();
  CloseConn(s.id());
}

void SocketServer::CloseConn(uint64_t conn_id) {
  auto it = conns_.find(conn_id);
  if (it == conns_.end()) return;
  std::unique_ptr<Conn> conn = std::move(it->second);
  conns_.erase(it);
  Session& s = *conn->session;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, s.fd_.get(), nullptr);
  s.Close();
  if (conn->waiting) {
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    for (auto w = budget_waiters_.begin(); w != budget_waiters_.end(); ++w) {
      if (*w == conn_id) {
        budget_waiters_.erase(w);
        break;
      }
    }
  }
  auto uid = per_uid_.find(s.peer_uid());
  if (uid != per_uid_.end() && --uid->second == 0) per_uid_.erase(uid);
  Enqueue(conn->session, Session::Task{Session::Task::kClose, {}});
  // conn->lease and the partial frame go here, returning their budget.
}

}  // namespace orbitkv::protocol
