#include "protocol/connection.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_name.h"
#include "orbitkv/logging.h"
#include "protocol/wire.h"

namespace orbitkv::protocol {
namespace {

// The most bytes one read of the socket takes before the lock is let go
// (kWouldBlock): a caller spinning past its window while a large reply for
// someone else streams in stops within about this much (the reader thread,
// or the caller's next turn, reads on).
constexpr size_t kReadSlice = 1u << 20;

}  // namespace

ClientConnection::ClientConnection(UniqueFd fd, ClientOptions options)
    : fd_(std::move(fd)),
      options_(std::move(options)),
      frames_(options_.max_frame_payload, options_.max_fds_per_frame) {}

ClientConnection::~ClientConnection() { Close(); }

Result<std::unique_ptr<ClientConnection>> ClientConnection::Connect(const std::string& path,
                                                                    ClientOptions options) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path '" + path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::IOError("socket(AF_UNIX)", errno);
  // Room for a whole large request in the socket (a Query of 8192 keys is
  // 256 KiB): with the default send buffer (net.core.wmem_default, 208 KiB)
  // such a request went out in rounds, each waiting for the Manager's loop to
  // read the last. The kernel grants twice the size asked, capped at twice
  // net.core.wmem_max (416 KiB with Debian's defaults). Best effort.
  constexpr int kSendBuffer = 1 << 20;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &kSendBuffer, sizeof(kSendBuffer));
  int rc;
  // An AF_UNIX connect interrupted while waiting for backlog room has not
  // connected, so retrying is safe.
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == ENOENT || err == ECONNREFUSED) {
      return Status::Unavailable("no OrbitKV server listens on " + path + ": " +
                                 std::strerror(err));
    }
    if (err == EACCES || err == EPERM) {
      return Status::PermissionDenied("connect " + path + ": " + std::strerror(err));
    }
    return Status::IOError("connect " + path, err);
  }
  // Who listens there? Checked before a single byte (or fd) is sent.
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    return Status::IOError("SO_PEERCRED on " + path, errno);
  }
  const uid_t self = ::geteuid();
  if (cred.uid != self && (!options.server_uid || cred.uid != *options.server_uid)) {
    return Status::PermissionDenied(
        "refusing the OrbitKV server on " + path + ": it runs as uid " + std::to_string(cred.uid) +
        " (pid " + std::to_string(cred.pid) + "), not as this process's uid " +
        std::to_string(self) +
        (options.server_uid ? " or the configured server uid " + std::to_string(*options.server_uid)
                            : std::string()) +
        "; nothing was sent. Another user may be squatting the socket path; name uid " +
        std::to_string(cred.uid) + " as the server uid only if you trust it");
  }
  if (!options.reply_id) options.reply_id = PeekEnvelopeId;
  std::unique_ptr<ClientConnection> conn(new ClientConnection(std::move(fd), std::move(options)));
  try {
    conn->reader_ = std::thread(&ClientConnection::ReadLoop, conn.get());
  } catch (const std::system_error& e) {
    return Status::Internal(std::string("cannot start the reader thread: ") + e.what());
  }
  return conn;
}

Result<Frame> ClientConnection::Call(std::span<const uint8_t> request, std::span<const int> fds,
                                     uint64_t id, std::chrono::milliseconds timeout) {
  ORBITKV_RETURN_IF_ERROR(Start(request, fds, id));
  Result<Frame> r = Wait(id, timeout);
  if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded) Abandon(id);
  return r;
}

