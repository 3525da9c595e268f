// ClientConnection: the engine's end of the protocol socket. Call sends one
// request frame and waits for the reply frame that carries the same envelope
// id; many threads may Call at once and replies may come in any order, so a
// Restore blocked in one thread does not hold up a CancelRestore sent from
// another. Each reply is handed to its caller (see Reading below).
//
// Reading: whoever holds the read lock reads the socket without blocking and
// hands every frame it completes to that frame's waiter. The reader thread
// waits for readability with poll() and then reads; a caller spinning in Wait
// (ClientOptions::spin_wait) reads too, so that a reply arriving within its
// spin reaches it without waiting for the reader thread to wake; the reader
// thread stands back while a caller spins. Either may complete a frame the
// other began, and either may deliver any caller's reply.
//
// Thread-safe: every method may be called from any thread, except that the
// destructor must not race other calls. A reply for an id nobody waits for
// (its caller gave up) is dropped, its fds closed. When the connection breaks
// (server gone, oversized or undecodable frame), every waiter and every later
// Call fails: with the server's reason when it sent one (an ErrorReply with
// envelope id 0, which also ends the connection: a limit it enforces, see
// server.h), Cancelled when the peer just closed or Close was called, the
// error that broke it otherwise.
//
// Mutual authentication: before anything is sent, Connect checks the
// server's uid (SO_PEERCRED) and refuses a server of another user, so that a
// process of another uid squatting the path never sees a frame or an fd.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>

#include <sys/types.h>

#include "common/unique_fd.h"
#include "orbitkv/status.h"
#include "protocol/frame.h"

namespace orbitkv::protocol {

struct ClientOptions {
  uint32_t max_frame_payload = kDefaultMaxFramePayload;
  // Replies carry no fds today; a reply with more breaks the connection.
  uint32_t max_fds_per_frame = 0;
  // Reads the envelope id of a reply; nullopt for an unreadable one (dropped
  // and logged). Default: PeekEnvelopeId (wire.h).
  std::function<std::optional<uint64_t>(std::span<const uint8_t>)> reply_id;
  // The uid the server may run as besides this process's euid (e.g. a root
  // engine using a user's Manager). Unset: the same uid only.
  std::optional<uid_t> server_uid;
  // How long Wait spins before it sleeps on its condition variable: the
  // caller polls the socket and reads whatever arrived itself (see above),
  // yielding its core between polls. A reply that arrives within it reaches
  // the caller without any thread wake (neither the reader thread's nor the
  // caller's), two hand-offs off a short call's latency; a longer call costs
  // its caller at most this much CPU. 500 us covers a one-block DRAM restore
  // of an 8B model (2 MiB: the Manager's copy takes 0.1 ms on a 2-core VM,
  // 0.27 ms on an H100 host), which a shorter spin gave up on, paying both
  // wakes: client+wire p50 on the H100 host 0.13 ms at 200 us, 0.08 at 500,
  // 0.07 at 1000. 0: sleep at once, the reader thread reads.
  std::chrono::microseconds spin_wait{500};
  // A larger request takes longer to answer (a Query of 8192 keys, 256 KiB,
  // takes the Manager 0.5-0.6 ms before its reply is sent), so its spin grows
  // by this much per KiB of the request, up to max_spin_wait: the 8192-block
  // socket query on the 2-core VM took 0.76-0.94 ms with a 500 us spin that
  // ran out, and 0.63-0.71 ms with one that did not. Only with spin_wait > 0.
  std::chrono::nanoseconds spin_wait_per_kib{4000};
  std::chrono::microseconds max_spin_wait{2000};
};

class ClientConnection {
 public:
  // Connects to the server socket at `path`. Unavailable when nobody listens
  // there (ENOENT, ECONNREFUSED); PermissionDenied on EACCES, or when the
  // server runs as a uid other than ours and options.server_uid (the message
  // names its uid and pid; nothing was sent); InvalidArgument for a bad path;
  // IOError otherwise.
  static Result<std::unique_ptr<ClientConnection>> Connect(const std::string& path,
                                                           ClientOptions options = {});
  ~ClientConnection();  // Close()
  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;

