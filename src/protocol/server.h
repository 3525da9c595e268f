// SocketServer: the Manager's end of the engine protocol. Listens on a Unix
// stream socket path, admits peers of the same user (or root), and runs one
// reader thread per connection that hands whole frames (frame.h) to a
// SessionHandler. It knows nothing of the messages inside the frames.
//
// Threads: one accept thread, plus one reader thread per session. For a given
// session, OnOpen, every OnFrame and OnClose run in that order on its reader
// thread; different sessions call the handler concurrently, so the handler
// must be thread-safe. OnFrame should not block for long (the session reads
// nothing meanwhile, so e.g. a CancelRestore would wait): hand long work to a
// worker that replies later with Session::Send.
//
// Security: the socket file is created 0600 and the peer's uid (SO_PEERCRED)
// must be the server's euid or root; both keep other users out even when the
// directory is shared. The path is never followed or replaced unless it is a
// stale socket.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "orbitkv/status.h"
#include "protocol/frame.h"
#include "protocol/unique_fd.h"

namespace orbitkv::protocol {

class SocketServer;

// One client connection. Owned by shared_ptr: the server holds it until the
// connection ends; a handler that replies asynchronously keeps it alive with
// Ref(). Send and Close are thread-safe; the accessors are constant.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(uint64_t id, UniqueFd fd, pid_t pid, uid_t uid, gid_t gid);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const { return id_; }
  pid_t peer_pid() const { return peer_pid_; }  // from SO_PEERCRED at connect
  uid_t peer_uid() const { return peer_uid_; }
  gid_t peer_gid() const { return peer_gid_; }
  std::shared_ptr<Session> Ref() { return shared_from_this(); }

  // Sends one frame; frames from concurrent callers never interleave.
  // Cancelled once the session is closed (also from within OnClose). A failed
  // send closes the session, since the peer may have seen half a frame.
  Status Send(std::span<const uint8_t> payload, std::span<const int> fds = {});
  // Shuts the connection down (both directions): the reader thread ends and
  // OnClose follows. Idempotent; callable from any thread, also OnFrame.
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // Queues a frame (no fds) for this session's own writer thread and returns
  // at once: what worker threads use, so a client that stops reading delays
  // only its own replies. More than kMaxQueuedFrames waiting closes the session.
  void SendAsync(std::vector<uint8_t> payload);
  static constexpr size_t kMaxQueuedFrames = 4096;

 private:
  friend class SocketServer;

  // Constant after construction. The fd stays open until the Session dies, so
  // that its number cannot be reused under a concurrent Send or Close.
  const uint64_t id_;
  const UniqueFd fd_;
  const pid_t peer_pid_;
  const uid_t peer_uid_;
  const gid_t peer_gid_;

  void WriterLoop();

  std::atomic<bool> closed_{false};
  std::mutex send_mu_;  // held across a whole SendFrame

  std::mutex outbox_mu_;
  std::condition_variable outbox_cv_;
  std::deque<std::vector<uint8_t>> outbox_;  // guarded by outbox_mu_
  bool writer_stop_ = false;                 // guarded by outbox_mu_
  std::thread writer_;                       // started by the first SendAsync
};

class SessionHandler {
 public:
  virtual ~SessionHandler() = default;
  virtual void OnOpen(Session& session) {}
  // `frame.fds` are the handler's to keep or drop.
  virtual void OnFrame(Session& session, Frame&& frame) = 0;
  // Called exactly once per session that saw OnOpen, after it can no longer
  // send or receive.
  virtual void OnClose(Session& session) {}
};

struct ServerOptions {
  std::string path;  // socket path (< 108 bytes)
  uint32_t max_connections = 1024;
  uint32_t max_frame_payload = kDefaultMaxFramePayload;
  // A RegisterInstance carries one memfd per host region.
  uint32_t max_fds_per_frame = 4096;
  // A Send that makes no progress for this long fails and closes the session
  // (a client that stops reading must not wedge the Manager's workers).
  std::chrono::milliseconds send_timeout{30000};
};

struct ServerStats {
  uint64_t accepted = 0;       // connections admitted
  uint64_t rejected_peer = 0;  // refused by the SO_PEERCRED check
  uint64_t rejected_full = 0;  // refused at max_connections
  uint64_t active = 0;         // sessions now open
};

class SocketServer {
 public:
  // Creates the socket and starts accepting before it returns.
  //   FailedPrecondition: the path exists and is not a socket (left untouched).
  //   AlreadyExists: a live server listens on the path.
  //   InvalidArgument: the path is empty or too long.
  //   IOError: socket/bind/listen failed.
  // A stale socket at the path (nobody listening) is removed. A world-writable
  // parent directory without the sticky bit is allowed but logged as a warning.
  // REQUIRES: handler outlives the server.
  static Result<std::unique_ptr<SocketServer>> Start(ServerOptions options,
                                                     SessionHandler* handler);
  ~SocketServer();  // Stop()
  SocketServer(const SocketServer&) = delete;
  SocketServer& operator=(const SocketServer&) = delete;

  // Stops accepting, removes the socket file (if it is still ours), shuts
  // every session down, joins all threads; every open session gets exactly
  // one OnClose before Stop returns. Sends after this return Cancelled.
  // Idempotent. REQUIRES: not called from a handler callback.
  void Stop();

  const std::string& path() const { return options_.path; }
  ServerStats Stats() const;

 private:
  struct Conn {
    std::shared_ptr<Session> session;
    std::thread reader;
  };

  SocketServer(ServerOptions options, SessionHandler* handler);
  void AcceptLoop();
  void Admit(UniqueFd fd);
  void ReadLoop(std::shared_ptr<Session> session);
  void Reap();  // joins readers that have finished

  // Constant after Start.
  const ServerOptions options_;
  SessionHandler* const handler_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;    // eventfd: Stop, or a reader finished (reap)
  dev_t sock_dev_ = 0;  // identity of the socket file we created
  ino_t sock_ino_ = 0;
  std::thread acceptor_;

  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> rejected_peer_{0};
  std::atomic<uint64_t> rejected_full_{0};

  std::mutex stop_mu_;    // serialises Stop
  bool stopped_ = false;  // guarded by stop_mu_

  mutable std::mutex mu_;
  uint64_t next_session_id_ = 1;  // guarded by mu_
  uint64_t active_ = 0;           // guarded by mu_: sessions admitted and not yet closed
  std::unordered_map<uint64_t, Conn> conns_;  // guarded by mu_
  std::vector<uint64_t> finished_;            // guarded by mu_: readers done, to join
};

}  // namespace orbitkv::protocol
