// SocketServer: the Manager's end of the engine protocol. Listens on a Unix
// stream socket path, admits peers of the same user (or root), reads frames
// (frame.h) of every connection on one epoll event loop and hands whole frames
// to a SessionHandler on a bounded pool of worker threads. It knows nothing of
// the messages inside the frames.
//
// Threads: one event-loop thread (accept, reads, timeouts) and
// ServerOptions::worker_threads workers, however many connections are open;
// a session's SendAsync replies use a writer thread that exits when idle.
// For a given session, OnOpen, every OnFrame and OnClose run in that order,
// one at a time, on some worker; the loop reads the session's next frame only
// after OnFrame returned (the socket buffer holds the rest). Different
// sessions run concurrently, so the handler must be thread-safe. OnFrame
// should not block for long (it holds a worker): hand long work to a worker of
// your own that replies later with Session::SendAsync.
//
// Limits, each refused with an ErrorReply (envelope id 0, see wire.h) that
// names the limit before the connection closes: peers of another uid
// (PermissionDenied), max_connections and max_connections_per_uid, a frame
// over max_frame_payload or with more than max_fds_per_frame fds, the process
// out of fds (ResourceExhausted), a frame begun and not finished within
// frame_timeout, and a session idle (no frame, and the handler says it holds
// nothing: MayCloseIdle) for idle_timeout (DeadlineExceeded). Memory: the
// payload bytes of frames being read or waiting for their handler are at most
// max_buffered_bytes over all connections; a frame whose announced length does
// not fit waits (its socket is not read) until earlier frames are handled.
//
// Security: the socket file is created 0600 and the peer's uid (SO_PEERCRED)
// must be the server's euid or root; both keep other users out even when the
// directory is shared. The path is never followed or replaced unless it is a
// stale socket; a live socket there is an error naming its owner's uid and pid.
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

#include "common/unique_fd.h"
#include "orbitkv/status.h"
#include "protocol/frame.h"

namespace orbitkv::protocol {

class SocketServer;

// Makes sure `dir` is a directory only this user can use: creates it 0700 when
// `create` and it is missing, then checks with lstat that it is a directory
// (not a symlink), owned by the euid, with no group or other permissions.
// PermissionDenied naming the owner's uid (another user may be squatting it)
// or the mode; NotFound when missing and !create; IOError otherwise.
Status EnsurePrivateDirectory(const std::string& dir, bool create);

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
  // Shuts the connection down (both directions): the event loop drops it and
  // OnClose follows. Idempotent; callable from any thread, also OnFrame.
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // Queues a frame (no fds) for this session's own writer thread and returns
  // at once: what worker threads use, so a client that stops reading delays
  // only its own replies. More than kMaxQueuedFrames waiting closes the session.
  // The writer thread exits after kWriterLinger without work.
  void SendAsync(std::vector<uint8_t> payload);
  static constexpr size_t kMaxQueuedFrames = 4096;
  static constexpr std::chrono::milliseconds kWriterLinger{2000};

 private:
  friend class SocketServer;

  // What the workers run for this session, in order.
  struct Task {
    enum Kind { kOpen, kFrame, kClose } kind;
    Frame frame;
  };

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

  // Guarded by SocketServer::pool_mu_.
  std::deque<Task> tasks_;
  bool scheduled_ = false;  // in the ready queue or on a worker
  // Set by the loop when it dispatches a frame, cleared by the worker after
  // OnFrame (with idle_since_ns_, steady-clock nanoseconds).
  std::atomic<bool> in_handler_{false};
  std::atomic<int64_t> idle_since_ns_{0};

  std::mutex outbox_mu_;
  std::condition_variable outbox_cv_;
  std::deque<std::vector<uint8_t>> outbox_;  // guarded by outbox_mu_
  bool writer_stop_ = false;                 // guarded by outbox_mu_
  bool writer_running_ = false;              // guarded by outbox_mu_
  std::thread writer_;                       // guarded by outbox_mu_; started by SendAsync
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
  // Whether an idle session may be closed by ServerOptions::idle_timeout
  // (e.g. false while it owns state a reconnect would lose). Called on the
  // event-loop thread; must not block.
  virtual bool MayCloseIdle(const Session& session) { return true; }
};

