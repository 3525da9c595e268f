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
#include <span>
#include <vector>

#include "orbitkv/status.h"
#include "protocol/unique_fd.h"

namespace orbitkv::protocol {

inline constexpr size_t kFrameHeaderBytes = 4;
// The most fds one sendmsg can carry (Linux SCM_MAX_FD).
inline constexpr size_t kMaxFdsPerSendmsg = 253;
// The payload bound both ends use unless configured otherwise.
inline constexpr uint32_t kDefaultMaxFramePayload = 64u << 20;

struct Frame {
  std::vector<uint8_t> payload;
  std::vector<UniqueFd> fds;  // in the order the sender listed them
};

// Writes one frame, retrying EINTR and short writes, with MSG_NOSIGNAL (a
// closed peer gives an error, not SIGPIPE). The fds are duplicated into the
// peer by the kernel; the caller keeps its own. Errors: InvalidArgument when
// the payload exceeds 4 GiB - 1 or there are more fd chunks than frame bytes;
// Cancelled("peer closed") on EPIPE/ECONNRESET; DeadlineExceeded when
// SO_SNDTIMEO expires; IOError otherwise.
Status SendFrame(int fd, std::span<const uint8_t> payload, std::span<const int> fds = {});

// Reads one frame (retrying EINTR and short reads). The payload buffer grows
// as bytes arrive, so a peer must send what it announces before we allocate it.
// Errors:
//   Cancelled("peer closed")  EOF (or ECONNRESET) before or inside the frame;
//   InvalidArgument           length > max_payload, or more than max_fds fds
//                             (all of them are closed);
//   IOError                   MSG_CTRUNC (fds were dropped by the kernel, e.g.
//                             RLIMIT_NOFILE) or a recvmsg failure;
//   DeadlineExceeded          SO_RCVTIMEO expired.
Result<Frame> RecvFrame(int fd, uint32_t max_payload, uint32_t max_fds);

}  // namespace orbitkv::protocol