Status ClientConnection::Start(std::span<const uint8_t> request, std::span<const int> fds,
                               uint64_t id) {
  if (id == 0) return Status::InvalidArgument("envelope id 0 is reserved");
  auto waiter = std::make_shared<Waiter>();
  if (options_.spin_wait.count() > 0) {
    waiter->spin = std::min<std::chrono::nanoseconds>(
        options_.spin_wait + options_.spin_wait_per_kib * (request.size() >> 10),
        std::max<std::chrono::nanoseconds>(options_.spin_wait, options_.max_spin_wait));
  }
  {
    std::lock_guard lock(mu_);
    if (!broken_.ok()) return broken_;
    if (!waiters_.emplace(id, waiter).second) {
      return Status::InvalidArgument("envelope id " + std::to_string(id) +
                                     " is already waiting for a reply");
    }
  }
  // Registered before sending, so that even an immediate reply finds us.
  Status sent;
  {
    std::lock_guard lock(send_mu_);
    sent = SendFrame(fd_.get(), request, fds);
  }
  if (!sent.ok()) {
    std::unique_lock lock(mu_);
    if (sent.IsCancelled()) {
      // The server closed the connection; it may have said why first. The
      // reader gets that reason (queued bytes come before the end of stream).
      broken_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return !broken_.ok(); });
    }
    waiters_.erase(id);
    if (broken_.ok()) {
      lock.unlock();
      // A half-written frame leaves the stream unusable: break the connection
      // (the reader then fails every other waiter too).
      ::shutdown(fd_.get(), SHUT_RDWR);
      return sent;
    }
    return broken_;
  }
  return Status::OK();
}

Result<Frame> ClientConnection::Wait(uint64_t id, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  auto it = waiters_.find(id);
  if (it == waiters_.end()) {
    if (!broken_.ok()) return broken_;
    return Status::InvalidArgument("no request " + std::to_string(id) +
                                   " is waiting for a reply on this connection");
  }
  std::shared_ptr<Waiter> waiter = it->second;
  const auto now = std::chrono::steady_clock::now();
  const auto deadline = now + timeout;
  if (waiter->spin.count() > 0 && !waiter->result.has_value()) {
    // Poll for the reply before sleeping (ClientOptions::spin_wait, longer
    // for a larger request: Start set waiter->spin), reading
    // the socket ourselves when it has bytes and nobody else is reading it.
    // The check is a poll() without the read lock, so that the reader thread
    // (woken by the same bytes) rarely finds the lock held and sleeps on it.
    // Between checks we yield rather than pause: where runnable threads
    // outnumber cores (the Manager's threads beside this engine on a small
    // machine), a pausing spinner keeps its core for its whole window while
    // the thread that is to answer it waits for one.
    const auto spin_end = std::min(deadline, now + waiter->spin);
    lock.unlock();
    spinners_.fetch_add(1, std::memory_order_acq_rel);
    pollfd pfd{fd_.get(), POLLIN, 0};
    while (!waiter->ready.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_end) {
      if (::poll(&pfd, 1, 0) > 0 && read_mu_.try_lock()) {
        const bool open = ReadAvailable(&waiter->ready);
        read_mu_.unlock();
        if (!open) break;  // failed every waiter, this one included
        continue;
      }
      ::sched_yield();
    }
    spinners_.fetch_sub(1, std::memory_order_acq_rel);
    lock.lock();
  }
  while (!waiter->result.has_value()) {
    if (waiter->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
        !waiter->result.has_value()) {
      return Status::DeadlineExceeded("no reply to request " + std::to_string(id) + " within " +
                                      std::to_string(timeout.count()) + " ms");
    }
  }
  Result<Frame> r = std::move(*waiter->result);
  waiters_.erase(id);  // FailAll already cleared every waiter when it broke
  return r;
}

void ClientConnection::Abandon(uint64_t id) {
  std::lock_guard lock(mu_);
  waiters_.erase(id);
}

