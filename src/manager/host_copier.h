// HostCopier: the memcpys of one restore into host pages, shared between the
// calling thread and a small lane of helper threads ("okv-host-copy"), so
// that one large restore (a long prefix, a hybrid model's recurrent-state
// checkpoint of tens of MiB) is not held to one core's memcpy rate.
//
// Copy() cuts its ops into chunks of at most `chunk_bytes`, invites up to
// `threads` helpers, and copies chunks itself until none is left; helpers take
// chunks from the same counter. It returns once every chunk is copied. A call
// of at most one chunk, a copier of no helpers, or a helper lane that is busy
// or full costs the caller nothing beyond its own memcpys: the caller never
// waits for a helper to start, only for chunks a helper has already taken.
//
// The ops are the page copies a restore collected (Instance::PageCopies), their
// dst and src host addresses.
//
// Thread-safe: Copy from any number of threads. REQUIRES: ops' ranges are
// valid for the call and no destination overlaps another op's (a restore's
// pages are distinct).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "gpu/platform.h"
#include "manager/work_queue.h"
#include "orbitkv/metrics.h"

namespace orbitkv {

class HostCopier {
 public:
  struct Options {
    uint32_t threads = 0;               // helpers; 0: every copy on the caller's thread
    uint64_t chunk_bytes = 4ull << 20;  // the unit a thread takes (> 0)
    Counter* helped_bytes = nullptr;    // bytes helpers copied (optional)
  };
  explicit HostCopier(Options options);
  ~HostCopier();
  HostCopier(const HostCopier&) = delete;
  HostCopier& operator=(const HostCopier&) = delete;

  void Copy(std::span<const gpu::CopyOp> ops);
  // The same on the calling thread alone (no copier).
  static void CopyHere(std::span<const gpu::CopyOp> ops);

 private:
  struct Job;
  // Copies chunks of `job` until none is left; returns the bytes it copied.
  static uint64_t Work(Job& job);

  const Options o_;
  std::unique_ptr<WorkQueue<std::shared_ptr<Job>>> helpers_;  // null without threads
};

}  // namespace orbitkv
