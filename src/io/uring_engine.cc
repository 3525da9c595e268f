// io_uring IoEngine. One ring per engine. Run() keeps at most queue_depth
// submissions prepared or in flight, marks every CQE seen before acting on it,
// continues short transfers from where they stopped, and returns only when no
// submission is left in the kernel.
#include "io/io_engine.h"

#include <fmt/format.h>
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

namespace orbitkv {
namespace {

// A CQE's result is an int, so one submission moves at most 1 GiB; a longer
// request continues like a short transfer.
constexpr size_t kMaxSubmission = size_t{1} << 30;
// Consecutive -EINTR/-EAGAIN completions one request may see before it fails.
constexpr uint32_t kMaxRequestRetries = 16;
// Consecutive io_uring_submit EINTR/EAGAIN/EBUSY with nothing to reap.
constexpr uint32_t kMaxSubmitRetries = 1000;
constexpr uint32_t kMaxQueueDepth = 32768;  // the kernel's IORING_MAX_ENTRIES

const char* OpVerb(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

// "read cache.bin.1 [4096, +8192)"; the fd stands in for an unnamed file.
std::string Describe(const IoRequest& r) {
  if (r.file.empty()) {
    return fmt::format("{} fd {} [{}, +{})", OpVerb(r.op), r.fd, r.offset, r.len);
  }
  return fmt::format("{} {} [{}, +{})", OpVerb(r.op), r.file, r.offset, r.len);
}

size_t IovBytes(std::span<const iovec> iov) {
  size_t n = 0;
  for (const iovec& v : iov) n += v.iov_len;
  return n;
}

// The part of `iov` that starts `skip` bytes in, at most `max` bytes and
// IOV_MAX entries long, into *out.
void SliceIov(std::span<const iovec> iov, size_t skip, size_t max, std::vector<iovec>* out) {
  constexpr size_t kIovMax = 1024;
  out->clear();
  size_t taken = 0;
  for (const iovec& v : iov) {
    if (skip >= v.iov_len) {
      skip -= v.iov_len;
      continue;
    }
    if (taken == max || out->size() == kIovMax) break;
    const size_t len = std::min(v.iov_len - skip, max - taken);
    out->push_back({static_cast<char*>(v.iov_base) + skip, len});
    taken += len;
    skip = 0;
  }
}

std::string ErrnoText(int err) { return fmt::format("{} (errno {})", std::strerror(err), err); }

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const UringOptions& options)
      : queue_depth_(options.queue_depth), faults_(options.faults) {}
  UringEngine(const UringEngine&) = delete;
  UringEngine& operator=(const UringEngine&) = delete;
  ~UringEngine() override {
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

  Status Init();
  Status Run(std::span<IoRequest> reqs) override;
  uint32_t queue_depth() const override { return queue_depth_; }

 private:
  // One submission; its address is the SQE's user_data.
  struct Submission {
    size_t req = 0;          // index into the batch
    uint64_t offset = 0;     // file offset of this submission
    size_t len = 0;          // bytes submitted
    std::vector<iovec> iov;  // vectored requests: the slice submitted; stable until the CQE
  };

  // Constant after construction.
  const uint32_t queue_depth_;
  IoFaultInjector* const faults_;

  io_uring ring_{};
  bool ring_ready_ = false;
  // Set when the ring itself failed (submit or wait returned a hard error);
  // every later Run fails with it rather than touch a ring in unknown state.
  Status broken_;
  std::vector<Submission> slots_;        // queue_depth_ records
  std::vector<Submission*> free_slots_;  // those not in flight
};

Status UringEngine::Init() {
  if (queue_depth_ == 0 || queue_depth_ > kMaxQueueDepth) {
    return Status::InvalidArgument(
        fmt::format("io_uring queue_depth {} not in [1, {}]", queue_depth_, kMaxQueueDepth));
  }
  int ret = io_uring_queue_init(queue_depth_, &ring_, 0);
  if (ret < 0) {
    return Status::Unavailable(
        fmt::format("io_uring_queue_init({} entries): {}", queue_depth_, ErrnoText(-ret)));
  }
  ring_ready_ = true;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  if (probe == nullptr) {
    return Status::Unavailable("io_uring opcode probe failed (kernel older than 5.6?)");
  }
  const bool supported = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                         io_uring_opcode_supported(probe, IORING_OP_WRITE);
  io_uring_free_probe(probe);
  if (!supported) {
    return Status::Unavailable("io_uring lacks IORING_OP_READ/IORING_OP_WRITE (kernel < 5.6)");
  }
  slots_.resize(queue_depth_);
  free_slots_.reserve(queue_depth_);
  for (auto& s : slots_) free_slots_.push_back(&s);
  return Status::OK();
}

Status UringEngine::Run(std::span<IoRequest> reqs) {
  for (auto& r : reqs) {
    r.done = 0;
    r.status = Status::OK();
  }
  if (!broken_.ok()) {
    for (auto& r : reqs) {
      if (r.len > 0) r.status = broken_;
    }
    return reqs.empty() ? Status::OK() : broken_;
  }

  std::vector<uint32_t> retries(reqs.size(), 0);
  std::vector<size_t> ready;            // started requests that need their next submission
  size_t next_new = 0;                  // first request not yet started
  uint32_t in_flight = 0;               // prepared SQEs whose CQE has not been reaped
  std::deque<Submission*> unsubmitted;  // prepared SQEs the kernel has not taken yet
  uint32_t submit_retries = 0;
  Status ring_error;

  // Skips requests with nothing to do; true if some request needs a submission.
  auto has_work = [&] {
    if (!ready.empty()) return true;
    while (next_new < reqs.size()) {
      IoRequest& r = reqs[next_new];
      if (r.len == 0) {
        ++next_new;
      } else if (r.buf == nullptr && r.iov.empty()) {
        r.status = Status::InvalidArgument(Describe(r) + ": null buffer");
        ++next_new;
      } else if (!r.iov.empty() && IovBytes(r.iov) != r.len) {
        r.status = Status::InvalidArgument(Describe(r) + ": iovec lengths do not add up to len");
        ++next_new;
      } else {
        return true;
      }
    }
    return false;
  };
  auto pop_work = [&] {
    if (!ready.empty()) {
      size_t i = ready.back();
      ready.pop_back();
      return i;
    }
    return next_new++;
  };

  auto handle_cqe = [&](io_uring_cqe* cqe) {
    auto* sub = static_cast<Submission*>(io_uring_cqe_get_data(cqe));
    int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);  // first: the CQ advances whatever happens next
    --in_flight;
    const Submission s = *sub;
    free_slots_.push_back(sub);
    IoRequest& r = reqs[s.req];
    if (faults_ != nullptr) res = faults_->OnCompletion(r, s.offset, s.len, res);
    if (res < 0) {
      if ((res == -EINTR || res == -EAGAIN) && ++retries[s.req] <= kMaxRequestRetries &&
          ring_error.ok()) {
        ready.push_back(s.req);
      } else {
        r.status = Status::IOError(Describe(r), -res);
      }
      return;
    }
    if (res == 0) {
      r.status = Status::IOError(fmt::format("{}: short {}, no progress after {} of {} bytes",
                                             Describe(r), OpVerb(r.op), r.done, r.len),
                                 EIO);
      return;
    }
    retries[s.req] = 0;
    r.done += std::min(static_cast<size_t>(res), s.len);
    if (r.done < r.len) {
      if (ring_error.ok()) {
        ready.push_back(s.req);
      } else {
        r.status = ring_error;
      }
    }
  };