void ClientConnection::Close() {
  std::lock_guard close_lock(close_mu_);
  {
    std::lock_guard lock(mu_);
    if (broken_.ok()) broken_ = Status::Cancelled("connection closed");
  }
  ::shutdown(fd_.get(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  FailAll(Status::Cancelled("connection closed"));
}

bool ClientConnection::closed() const {
  std::lock_guard lock(mu_);
  return !broken_.ok();
}

void ClientConnection::FailAll(const Status& why) {
  std::lock_guard lock(mu_);
  if (broken_.ok()) broken_ = why;
  broken_cv_.notify_all();
  for (auto& [id, waiter] : waiters_) {
    waiter->result.emplace(broken_);
    waiter->ready.store(true, std::memory_order_release);
    waiter->cv.notify_one();
  }
  waiters_.clear();
}

std::optional<Status> ClientConnection::ClosingReason(std::span<const uint8_t> frame) {
  Result<DecodedMessage> m = DecodeMessage(frame);
  if (!m.ok() || m->id != 0) return std::nullopt;
  const auto* err = std::get_if<ErrorReply>(&m->body);
  if (err == nullptr || err->status.ok()) return std::nullopt;
  return err->status;
}

void ClientConnection::ReadLoop() {
  SetThreadName("okv-client-rd");
  for (;;) {
    // Level-triggered: bytes a spinning caller left unread wake us again.
    pollfd pfd{fd_.get(), POLLIN, 0};
    if (::poll(&pfd, 1, -1) < 0 && errno != EINTR) {
      const int err = errno;
      std::lock_guard lock(read_mu_);
      if (!read_done_) EndStream(Status::IOError("poll on the protocol socket", err));
      return;
    }
    // A caller spinning in Wait reads what came itself (its reply and any
    // frame before it): stand back while one spins, rather than take the read
    // lock from under it (the bytes woke both; the spinner is already
    // running). Bounded by a caller's spin (ClientOptions); a frame the spinner
    // leaves (one after its reply) is read once it stops.
    while (spinners_.load(std::memory_order_acquire) > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    std::lock_guard lock(read_mu_);
    if (!ReadAvailable(nullptr)) return;
  }
}

bool ClientConnection::ReadAvailable(const std::atomic<bool>* mine) {
  while (!read_done_) {
    Result<FrameReader::Progress> p = frames_.Read(fd_.get(), kReadSlice);
    if (!p.ok()) {
      Status why = p.status();
      // FrameReader calls a frame over our limits (size, fds) ResourceExhausted,
      // the code of the server's refusals; here it is a reply the client cannot
      // take, InvalidArgument as RecvFrame called it.
      if (why.code() == StatusCode::kResourceExhausted) {
        why = Status::InvalidArgument(std::string(why.message()));
      }
      EndStream(why.IsCancelled() ? why : why.WithContext("protocol connection broken"));
      break;
    }
    switch (*p) {
      case FrameReader::Progress::kWouldBlock:
        return true;
      case FrameReader::Progress::kClosed:
        EndStream(Status::Cancelled("peer closed"));
        break;
      case FrameReader::Progress::kHeader:
        // The server is trusted (Connect checked its uid) and the length is
        // within max_frame_payload: reserve it at once (pages are touched
        // only as bytes arrive).
        frames_.Grant();
        break;
      case FrameReader::Progress::kFrame:
        if (mine != nullptr) frames_read_by_callers_.fetch_add(1, std::memory_order_relaxed);
        Deliver(frames_.Take());
        // A caller with its reply leaves the rest to the reader thread.
        if (mine != nullptr && mine->load(std::memory_order_acquire)) return true;
        break;
    }
  }
  return false;
}

void ClientConnection::EndStream(const Status& why) {
  read_done_ = true;
  FailAll(why);
  ::shutdown(fd_.get(), SHUT_RDWR);
}

void ClientConnection::Deliver(Frame frame) {
  const std::optional<uint64_t> id = options_.reply_id(frame.payload);
  if (id == 0) {
    if (std::optional<Status> why = ClosingReason(frame.payload)) {
      // The server refuses this connection and closes it.
      EndStream(why->WithContext("the OrbitKV Manager closed the connection"));
      return;
    }
  }
  if (!id.has_value() || *id == 0) {
    OKV_LOG_WARN("dropping a {}-byte reply without a readable envelope id", frame.payload.size());
    return;
  }
  std::lock_guard lock(mu_);
  auto it = waiters_.find(*id);
  if (it == waiters_.end()) {
    // Its caller gave up (timeout); the frame and its fds go away here.
    OKV_LOG_DEBUG("dropping a late reply to request {}", *id);
    return;
  }
  if (it->second->result.has_value()) return;  // a second reply to one id is dropped
  // Wait takes the result and erases the entry.
  it->second->result.emplace(std::move(frame));
  it->second->ready.store(true, std::memory_order_release);
  it->second->cv.notify_one();
}

}  // namespace orbitkv::protocol