  // An id no other Call on this connection has used (1, 2, 3, ...).
  uint64_t NextId() { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  // Sends `request` (whose envelope id must be `id`) with `fds` attached and
  // waits up to `timeout` for the reply with the same id.
  //   InvalidArgument: id 0, or `id` is already waiting for a reply.
  //   DeadlineExceeded: no reply in time (the server may still act on the
  //                     request; a late reply is dropped).
  //   Cancelled / other: the connection is closed or broke (see above).
  // The timeout bounds the wait for the reply; the send itself blocks only
  // while the socket buffer is full (the server's reader drains it).
  // Cancelling a slow Restore is the caller's move: CancelRestore with its id.
  Result<Frame> Call(std::span<const uint8_t> request, std::span<const int> fds, uint64_t id,
                     std::chrono::milliseconds timeout);

  // Call in parts, for callers that keep waiting after a timeout (a Restore
  // whose pages the server may still write). Start registers `id` and sends;
  // Wait waits up to `timeout` and, on DeadlineExceeded, keeps the id
  // registered so that a later Wait still gets the reply; Abandon drops it
  // (a reply arriving later is dropped). Start errors are Call's.
  Status Start(std::span<const uint8_t> request, std::span<const int> fds, uint64_t id);
  Result<Frame> Wait(uint64_t id, std::chrono::milliseconds timeout);
  void Abandon(uint64_t id);

  // Shuts the socket down, joins the reader and fails every waiter with
  // Cancelled. Idempotent.
  void Close();
  bool closed() const;

  // Frames that callers spinning in Wait read to their end themselves (the
  // reader thread read the rest): how often the spin spared a hand-off.
  uint64_t frames_read_by_callers() const {
    return frames_read_by_callers_.load(std::memory_order_relaxed);
  }

 private:
  struct Waiter {
    std::condition_variable cv;
    std::optional<Result<Frame>> result;  // guarded by ClientConnection::mu_
    std::atomic<bool> ready{false};       // set (release) after result, for Wait's spin
    std::chrono::nanoseconds spin{0};     // how long Wait spins (Start: from the request's size)
  };

  ClientConnection(UniqueFd fd, ClientOptions options);
  // The reader thread: poll() for readability, then ReadAvailable, until the
  // stream ends or breaks.
  void ReadLoop();
  // Reads what the socket holds (MSG_DONTWAIT) and delivers every frame it
  // completes. `mine`: a spinning caller's ready flag, once set it stops
  // (nullptr: the reader thread, which reads until the socket is drained).
  // False once the stream has ended or broke (read_done_: every waiter has
  // failed and nobody reads again). REQUIRES: read_mu_ held.
  bool ReadAvailable(const std::atomic<bool>* mine);
  // Hands a whole frame to its waiter (or drops it); a closing reason from the
  // server ends the stream. REQUIRES: read_mu_ held.
  void Deliver(Frame frame);
  // Ends the stream: fails every waiter with `why` and shuts the socket down,
  // so that a reader thread blocked in poll() returns. REQUIRES: read_mu_ held.
  void EndStream(const Status& why);
  // Marks the connection broken with `why` and fails every waiter with it.
  void FailAll(const Status& why);
  // The server's reason for closing, when `frame` is an ErrorReply with id 0.
  static std::optional<Status> ClosingReason(std::span<const uint8_t> frame);

  // Constant after construction; the fd is closed only by the destructor.
  const UniqueFd fd_;
  const ClientOptions options_;
  std::thread reader_;

  std::atomic<uint64_t> next_id_{1};
  std::mutex send_mu_;   // one frame at a time on the socket
  std::mutex close_mu_;  // serialises Close (joins the reader)

  // Held while reading the socket (never across a blocking call), by the
  // reader thread or a spinning caller. Taken before mu_, never inside it.
  std::mutex read_mu_;
  FrameReader frames_;      // guarded by read_mu_: the frame being read
  bool read_done_ = false;  // guarded by read_mu_: the stream ended or broke
  std::atomic<uint64_t> frames_read_by_callers_{0};
  std::atomic<int> spinners_{0};  // callers spinning in Wait now (the reader thread waits)

  mutable std::mutex mu_;
  std::condition_variable broken_cv_;  // signalled when broken_ is set
  Status broken_;                      // guarded by mu_: OK while the connection is usable
  std::unordered_map<uint64_t, std::shared_ptr<Waiter>> waiters_;  // guarded by mu_
};

}  // namespace orbitkv::protocol
