// ReadStaging: the bounded pinned staging that SSD demand reads, warm-up reads
// and cuFile write headers use, carved from --pool-size so reads never compete
// with published objects for room. AllocateAll() takes room for a set of
// objects all or nothing, waiting (bounded) for releases, so readers never
// hold part of what they need while they wait and cannot deadlock each other.
// Thread-safe; mu_ is a leaf lock except for the pool's own lock inside it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "store/dram_cache.h"

namespace orbitkv {

class ReadStaging {
 public:
  // `run_bytes`: the most one run of Runs() holds (--ssd-read-run).
  ReadStaging(std::unique_ptr<DramCache> pool, uint64_t run_bytes)
      : pool_(std::move(pool)), run_bytes_(run_bytes) {}

  // Room for `bytes` now, or ResourceExhausted.
  Result<DramView> TryAllocate(uint64_t bytes) { return pool_->AllocateScratch(bytes); }
  // Room for every size (4 KiB aligned each), or ResourceExhausted when they
  // exceed the whole staging or it stayed full for `wait`.
  Status AllocateAll(const std::vector<uint64_t>& sizes, std::vector<DramView>* out,
                     std::chrono::milliseconds wait = std::chrono::seconds(10)) EXCLUDES(mu_);
  // Returns room and wakes the waiters.
  void Release(const DramView& view) EXCLUDES(mu_);
  // Splits objects into runs [begin, end) whose staging fits run_bytes, half
  // the staging and half their total (two runs at least, of two objects or
  // more), so one run can be copied out while the next is read and the copy
  // left after the last read is short. An object larger than that runs alone.
  std::vector<std::pair<size_t, size_t>> Runs(const std::vector<uint64_t>& sizes) const;

  DramStats stats() const { return pool_->stats(); }

 private:
  const std::unique_ptr<DramCache> pool_;  // thread-safe itself
  const uint64_t run_bytes_;
  Mutex mu_;  // pairs releases with AllocateAll's wait
  CondVar released_;
};

}  // namespace orbitkv
