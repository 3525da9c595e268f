// The planner walks P downwards only. Each group is a constraint that, given
// a candidate q, answers the largest P' <= q it allows, asking the oracle
// only about pieces it has not asked about before; the candidate is passed
// through every constraint until none lowers it. Because candidates only
// fall, each constraint keeps what it learned: a sliding window keeps the
// run of present blocks below the candidate, a recurrent group the cursor on
// its schedule (everything above it was absent). The budget is one more
// constraint, applied after the unbudgeted answer is known, so that
// budget_limited is exact.
#include "recovery/recovery_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "recovery/object_keys.h"

namespace orbitkv::recovery {
namespace {

constexpr uint8_t kUnknown = 0xff;

class CountingOracle {
 public:
  explicit CountingOracle(PresenceOracle& o) : o_(o) {}
  Tier Block(uint32_t g, uint64_t b) {
    ++calls;
    return o_.Block(g, b);
  }
  Tier Checkpoint(uint32_t g, uint64_t p) {
    ++calls;
    return o_.Checkpoint(g, p);
  }
  uint64_t calls = 0;

 private:
  PresenceOracle& o_;
};

// Full attention: blocks [0, hit) present, walked upwards once.
struct FullGroup {
  uint32_t group = 0;
  uint64_t bt = 0;
  std::vector<Tier> tiers;  // of blocks [0, hit)

  void Walk(CountingOracle& o, uint64_t max_blocks) {
    tiers.reserve(max_blocks);
    while (tiers.size() < max_blocks) {
      const Tier t = o.Block(group, tiers.size());
      if (t == Tier::kNone) break;
      tiers.push_back(t);
    }
  }
  uint64_t HitTokens() const { return tiers.size() * bt; }
};

// The oldest block of a window group covering [top * bt - W, top * bt).
uint64_t WindowFirstBlock(uint64_t top, uint64_t bt, uint64_t window) {
  const uint64_t end = top * bt;
  return end > window ? (end - window) / bt : 0;
}

// Sliding window: blocks [run_low, run_top) are known present.
struct WindowGroup {
  uint32_t group = 0;
  uint64_t bt = 0;
  uint64_t window = 0;
  std::vector<uint8_t> tiers;  // per block: a Tier, or kUnknown
  bool started = false;
  uint64_t run_low = 0, run_top = 0;

  uint64_t FirstBlock(uint64_t top) const { return WindowFirstBlock(top, bt, window); }

  uint64_t Largest(CountingOracle& o, uint64_t q) {
    uint64_t top = q / bt;
    if (!started || top < run_low) {
      started = true;  // nothing below top was asked yet: every ask was at run_low or above
      run_low = run_top = top;
    } else {
      run_top = std::min(run_top, top);
    }
    for (;;) {
      const uint64_t need = FirstBlock(top);
      while (run_low > need) {
        const uint64_t j = run_low - 1;
        const Tier t = o.Block(group, j);
        tiers[j] = static_cast<uint8_t>(t);
        if (t == Tier::kNone) {
          top = run_low = run_top = j;  // no window ending above block j is whole
          break;
        }
        run_low = j;
      }
      if (run_low <= FirstBlock(top)) return top * bt;
    }
  }
};

// Recurrent: a checkpoint at the candidate. Positions above `cursor` were absent.
struct RecurrentGroup {
  uint32_t group = 0;
  const GroupDescription* g = nullptr;
  uint64_t present_at = 0;  // a position known present (0: none)
  Tier present_tier = Tier::kNone;

  // The largest scheduled position <= q, or 0.
  uint64_t ScheduledAtOrBelow(uint64_t q) const {
    if (g->checkpoint_interval_tokens != 0) {
      return q / g->checkpoint_interval_tokens * g->checkpoint_interval_tokens;
    }
    auto it = std::upper_bound(g->checkpoint_positions.begin(), g->checkpoint_positions.end(), q);
    return it == g->checkpoint_positions.begin() ? 0 : *(it - 1);
  }
  uint64_t ScheduledBelow(uint64_t p) const { return p == 0 ? 0 : ScheduledAtOrBelow(p - 1); }
  uint64_t CountBelow(uint64_t p) const {  // scheduled positions in (0, p)
    if (p == 0) return 0;
    if (g->checkpoint_interval_tokens != 0) return (p - 1) / g->checkpoint_interval_tokens;
    return static_cast<uint64_t>(
        std::lower_bound(g->checkpoint_positions.begin(), g->checkpoint_positions.end(), p) -
        g->checkpoint_positions.begin());
  }

  uint64_t Largest(CountingOracle& o, uint64_t q) {
    // Every earlier answer a was present or 0, and q <= a: positions in (q, a)
    // were never asked, those above a were absent.
    for (uint64_t p = ScheduledAtOrBelow(q); p > 0; p = ScheduledBelow(p)) {
      if (p == present_at) return p;
      const Tier t = o.Checkpoint(group, p);
      if (t != Tier::kNone) {
        present_at = p;
        present_tier = t;
        return p;
      }
    }
    return 0;
  }
};

struct Planner {
  const ModelDescription& d;
  CountingOracle oracle;
  std::vector<FullGroup> full;
  std::vector<WindowGroup> windows;
  std::vector<RecurrentGroup> recurrent;

