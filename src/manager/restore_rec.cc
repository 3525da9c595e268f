#include <cassert>

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
  env->seconds->Observe(ToSeconds(env->clock->Now() - start));
  RestoreResult res;
  {
    MutexLock l(mu_);
    res.blocks = results_;
  }
  Done d = std::move(done);
  env->registry->ForgetRestore(id);
  inst.Reset();  // the instance may unregister now
  d(std::move(res));
}

}  // namespace orbitkv
