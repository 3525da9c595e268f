#include "protocol/server.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "orbitkv/logging.h"

namespace orbitkv::protocol {
namespace {

constexpr int kListenBacklog = 128;
// How long the acceptor backs off when accept fails for lack of resources.
constexpr int kAcceptBackoffMs = 100;

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
  if (rc == 0) return Status::AlreadyExists("a server is already listening on " + path);
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
      if (!writer_.joinable()) writer_ = std::thread([this] { WriterLoop(); });
    }
  }
  if (overflow) {
    Close();  // the client stopped reading: its replies cannot be delivered
    return;
  }
  outbox_cv_.notify_one();
}

void Session::WriterLoop() {
  while (true) {
    std::vector<uint8_t> frame;
    {
      std::unique_lock<std::mutex> l(outbox_mu_);
      outbox_cv_.wait(l, [&] { return writer_stop_ || !outbox_.empty(); });
      if (outbox_.empty()) return;
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

SocketServer::SocketServer(ServerOptions options, SessionHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

SocketServer::~SocketServer() { Stop(); }

Result<std::unique_ptr<SocketServer>> SocketServer::Start(ServerOptions options,
                                                          SessionHandler* handler) {
  if (handler == nullptr) return Status::InvalidArgument("SocketServer needs a handler");
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
  try {
    server->acceptor_ = std::thread(&SocketServer::AcceptLoop, server.get());
  } catch (const std::system_error& e) {
    return fail(Status::Internal(std::string("cannot start the accept thread: ") + e.what()));
  }
  OKV_LOG_INFO("listening on {}", path);
  return server;
}

void SocketServer::Stop() {
  std::lock_guard stop_lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true, std::memory_order_release);
  if (acceptor_.joinable()) {
    Wake(wake_fd_.get());
    acceptor_.join();
  }
  listen_fd_.Reset();
  // Remove the socket file only if it is still the one we bound.
  struct stat st {};
  if (::lstat(options_.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == sock_dev_ &&
      st.st_ino == sock_ino_) {
    ::unlink(options_.path.c_str());
  }
  std::vector<Conn> conns;
  {
    std::lock_guard lock(mu_);
    conns.reserve(conns_.size());
    for (auto& [id, conn] : conns_) conns.push_back(std::move(conn));
    conns_.clear();
    finished_.clear();
  }
  for (Conn& c : conns) c.session->Close();
  for (Conn& c : conns) {
    if (c.reader.joinable()) c.reader.join();
  }
}

ServerStats SocketServer::Stats() const {
  ServerStats s;
  s.accepted = accepted_.load(std::memory_order_relaxed);
  s.rejected_peer = rejected_peer_.load(std::memory_order_relaxed);
  s.rejected_full = rejected_full_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  s.active = active_;
  return s;
}

void SocketServer::AcceptLoop() {
  const int lfd = listen_fd_.get();
  const int wfd = wake_fd_.get();
  for (;;) {
    pollfd pfd[2] = {{lfd, POLLIN, 0}, {wfd, POLLIN, 0}};
    if (::poll(pfd, 2, -1) < 0) {
      if (errno == EINTR) continue;
      OKV_LOG_ERROR("poll on {} failed: {}", options_.path, std::strerror(errno));
      ::poll(&pfd[1], 1, kAcceptBackoffMs);
      continue;
    }
    if (pfd[1].revents != 0) {
      uint64_t v;
      while (::read(wfd, &v, sizeof(v)) < 0 && errno == EINTR) {
      }
      Reap();
      if (stopping_.load(std::memory_order_acquire)) return;
    }
    if (pfd[0].revents == 0) continue;
    for (;;) {
      const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        Admit(UniqueFd(c));
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // EMFILE, ENFILE, ENOBUFS, ENOMEM: back off (Stop still wakes us).
      OKV_LOG_WARN("accept on {} failed: {}", options_.path, std::strerror(errno));
      pollfd wake{wfd, POLLIN, 0};
      ::poll(&wake, 1, kAcceptBackoffMs);
      break;
    }
  }
}

void SocketServer::Admit(UniqueFd fd) {
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
    return;
  }
  timeval tv{};
  tv.tv_sec = options_.send_timeout.count() / 1000;
  tv.tv_usec = (options_.send_timeout.count() % 1000) * 1000;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    OKV_LOG_WARN("SO_SNDTIMEO failed: {}", std::strerror(errno));
  }
  std::lock_guard lock(mu_);
  if (active_ >= options_.max_connections) {
    rejected_full_.fetch_add(1, std::memory_order_relaxed);
    OKV_LOG_WARN("refused connection on {} from pid {}: {} connections open (the limit)",
                 options_.path, cred.pid, options_.max_connections);
    return;
  }
  const uint64_t id = next_session_id_++;
  auto session = std::make_shared<Session>(id, std::move(fd), cred.pid, cred.uid, cred.gid);
  // Counted before the reader starts, so that a peer which saw its first
  // reply also sees itself counted.
  ++active_;
  accepted_.fetch_add(1, std::memory_order_relaxed);
  try {
    std::thread reader(&SocketServer::ReadLoop, this, session);
    conns_.emplace(id, Conn{std::move(session), std::move(reader)});
  } catch (const std::system_error& e) {
    --active_;
    accepted_.fetch_sub(1, std::memory_order_relaxed);
    OKV_LOG_ERROR("cannot start a reader thread for pid {}: {}", cred.pid, e.what());
  }
}

void SocketServer::ReadLoop(std::shared_ptr<Session> session) {
  handler_->OnOpen(*session);
  while (!session->closed()) {
    Result<Frame> frame =
        RecvFrame(session->fd_.get(), options_.max_frame_payload, options_.max_fds_per_frame);
    if (!frame.ok()) {
      if (!frame.status().IsCancelled() && !session->closed()) {
        OKV_LOG_WARN("session {} (pid {}): {}; closing it", session->id(), session->peer_pid(),
                     frame.status().ToString());
      }
      break;
    }
    handler_->OnFrame(*session, std::move(frame).value());
  }
  session->Close();
  {
    std::lock_guard lock(mu_);
    --active_;
  }
  handler_->OnClose(*session);
  {
    std::lock_guard lock(mu_);
    finished_.push_back(session->id());
  }
  Wake(wake_fd_.get());
}

void SocketServer::Reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard lock(mu_);
    for (uint64_t id : finished_) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      done.push_back(std::move(it->second.reader));
      conns_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) {
    if (t.joinable()) t.join();
  }
}

}  // namespace orbitkv::protocol
