// RestoreRec: one restore in flight, from StartRestore to its last block. It
// owns what it took from its query (RestoreBlock) and holds its instance open
// (InstanceGuard) until every block finished. Every block is finished exactly
// once, by whichever part moved its bytes (the caller's thread for DRAM
// blocks, an SSD route for SSD ones), through Finish(); the last Finish
// records the latency, leaves the restore registry (QueryTable), releases the
// instance and runs `done`. Thread-safe as annotated.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/mutex.h"
#include "manager/instance.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/clock.h"
#include "orbitkv/metrics.h"

namespace orbitkv {

class QueryTable;

// What finishing a block reports to (constant; outlives every restore).
struct RestoreEnv {
  Clock* clock = nullptr;
  Counter* blocks_ok = nullptr;
  Counter* blocks_failed = nullptr;
  Histogram* seconds = nullptr;  // start to last block
  QueryTable* registry = nullptr;
};

class RestoreRec {
 public:
  using Done = std::function<void(Result<RestoreResult>)>;

  // ---- constant once StartRestore registered it ------------------------------
  RestoreId id = 0;
  SessionId session = 0;
  InstanceId instance = 0;
  Clock::TimePoint start;
  const RestoreEnv* env = nullptr;
  Done done;           // moved out by the last Finish
  InstanceGuard inst;  // released by the last Finish
  // The cuFile route's job of this restore, for CancelRestore (0: none).
  std::atomic<uint64_t> gpu_job{0};

  // `blocks` results, in request order (BlockResult::block set by the caller).
  void Init(std::vector<uint32_t> blocks) EXCLUDES(mu_);
  // Block `result` is done: its tier and status. The last block completes the
  // restore. REQUIRES: called once per block.
  void Finish(size_t result, Tier tier, Status status) EXCLUDES(mu_);
  // The SSD part: `blocks` SSD blocks started now; `cost` (may be null) gets
  // the time from now to the last of them. SetSsdCost changes the histogram
  // (a route that falls back). REQUIRES: before any SSD block finished.
  void StartSsd(size_t blocks, Histogram* cost) EXCLUDES(mu_);
  void SetSsdCost(Histogram* cost) EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::vector<BlockResult> results_ GUARDED_BY(mu_);
  std::vector<bool> finished_ GUARDED_BY(mu_);
  size_t remaining_ GUARDED_BY(mu_) = 0;
  size_t ssd_remaining_ GUARDED_BY(mu_) = 0;
  Histogram* ssd_cost_ GUARDED_BY(mu_) = nullptr;
  Clock::TimePoint ssd_start_ GUARDED_BY(mu_);
};

}  // namespace orbitkv
