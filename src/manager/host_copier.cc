#include "manager/host_copier.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/mutex.h"

namespace orbitkv {

struct HostCopier::Job {
  std::vector<gpu::CopyOp> chunks;
  std::atomic<size_t> next{0};
  Mutex mu;
  CondVar cv;
  size_t done GUARDED_BY(mu) = 0;
};

HostCopier::HostCopier(Options options) : o_(options) {
  if (o_.threads == 0) return;
  helpers_ = std::make_unique<WorkQueue<std::shared_ptr<Job>>>(
      "okv-host-copy", 4 * size_t{o_.threads}, o_.threads,
      [this](size_t, std::vector<std::shared_ptr<Job>>& jobs) {
        for (std::shared_ptr<Job>& j : jobs) {
          const uint64_t bytes = Work(*j);
          if (o_.helped_bytes && bytes) o_.helped_bytes->Inc(bytes);
        }
      });
}

HostCopier::~HostCopier() {
  if (helpers_) helpers_->Close();
}

uint64_t HostCopier::Work(Job& job) {
  uint64_t bytes = 0;
  size_t copied = 0;
  for (size_t i; (i = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks.size();) {
    const gpu::CopyOp& c = job.chunks[i];
    std::memcpy(reinterpret_cast<void*>(c.dst), reinterpret_cast<const void*>(c.src), c.bytes);
    bytes += c.bytes;
    ++copied;
  }
  if (copied) {
    MutexLock l(job.mu);
    job.done += copied;
    if (job.done == job.chunks.size()) job.cv.NotifyAll();
  }
  return bytes;
}

void HostCopier::CopyHere(std::span<const gpu::CopyOp> ops) {
  for (const gpu::CopyOp& op : ops) {
    std::memcpy(reinterpret_cast<void*>(op.dst), reinterpret_cast<const void*>(op.src), op.bytes);
  }
}

void HostCopier::Copy(std::span<const gpu::CopyOp> ops) {
  uint64_t total = 0;
  for (const gpu::CopyOp& op : ops) total += op.bytes;
  if (!helpers_ || total <= o_.chunk_bytes) return CopyHere(ops);
  auto job = std::make_shared<Job>();
  for (const gpu::CopyOp& op : ops) {
    for (uint64_t at = 0; at < op.bytes; at += o_.chunk_bytes) {
      job->chunks.push_back({op.dst + at, op.src + at, std::min(o_.chunk_bytes, op.bytes - at)});
    }
  }
  // One invitation per helper that could take a chunk the caller does not.
  const size_t invite = std::min<size_t>(o_.threads, job->chunks.size() - 1);
  for (size_t i = 0; i < invite; ++i) {
    std::shared_ptr<Job> j = job;
    if (!helpers_->TryPush(j)) break;  // full: the caller copies the rest
  }
  Work(*job);
  MutexLock l(job->mu);
  while (job->done != job->chunks.size()) job->cv.Wait(job->mu);
}

}  // namespace orbitkv