struct ServerOptions {
  std::string path;  // socket path (< 108 bytes)
  uint32_t max_connections = 1024;
  uint32_t max_connections_per_uid = 1024;
  uint32_t max_frame_payload = kDefaultMaxFramePayload;
  // A RegisterInstance carries one memfd per host region.
  uint32_t max_fds_per_frame = 4096;
  // Payload bytes buffered over all connections (frames being read, and
  // frames waiting for or inside their handler). >= max_frame_payload.
  uint64_t max_buffered_bytes = 256ull << 20;
  // A frame whose first byte arrived must be complete within this (0: never).
  std::chrono::milliseconds frame_timeout{10000};
  // A session without a frame for this long is closed when the handler's
  // MayCloseIdle allows it (0: never).
  std::chrono::milliseconds idle_timeout{60000};
  uint32_t worker_threads = 4;
  // How long a worker that just ran a task polls for the next one before it
  // sleeps (at most one worker spins at a time), and how long the event loop
  // polls its sockets (epoll_wait without blocking) after it handled events
  // (a frame, a handler's buffer returned: its reply went out) before it
  // blocks. A frame arriving within the loop's window is read without waking
  // the loop, and handed over within a worker's without waking the worker:
  // two thread hand-offs off a short call's latency. Spinners yield between
  // polls, so they do not hold a core a woken thread needs. An idle server
  // spins this long once after its last event (loop) and task (a worker);
  // never while idle. 0: off.
  std::chrono::microseconds worker_spin{50};
  // A Send that makes no progress for this long fails and closes the session
  // (a client that stops reading must not wedge the Manager's workers).
  std::chrono::milliseconds send_timeout{30000};

  // InvalidArgument naming the field for zero limits or a buffer cap below
  // the frame limit.
  Status Validate() const;
};

struct ServerStats {
  uint64_t accepted = 0;            // connections admitted
  uint64_t rejected_peer = 0;       // refused by the SO_PEERCRED check
  uint64_t rejected_full = 0;       // refused at max_connections or max_connections_per_uid
  uint64_t rejected_frame = 0;      // closed for a frame over a limit (size, fds)
  uint64_t closed_timeout = 0;      // closed by frame_timeout or idle_timeout
  uint64_t active = 0;              // sessions now open
  uint64_t buffered_bytes = 0;      // payload bytes now held (<= max_buffered_bytes)
  uint64_t waiting_for_buffer = 0;  // connections whose next frame waits for room
  // Frames completed on an event the loop found while polling after activity
  // (ServerOptions::worker_spin), i.e. without a wake of the loop thread.
  uint64_t frames_polled = 0;
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
  struct Conn;  // loop-thread state of one connection (server.cc)
  struct Budget;

  SocketServer(ServerOptions options, SessionHandler* handler);
  void LoopThread();
  void WorkerThread();
  void AcceptAll();
  void Admit(UniqueFd fd);
  void OnReadable(uint64_t conn_id);
  void GrantWaiters();
  void CheckTimeouts();
  // Sends `why` as an ErrorReply if the socket takes it at once, then closes.
  void Refuse(Conn& conn, const Status& why);
  void CloseConn(uint64_t conn_id);
  void Arm(const Session& session, uint32_t events);
  void Enqueue(const std::shared_ptr<Session>& session, Session::Task task);

  // Constant after Start.
  const ServerOptions options_;
  SessionHandler* const handler_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: Stop, or buffer budget returned
  UniqueFd epoll_fd_;
  UniqueFd spare_fd_;   // given up to accept (and refuse) a connection at EMFILE
  dev_t sock_dev_ = 0;  // identity of the socket file we created
  ino_t sock_ino_ = 0;
  std::shared_ptr<Budget> budget_;
  std::thread loop_;
  std::vector<std::thread> workers_;

  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> rejected_peer_{0};
  std::atomic<uint64_t> rejected_full_{0};
  std::atomic<uint64_t> rejected_frame_{0};
  std::atomic<uint64_t> closed_timeout_{0};
  std::atomic<uint64_t> active_{0};
  std::atomic<uint64_t> waiting_{0};
  std::atomic<uint64_t> frames_polled_{0};

  std::mutex stop_mu_;    // serialises Stop
  bool stopped_ = false;  // guarded by stop_mu_

  // Loop-thread only.
  bool polling_ = false;  // the events being handled were found by a non-blocking poll
  uint64_t next_session_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<uid_t, uint32_t> per_uid_;
  std::deque<uint64_t> budget_waiters_;  // connections waiting for buffer room, FIFO

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::deque<std::shared_ptr<Session>> ready_;  // guarded by pool_mu_
  bool workers_stop_ = false;                   // guarded by pool_mu_
  // ready_.size() (written under pool_mu_), for a spinning worker's poll.
  std::atomic<size_t> ready_count_{0};
  uint32_t spinners_ = 0;  // guarded by pool_mu_: workers polling (0 or 1)
};

}  // namespace orbitkv::protocol