  while (true) {
    // Fill the queue.
    while (ring_error.ok() && in_flight < queue_depth_ && has_work()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;  // SQ ring full of untaken entries: submit first
      const size_t i = pop_work();
      IoRequest& r = reqs[i];
      Submission* sub = free_slots_.back();
      free_slots_.pop_back();
      sub->req = i;
      sub->offset = r.offset + r.done;
      sub->len = std::min(r.len - r.done, kMaxSubmission);
      if (!r.iov.empty()) {
        SliceIov(r.iov, r.done, sub->len, &sub->iov);
        sub->len = IovBytes(sub->iov);
        const auto n = static_cast<unsigned>(sub->iov.size());
        if (r.op == IoOp::kRead) {
          io_uring_prep_readv(sqe, r.fd, sub->iov.data(), n, sub->offset);
        } else {
          io_uring_prep_writev(sqe, r.fd, sub->iov.data(), n, sub->offset);
        }
        io_uring_sqe_set_data(sqe, sub);
        ++in_flight;
        unsubmitted.push_back(sub);
        continue;
      }
      void* p = static_cast<char*>(r.buf) + r.done;
      if (r.op == IoOp::kRead) {
        io_uring_prep_read(sqe, r.fd, p, static_cast<unsigned>(sub->len), sub->offset);
      } else {
        io_uring_prep_write(sqe, r.fd, p, static_cast<unsigned>(sub->len), sub->offset);
      }
      io_uring_sqe_set_data(sqe, sub);
      ++in_flight;
      unsubmitted.push_back(sub);
    }
    if (in_flight == 0) break;

    // Submit.
    if (!unsubmitted.empty()) {
      int ret = io_uring_submit(&ring_);
      if (ret > 0) {
        submit_retries = 0;
        for (int k = 0; k < ret && !unsubmitted.empty(); ++k) unsubmitted.pop_front();
      } else if (ret == 0 || ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) {
        if (++submit_retries > kMaxSubmitRetries) {
          ring_error = Status::IOError("io_uring_submit", ret == 0 ? EAGAIN : -ret);
        } else if (in_flight == unsubmitted.size()) {
          // Nothing to reap that would free kernel resources: back off, retry.
          if (ret != -EINTR) std::this_thread::sleep_for(std::chrono::microseconds(50));
          continue;
        }
        // Otherwise reap first; completions free what the kernel ran short of.
      } else {
        ring_error = Status::IOError("io_uring_submit", -ret);
      }
    }
    if (!ring_error.ok() && !unsubmitted.empty()) {
      // These SQEs will never run: fail their requests and forget them. They
      // stay in the SQ ring, which is why the engine is marked broken below.
      for (Submission* sub : unsubmitted) {
        reqs[sub->req].status = ring_error;
        free_slots_.push_back(sub);
        --in_flight;
      }
      unsubmitted.clear();
      if (in_flight == 0) break;
    }

    // Reap: wait for one completion, then take all that are ready.
    io_uring_cqe* cqe = nullptr;
    int ret = io_uring_wait_cqe(&ring_, &cqe);
    if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) continue;
    if (ret < 0) {
      // The ring cannot report completions; nothing more can be learnt.
      ring_error = Status::IOError("io_uring_wait_cqe", -ret);
      for (size_t k = 0; k < slots_.size(); ++k) {
        Submission* sub = &slots_[k];
        if (std::find(free_slots_.begin(), free_slots_.end(), sub) == free_slots_.end()) {
          reqs[sub->req].status = ring_error;
          free_slots_.push_back(sub);
        }
      }
      in_flight = 0;
      break;
    }
    do {
      handle_cqe(cqe);
    } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
  }

  if (!ring_error.ok()) {
    broken_ = ring_error;
    // Requests never started, or waiting for a continuation, fail with it too.
    for (auto& r : reqs) {
      if (r.status.ok() && r.done < r.len) r.status = ring_error;
    }
  }
  // The first failure in request order, so the answer does not depend on
  // completion order.
  for (const auto& r : reqs) {
    if (!r.status.ok()) return r.status;
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<IoEngine>> CreateUringEngine(const UringOptions& options) {
  auto engine = std::make_unique<UringEngine>(options);
  ORBITKV_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace orbitkv
