#include <algorithm>
#include <cassert>
#include <chrono>

#include "manager/query_table.h"
#include "manager/restore.h"

namespace orbitkv {

void RestoreRec::Init(std::vector<uint32_t> blocks) {
  MutexLock l(mu_);
  results_.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) results_[i].block = blocks[i];
  finished_.assign(blocks.size(), false);
  remaining_ = blocks.size();
}

void RestoreRec::StartSsd(size_t blocks, Histogram* cost) {
  MutexLock l(mu_);
  ssd_remaining_ = blocks;
  ssd_start_ = env->clock->Now();
  ssd_cost_ = cost;
}

void RestoreRec::SetSsdCost(Histogram* cost) {
  MutexLock l(mu_);
  ssd_cost_ = cost;
}

void RestoreRec::Stamp(Stage stage) {
  const int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(env->clock->Now() - start).count();
  MutexLock l(mu_);
  switch (stage) {
    case Stage::kSourceReady:
      if (timeline_.source_ready_ns < 0) timeline_.source_ready_ns = ns;
      break;
    case Stage::kIoSubmitted:
      if (timeline_.io_submitted_ns < 0) timeline_.io_submitted_ns = ns;
      break;
    case Stage::kIoComplete:
      timeline_.io_complete_ns = std::max(timeline_.io_complete_ns, ns);
      break;
    case Stage::kCopyComplete:
      timeline_.copy_complete_ns = std::max(timeline_.copy_complete_ns, ns);
      break;
  }
}

void RestoreRec::Finish(size_t result, Tier tier, Status st) {
  bool last = false;
  {
    MutexLock l(mu_);
    assert(!finished_[result] && "a restore block finished twice");
    finished_[result] = true;
    if (tier == Tier::kSsd && ssd_remaining_ > 0 && --ssd_remaining_ == 0 && ssd_cost_) {
      ssd_cost_->Observe(ToSeconds(env->clock->Now() - ssd_start_));
    }
    results_[result].source = tier;
    results_[result].status = std::move(st);
    (results_[result].status.ok() ? env->blocks_ok : env->blocks_failed)->Inc();
    last = --remaining_ == 0;
  }
  if (!last) return;
  const Clock::Duration took = env->clock->Now() - start;
  env->seconds->Observe(ToSeconds(took));
  RestoreResult res;
  {
    MutexLock l(mu_);
    res.blocks = results_;
    if (want_timeline) {
      res.timeline = timeline_;
      res.timeline->done_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
    }
  }
  Done d = std::move(done);
  env->registry->ForgetRestore(id);
  inst.Reset();  // the instance may unregister now
  d(std::move(res));
}

}  // namespace orbitkv
