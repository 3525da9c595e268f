// IoEngine: executes batches of positioned reads and writes on files opened
// with O_DIRECT. One engine belongs to one worker thread (it is not
// thread-safe); a process keeps one engine per worker.
// Run() submits at most queue_depth requests at a time, always reaps every
// completion (also after an error), continues short transfers until complete,
// and fails a request whose transfer makes no progress (EOF) or errors. Buffers,
// offsets and lengths must be 4 KiB aligned for O_DIRECT files (callers align).
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "orbitkv/status.h"

namespace orbitkv {

enum class IoOp : uint8_t { kRead, kWrite };

// One request. Inputs are set by the caller; outputs by the engine.
struct IoRequest {
  // Inputs.
  IoOp op = IoOp::kRead;
  int fd = -1;
  uint64_t offset = 0;  // file offset
  void* buf = nullptr;  // read: destination; write: source. Caller owns; stays valid through Run().
  size_t len = 0;
  // Vectored form: when non-empty, the transfer scatters into / gathers from
  // these buffers in order (buf is ignored) and len must equal their sum. The
  // caller owns the array and keeps it valid through Run().
  std::span<const iovec> iov;
  std::string_view file;  // name used in error messages; caller keeps it alive
  // Outputs.
  size_t done = 0;  // bytes transferred
  Status status;    // OK, or the error naming file and [offset, +len)
};

// Test seam: sees each completion before the engine acts on it and may change
// its result (a negative errno, or fewer bytes), or stall. Must be thread-safe.
class IoFaultInjector {
 public:
  virtual ~IoFaultInjector() = default;
  // res: the kernel's result for this submission (bytes or -errno); `submitted`
  // is the length of this submission. Returns the result the engine should see.
  virtual int OnCompletion(const IoRequest& req, uint64_t offset, size_t submitted, int res) = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Executes every request; returns after all completed or failed. Returns the
  // first failure (also recorded in that request's status), OK if all succeeded.
  virtual Status Run(std::span<IoRequest> reqs) = 0;
  virtual uint32_t queue_depth() const = 0;
};

struct UringOptions {
  uint32_t queue_depth = 64;
  IoFaultInjector* faults = nullptr;  // tests only
};

// io_uring engine (liburing). Create() probes that io_uring works with the
// opcodes used later (READ, WRITE); failure is Unavailable with the reason.
Result<std::unique_ptr<IoEngine>> CreateUringEngine(const UringOptions& options);

// A programmable IoFaultInjector for tests: the Nth completion (1-based, of a
// kind) fails with an errno, is cut short, reports zero bytes, or stalls.
class ScriptedIoFaults final : public IoFaultInjector {
 public:
  enum class Fault { kError, kShort, kZero, kStall };
  struct Rule {
    IoOp op;
    uint64_t nth = 1;
    Fault fault = Fault::kError;
    int err = 5;  // EIO
    bool every = false;
    std::chrono::milliseconds stall{0};
  };
  void AddRule(Rule rule);
  void Clear();
  uint64_t Completions(IoOp op) const;
  int OnCompletion(const IoRequest& req, uint64_t offset, size_t submitted, int res) override;

 private:
  struct State;
  std::shared_ptr<State> state_ = MakeState();
  static std::shared_ptr<State> MakeState();
};

}  // namespace orbitkv
