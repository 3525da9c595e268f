// Frame: one message on a blocking AF_UNIX SOCK_STREAM socket, with the file
// descriptors (memfds) that travel with it.
//
//   frame = u32 little-endian payload length, then the payload bytes.
//   fds   = SCM_RIGHTS ancillary data on the frame's first bytes: at most
//           kMaxFdsPerSendmsg (253, the kernel's SCM_MAX_FD) on byte 0, the next
//           253 on byte 1, and so on, each chunk by its own sendmsg.
//
// Why SOCK_STREAM and not SOCK_SEQPACKET: a SEQPACKET message must fit the
// socket send buffer in one piece (net.core.wmem_max, ~208 KiB by default),
// and a Publish of 64 Ki keys or a RestoreReply is megabytes. Stream sockets
// take any size with a length prefix. The kernel never merges bytes that
// carry fds with later bytes in one recvmsg, and the reader never reads past
// the frame it is in, so fds cannot slide into the wrong frame.
//
// Errors: after any non-OK status from SendFrame or RecvFrame the byte stream
// is in an unknown position (a frame may be half written or half read), so
// the caller must close the connection. Received fds are O_CLOEXEC and owned
// by the Frame; on any error every fd received so far is closed.
//
// Thread-safety: functions are thread-safe, but a socket must have at most one
// concurrent sender (frames would interleave) and one concurrent receiver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/unique_fd.h"
#include "orbitkv/status.h"

struct msghdr;

namespace orbitkv::protocol {

inline constexpr size_t kFrameHeaderBytes = 4;
// The most fds one sendmsg can carry (Linux SCM_MAX_FD).
inline constexpr size_t kMaxFdsPerSendmsg = 253;
// The payload bound both ends use unless configured otherwise.
inline constexpr uint32_t kDefaultMaxFramePayload = 64u << 20;

struct Frame {
  std::vector<uint8_t> payload;
  std::vector<UniqueFd> fds;  // in the order the sender listed them
  // Whatever must live as long as the frame: the server's buffer budget is
  // returned when the last copy of this goes (SocketServer).
  std::shared_ptr<void> hold;
  // SocketServer only (0 elsewhere), SteadyNowNs() below: when its loop
  // read the frame's last byte, and when a worker took it up. A handler's
  // request latency metrics start here.
  int64_t read_ns = 0;
  int64_t dispatched_ns = 0;
};

// Steady-clock nanoseconds: the clock of Frame::read_ns and dispatched_ns
// (and of the server's own timers).
int64_t SteadyNowNs();

// Writes one frame, retrying EINTR and short writes, with MSG_NOSIGNAL (a
// closed peer gives an error, not SIGPIPE). The fds are duplicated into the
// peer by the kernel; the caller keeps its own. Errors: InvalidArgument when
// the payload exceeds 4 GiB - 1 or there are more fd chunks than frame bytes;
// Cancelled("peer closed") on EPIPE/ECONNRESET; DeadlineExceeded when
// SO_SNDTIMEO expires; IOError otherwise.
Status SendFrame(int fd, std::span<const uint8_t> payload, std::span<const int> fds = {});

// Reads one frame (retrying EINTR and short reads), blocking: for tests and
// tools that talk to a socket directly. The Manager's server and the client
// library read through FrameReader below (ClientConnection since session 20,
// so that a spinning caller can read its reply without blocking). The payload
// buffer grows as bytes arrive, so a peer must send what it announces before
// we allocate it.
// Errors:
//   Cancelled("peer closed")  EOF (or ECONNRESET) before or inside the frame;
//   InvalidArgument           length > max_payload, or more than max_fds fds
//                             (all of them are closed);
//   IOError                   MSG_CTRUNC (fds were dropped by the kernel, e.g.
//                             RLIMIT_NOFILE) or a recvmsg failure;
//   DeadlineExceeded          SO_RCVTIMEO expired.
Result<Frame> RecvFrame(int fd, uint32_t max_payload, uint32_t max_fds);

// FrameReader: the incremental, non-blocking counterpart of RecvFrame, for the
// server's event loop and the client's readers (protocol/connection.h). It
// reads with MSG_DONTWAIT whatever the socket holds and never allocates more
// than the announced payload, and that only once Grant() says the caller has
// room for it (the server's aggregate buffer budget; the client grants at
// once, its server being trusted):
//
//   Read -> kHeader (announced() known) -> [caller reserves] Grant() ->
//   Read ... -> kFrame -> Take() -> (next frame)
//
// Errors (the stream is then unusable, every fd received is closed):
//   ResourceExhausted  length > max_payload, or more than max_fds fds, or
//                      fds dropped by the kernel (MSG_CTRUNC: RLIMIT_NOFILE);
//   Cancelled          EOF inside a frame ("peer closed inside a frame");
//   IOError            recvmsg failed.
// Thread-compatible: one thread at a time (the server's loop thread; a
// client's read lock).
class FrameReader {
 public:
  enum class Progress {
    kWouldBlock,  // drained, or max_bytes read: wait for readability (again)
    kHeader,      // the length is known: Grant() before reading on
    kFrame,       // a whole frame is ready: Take() it
    kClosed,      // EOF between frames
  };
  FrameReader(uint32_t max_payload, uint32_t max_fds);

  // Reads at most about `max_bytes` bytes. REQUIRES: not between kHeader and
  // Grant(), nor between kFrame and Take().
  Result<Progress> Read(int fd, size_t max_bytes);
  // True once any byte (or fd) of the current frame has arrived.
  bool started() const { return header_got_ > 0 || !fds_.empty(); }
  bool waiting_for_grant() const { return have_len_ && !granted_; }
  uint32_t announced() const { return len_; }
  // Reserves the payload buffer (announced() bytes of capacity; pages are
  // touched only as bytes arrive).
  void Grant();
  Frame Take();

 private:
  Status TakeFds(::msghdr* msg, long n);

  const uint32_t max_payload_;
  const uint32_t max_fds_;
  uint8_t header_[kFrameHeaderBytes] = {};
  size_t header_got_ = 0;
  bool have_len_ = false;
  bool granted_ = false;
  uint32_t len_ = 0;
  std::vector<uint8_t> payload_;  // size() == bytes received (capacity len_ once granted)
  std::vector<UniqueFd> fds_;
};

}  // namespace orbitkv::protocol
