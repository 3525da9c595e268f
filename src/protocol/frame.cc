#include "protocol/frame.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>

namespace orbitkv::protocol {
namespace {

// Control buffer for one recvmsg: one full SCM_RIGHTS chunk, plus room for a
// credentials message should someone enable SO_PASSCRED on the socket.
constexpr size_t kControlBytes =
    CMSG_SPACE(kMaxFdsPerSendmsg * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred));
// The payload buffer starts at most this large and doubles as bytes arrive.
constexpr size_t kInitialPayloadBuffer = 1u << 20;

// Moves every fd of `msg`'s SCM_RIGHTS messages into `fds`.
void TakeReceivedFds(msghdr* msg, std::vector<UniqueFd>* fds) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(c);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, data + i * sizeof(int), sizeof(int));
      fds->emplace_back(received);
    }
  }
}

Status SendError(int err) {
  if (err == EPIPE || err == ECONNRESET) return Status::Cancelled("peer closed");
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return Status::DeadlineExceeded("sendmsg: send timeout expired");
  }
  return Status::IOError("sendmsg on a protocol socket", err);
}

Status RecvError(int err) {
  if (err == ECONNRESET) return Status::Cancelled("peer closed (connection reset)");
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return Status::DeadlineExceeded("recvmsg: receive timeout expired");
  }
  return Status::IOError("recvmsg on a protocol socket", err);
}

// One sendmsg of `len` bytes from `iov` (advanced in place) with `fds` as
// SCM_RIGHTS when non-empty. Returns bytes written (> 0) or an error.
Result<size_t> SendSome(int fd, std::span<iovec> iov, std::span<const int> fds) {
  alignas(cmsghdr) std::array<char, CMSG_SPACE(kMaxFdsPerSendmsg * sizeof(int))> control{};
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = iov.size();
  if (!fds.empty()) {
    const size_t bytes = fds.size() * sizeof(int);
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(bytes);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(bytes);
    std::memcpy(CMSG_DATA(c), fds.data(), bytes);
  }
  for (;;) {
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) return static_cast<size_t>(n);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Status::IOError("sendmsg wrote 0 bytes", EIO);
    return SendError(errno);
  }
}

// Writes bytes [pos, end) of the frame (header then payload) with repeated
// sendmsg; `fds` go with the first call.
Status SendRange(int fd, const uint8_t* header, std::span<const uint8_t> payload, size_t pos,
                 size_t end, std::span<const int> fds) {
  while (pos < end) {
    std::array<iovec, 2> iov{};
    size_t n_iov = 0;
    if (pos < kFrameHeaderBytes) {
      const size_t hdr_end = std::min(end, kFrameHeaderBytes);
      iov[n_iov++] = {const_cast<uint8_t*>(header + pos), hdr_end - pos};
    }
    if (end > kFrameHeaderBytes) {
      const size_t p0 = std::max(pos, kFrameHeaderBytes) - kFrameHeaderBytes;
      const size_t p1 = end - kFrameHeaderBytes;
      iov[n_iov++] = {const_cast<uint8_t*>(payload.data() + p0), p1 - p0};
    }
    ORBITKV_ASSIGN_OR_RETURN(size_t n, SendSome(fd, std::span(iov.data(), n_iov), fds));
    fds = {};  // the first sendmsg that wrote anything took them
    pos += n;
  }
  return Status::OK();
}

// Reads exactly `len` bytes into `dst`, collecting any fds into `fds`.
Status RecvExact(int fd, uint8_t* dst, size_t len, bool at_frame_start, uint32_t max_fds,
                 std::vector<UniqueFd>* fds) {
  size_t got = 0;
  while (got < len) {
    alignas(cmsghdr) std::array<char, kControlBytes> control;
    iovec iov{dst + got, len - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return RecvError(errno);
    // Take ownership of every fd first, so that every error path closes them.
    TakeReceivedFds(&msg, fds);
    if (msg.msg_flags & MSG_CTRUNC) {
      return Status::IOError(
          "recvmsg: control data truncated, file descriptors were dropped (RLIMIT_NOFILE?)",
          EMSGSIZE);
    }
    if (fds->size() > max_fds) {
      const size_t count = fds->size();
      fds->clear();  // closes them
      return Status::InvalidArgument("frame carries " + std::to_string(count) +
                                     " file descriptors, more than the limit " +
                                     std::to_string(max_fds));
    }
    if (n == 0) {
      return Status::Cancelled(at_frame_start && got == 0 ? "peer closed"
                                                          : "peer closed inside a frame");
    }
    got += static_cast<size_t>(n);
    at_frame_start = false;
  }
  return Status::OK();
}

}  // namespace

Status SendFrame(int fd, std::span<const uint8_t> payload, std::span<const int> fds) {
  if (payload.size() > UINT32_MAX) {
    return Status::InvalidArgument("frame payload of " + std::to_string(payload.size()) +
                                   " bytes does not fit the 32-bit length prefix");
  }
  const size_t total = kFrameHeaderBytes + payload.size();
  const size_t chunks = (fds.size() + kMaxFdsPerSendmsg - 1) / kMaxFdsPerSendmsg;
  if (chunks > total) {
    return Status::InvalidArgument("frame of " + std::to_string(total) + " bytes cannot carry " +
                                   std::to_string(fds.size()) + " file descriptors");
  }
  const auto len = static_cast<uint32_t>(payload.size());
  const uint8_t header[kFrameHeaderBytes] = {
      static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len >> 16),
      static_cast<uint8_t>(len >> 24)};
  // Chunks 0 .. chunks-2 ride alone on frame bytes 0, 1, ...; the last chunk
  // goes with the rest of the frame.
  size_t pos = 0;
  for (size_t c = 0; c + 1 < chunks; ++c) {
    ORBITKV_RETURN_IF_ERROR(SendRange(fd, header, payload, pos, pos + 1,
                                      fds.subspan(c * kMaxFdsPerSendmsg, kMaxFdsPerSendmsg)));
    ++pos;
  }
  const std::span<const int> last =
      chunks == 0 ? std::span<const int>() : fds.subspan((chunks - 1) * kMaxFdsPerSendmsg);
  return SendRange(fd, header, payload, pos, total, last);
}