  // Bytes of the plan for P, P on every grid (floored otherwise: monotone in P).
  uint64_t Cost(uint64_t p) const {
    uint64_t c = 0;
    for (const GroupDescription& g : d.groups) {
      switch (g.kind) {
        case GroupKind::kFullAttention:
          c += p / g.block_tokens * g.bytes;
          break;
        case GroupKind::kSlidingWindow:
          c += std::min(p / g.block_tokens,
                        (g.window_tokens + g.block_tokens - 1) / g.block_tokens) *
               g.bytes;
          break;
        case GroupKind::kRecurrent:
          c += p > 0 ? g.bytes : 0;
          break;
      }
    }
    return c;
  }

  // The largest P on the key grid, <= limit, within max_bytes (Cost is monotone).
  uint64_t BudgetCap(uint64_t limit, uint64_t max_bytes) const {
    const uint64_t kb = d.key_block_tokens;
    uint64_t lo = 0, hi = limit / kb;  // answer in key blocks, in [lo, hi]
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (Cost(mid * kb) <= max_bytes) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo * kb;
  }

  uint64_t OnFullGrids(uint64_t q) const {
    for (;;) {
      const uint64_t before = q;
      for (const FullGroup& f : full) q = std::min(q / f.bt * f.bt, f.HitTokens());
      if (q == before) return q;
    }
  }

  uint64_t Settle(uint64_t q) {
    for (;;) {
      const uint64_t before = q;
      q = OnFullGrids(q);
      for (WindowGroup& w : windows) q = w.Largest(oracle, q);
      for (RecurrentGroup& r : recurrent) q = r.Largest(oracle, q);
      if (q == before) return q;
    }
  }
};

}  // namespace

Result<RecoveryPlan> CompileRecoveryPlan(const ModelDescription& d, uint64_t chain_length,
                                         PresenceOracle& oracle, uint64_t max_bytes) {
  if (chain_length > kMaxChainKeys || chain_length > kMaxSequenceTokens / d.key_block_tokens) {
    return Status::InvalidArgument(fmt::format(
        "recovery plan: a chain of {} keys of {} tokens is longer than the limit ({} keys, {} "
        "tokens)",
        chain_length, d.key_block_tokens, kMaxChainKeys, kMaxSequenceTokens));
  }
  const uint64_t chain_tokens = chain_length * d.key_block_tokens;
  Planner pl{d, CountingOracle(oracle), {}, {}, {}};
  uint64_t bound = chain_tokens;
  for (uint32_t i = 0; i < d.groups.size(); ++i) {
    const GroupDescription& g = d.groups[i];
    switch (g.kind) {
      case GroupKind::kFullAttention:
        pl.full.push_back({i, g.block_tokens, {}});
        break;
      case GroupKind::kSlidingWindow:
        pl.windows.push_back({i, g.block_tokens, g.window_tokens,
                              std::vector<uint8_t>(chain_tokens / g.block_tokens, kUnknown)});
        break;
      case GroupKind::kRecurrent:
        pl.recurrent.push_back({i, &g});
        break;
    }
  }
  for (FullGroup& f : pl.full) {
    f.Walk(pl.oracle, bound / f.bt);
    bound = std::min(bound, f.HitTokens());
  }

  RecoveryPlan plan;
  plan.attention_hit_tokens = pl.OnFullGrids(chain_tokens);
  uint64_t p = pl.Settle(bound);
  if (pl.Cost(p) > max_bytes) {
    p = pl.Settle(pl.BudgetCap(p, max_bytes));
    plan.budget_limited = true;
  }

  plan.prefix_tokens = p;
  plan.prefix_keys = p / d.key_block_tokens;
  auto add = [&](uint32_t group, uint64_t index, uint64_t key_index, Tier tier) {
    plan.sources.push_back({group, index, key_index, tier, d.groups[group].bytes});
    plan.source_bytes += d.groups[group].bytes;
  };
  size_t count = 0;
  for (const GroupDescription& g : d.groups) {
    const uint64_t end = p / g.block_tokens;
    count += g.kind == GroupKind::kFullAttention ? end
             : g.kind == GroupKind::kSlidingWindow
                 ? end - WindowFirstBlock(end, g.block_tokens, g.window_tokens)
                 : (p > 0 ? 1 : 0);
  }
  plan.sources.reserve(count);  // one allocation: a plan of 8192 blocks is ~1/3 MiB
  size_t fi = 0, wi = 0, ri = 0;
  for (uint32_t i = 0; i < d.groups.size(); ++i) {
    const GroupDescription& g = d.groups[i];
    const uint64_t end = p / g.block_tokens;
    switch (g.kind) {
      case GroupKind::kFullAttention: {
        const FullGroup& f = pl.full[fi++];
        for (uint64_t b = 0; b < end; ++b) add(i, b, BlockKeyIndex(d, g, b), f.tiers[b]);
        break;
      }
      case GroupKind::kSlidingWindow: {
        const WindowGroup& w = pl.windows[wi++];
        const uint64_t first = w.FirstBlock(end);
        for (uint64_t b = first; b < end; ++b) {
          add(i, b, BlockKeyIndex(d, g, b), static_cast<Tier>(w.tiers[b]));
        }
        plan.not_needed.push_back({i, first, first, first * g.bytes});
        break;
      }
      case GroupKind::kRecurrent: {
        const RecurrentGroup& r = pl.recurrent[ri++];
        if (p > 0) add(i, p, CheckpointKeyIndex(d, p), r.present_tier);
        const uint64_t older = r.CountBelow(p);
        plan.not_needed.push_back({i, 0, older, older * g.bytes});
        break;
      }
    }
  }
  for (const NotNeeded& n : plan.not_needed) plan.not_needed_bytes += n.bytes;
  plan.oracle_calls = pl.oracle.calls;
  return plan;
}

}  // namespace orbitkv::recovery
