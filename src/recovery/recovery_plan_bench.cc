// Micro-benchmark of CompileRecoveryPlan on the query path's sizes: chains of
// up to 8192 keys, a Qwen3-Next-like description (full attention, a window,
// recurrent checkpoints), pieces found in a flat array (the planner's own
// cost; the Manager's oracle adds its lookups). Reports oracle calls per plan.
#include <benchmark/benchmark.h>

#include <vector>

#include "recovery/model_description.h"
#include "recovery/recovery_plan.h"
#include "recovery/recovery_test_util.h"

namespace orbitkv::recovery {
namespace {

class ArrayOracle : public PresenceOracle {
 public:
  ArrayOracle(uint64_t chain, uint64_t ckpt_hole) : chain_(chain), hole_(ckpt_hole) {}
  Tier Block(uint32_t, uint64_t b) override { return b < chain_ ? Tier::kDram : Tier::kNone; }
  // Checkpoints are present except in the last `hole_` blocks of the chain.
  Tier Checkpoint(uint32_t, uint64_t p) override {
    return p / 16 + hole_ <= chain_ ? Tier::kSsd : Tier::kNone;
  }

 private:
  uint64_t chain_, hole_;
};

void BM_Plan(benchmark::State& state, uint64_t interval, uint64_t hole) {
  const ModelDescription d = testing::Describe(
      16, {testing::Full("attn", 0, 16, 1 << 20), testing::Window("swa", 1, 16, 1 << 19, 4096),
           testing::Recurrent("gdn", 2, 16, 37 << 20, interval)});
  const uint64_t chain = static_cast<uint64_t>(state.range(0));
  ArrayOracle o(chain, hole);
  uint64_t calls = 0;
  for (auto _ : state) {
    Result<RecoveryPlan> p = CompileRecoveryPlan(d, chain, o);
    benchmark::DoNotOptimize(p);
    calls = p->oracle_calls;
  }
  state.counters["oracle_calls"] = static_cast<double>(calls);
}

// Every block checkpointed, all present: the common hit.
BENCHMARK_CAPTURE(BM_Plan, every_block, 16, 0)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(8192)
    ->Unit(benchmark::kMicrosecond);
// Checkpoints every 256 tokens, the newest 600 blocks' ones missing: P walks down.
BENCHMARK_CAPTURE(BM_Plan, sparse_with_hole, 256, 600)
    ->Arg(1024)
    ->Arg(8192)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace orbitkv::recovery

BENCHMARK_MAIN();