Result<Frame> RecvFrame(int fd, uint32_t max_payload, uint32_t max_fds) {
  Frame frame;
  uint8_t header[kFrameHeaderBytes];
  ORBITKV_RETURN_IF_ERROR(RecvExact(fd, header, kFrameHeaderBytes, true, max_fds, &frame.fds));
  const uint32_t len = static_cast<uint32_t>(header[0]) | (static_cast<uint32_t>(header[1]) << 8) |
                       (static_cast<uint32_t>(header[2]) << 16) |
                       (static_cast<uint32_t>(header[3]) << 24);
  if (len > max_payload) {
    return Status::InvalidArgument("frame of " + std::to_string(len) +
                                   " bytes, more than the limit " + std::to_string(max_payload));
  }
  size_t got = 0;
  frame.payload.resize(std::min<size_t>(len, kInitialPayloadBuffer));
  while (got < len) {
    if (got == frame.payload.size()) {
      frame.payload.resize(std::min<size_t>(len, frame.payload.size() * 2));
    }
    const size_t want = frame.payload.size() - got;
    ORBITKV_RETURN_IF_ERROR(
        RecvExact(fd, frame.payload.data() + got, want, false, max_fds, &frame.fds));
    got += want;
  }
  return frame;
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- FrameReader ----------------------------------------------------------------

namespace {
// The most payload bytes one recvmsg of FrameReader asks for (and so the most
// buffer it touches ahead of the bytes that arrived).
constexpr size_t kReadChunk = 1u << 20;
}  // namespace

FrameReader::FrameReader(uint32_t max_payload, uint32_t max_fds)
    : max_payload_(max_payload), max_fds_(max_fds) {}

Status FrameReader::TakeFds(::msghdr* msg, long n) {
  TakeReceivedFds(msg, &fds_);
  if (msg->msg_flags & MSG_CTRUNC) {
    fds_.clear();
    return Status::ResourceExhausted(
        "file descriptors sent with a frame were dropped: this process (the Manager, or a "
        "client reading a reply) is at its open-file limit (RLIMIT_NOFILE)");
  }
  if (fds_.size() > max_fds_) {
    const size_t count = fds_.size();
    fds_.clear();
    return Status::ResourceExhausted("frame carries " + std::to_string(count) +
                                     " file descriptors, more than the limit " +
                                     std::to_string(max_fds_));
  }
  if (n == 0 && started()) {
    fds_.clear();
    return Status::Cancelled("peer closed inside a frame");
  }
  return Status::OK();
}

Result<FrameReader::Progress> FrameReader::Read(int fd, size_t max_bytes) {
  size_t budget = std::max<size_t>(max_bytes, 1);
  while (budget > 0) {
    alignas(cmsghdr) std::array<char, kControlBytes> control;
    iovec iov{};
    if (!have_len_) {
      iov = {header_ + header_got_, kFrameHeaderBytes - header_got_};
    } else {
      const size_t got = payload_.size();
      const size_t want = std::min({static_cast<size_t>(len_) - got, budget, kReadChunk});
      if (want == 0) break;         // a zero-length payload is complete below
      payload_.resize(got + want);  // within the capacity Grant reserved
      iov = {payload_.data() + got, want};
    }
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    const int err = errno;
    if (have_len_) payload_.resize(payload_.size() - iov.iov_len + (n > 0 ? n : 0));
    if (n < 0) {
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return Progress::kWouldBlock;
      fds_.clear();
      if (err == ECONNRESET) return Status::Cancelled("peer closed (connection reset)");
      return Status::IOError("recvmsg on a protocol socket", err);
    }
    ORBITKV_RETURN_IF_ERROR(TakeFds(&msg, n));
    if (n == 0) return Progress::kClosed;
    budget -= std::min(budget, static_cast<size_t>(n));
    if (!have_len_) {
      header_got_ += static_cast<size_t>(n);
      if (header_got_ < kFrameHeaderBytes) continue;
      len_ = static_cast<uint32_t>(header_[0]) | (static_cast<uint32_t>(header_[1]) << 8) |
             (static_cast<uint32_t>(header_[2]) << 16) | (static_cast<uint32_t>(header_[3]) << 24);
      have_len_ = true;
      if (len_ > max_payload_) {
        fds_.clear();
        return Status::ResourceExhausted("frame of " + std::to_string(len_) +
                                         " bytes, more than the limit " +
                                         std::to_string(max_payload_));
      }
      return Progress::kHeader;
    }
    if (payload_.size() == len_) break;
  }
  if (have_len_ && granted_ && payload_.size() == len_) return Progress::kFrame;
  return Progress::kWouldBlock;
}

void FrameReader::Grant() {
  granted_ = true;
  payload_.reserve(len_);
}

Frame FrameReader::Take() {
  Frame f;
  f.payload = std::move(payload_);
  f.fds = std::move(fds_);
  payload_ = std::vector<uint8_t>();
  fds_.clear();
  header_got_ = 0;
  have_len_ = granted_ = false;
  len_ = 0;
  return f;
}

}  // namespace orbitkv::protocol
