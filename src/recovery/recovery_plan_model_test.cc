// Model test of the recovery planner: random descriptions (every kind, block
// sizes that are multiples of the key block, windows shorter and longer than
// the chain, checkpoint intervals and explicit positions), random chains,
// random presence of each piece in DRAM and on SSD, random byte budgets, then
// rounds of random evictions (DRAM, SSD, both) and promotions, re-planned
// after each. Every plan must equal a deliberately simple reference: try
// every P from the longest down and check each requirement piece by piece.
// The planner must also ask the oracle about each piece at most once.
//
// ORBITKV_RECOVERY_SEED=S ORBITKV_RECOVERY_CASES=N reruns N cases from S; a
// failure prints the seed of its case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "recovery/model_description.h"
#include "recovery/recovery_plan.h"

namespace orbitkv::recovery {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

// Where every piece is: per group, per piece (block b, or the checkpoint at
// position (i * key_block_tokens)), a DRAM and an SSD flag.
struct World {
  const ModelDescription* d = nullptr;
  uint64_t chain = 0;
  std::vector<std::vector<uint8_t>> dram, ssd;

  uint64_t Pieces(const GroupDescription& g) const {
    return g.kind == GroupKind::kRecurrent ? chain + 1
                                           : chain * d->key_block_tokens / g.block_tokens;
  }
  // Piece slot of a checkpoint: its position in key blocks.
  uint64_t Slot(const GroupDescription& g, uint64_t index) const {
    return g.kind == GroupKind::kRecurrent ? index / d->key_block_tokens : index;
  }
  Tier At(uint32_t g, uint64_t index) const {
    const uint64_t s = Slot(d->groups[g], index);
    if (s >= dram[g].size()) return Tier::kNone;
    return dram[g][s] ? Tier::kDram : ssd[g][s] ? Tier::kSsd : Tier::kNone;
  }
};

class WorldOracle : public PresenceOracle {
 public:
  explicit WorldOracle(const World& w) : w_(w) {
    for (const GroupDescription& g : w.d->groups) asks_.emplace_back(w.Pieces(g), 0);
  }
  Tier Block(uint32_t g, uint64_t b) override {
    if (g >= asks_.size() || w_.d->groups[g].kind == GroupKind::kRecurrent) {
      errors << "Block() on group " << g << "; ";
      return Tier::kNone;
    }
    return Ask(g, b);
  }
  Tier Checkpoint(uint32_t g, uint64_t p) override {
    const ModelDescription& d = *w_.d;
    if (g >= asks_.size() || d.groups[g].kind != GroupKind::kRecurrent || p == 0 ||
        p % d.groups[g].block_tokens != 0) {
      errors << "Checkpoint(" << g << ", " << p << ") is not a checkpoint; ";
      return Tier::kNone;
    }
    return Ask(g, p);
  }
  std::ostringstream errors;

 private:
  Tier Ask(uint32_t g, uint64_t index) {
    const uint64_t s = w_.Slot(w_.d->groups[g], index);
    if (s >= asks_[g].size()) {
      errors << "piece " << index << " of group " << g << " is beyond the chain; ";
      return Tier::kNone;
    }
    if (++asks_[g][s] > 1) errors << "piece " << index << " of group " << g << " asked twice; ";
    return w_.At(g, index);
  }
  const World& w_;
  std::vector<std::vector<int>> asks_;
};

// ---- the reference: every P, every piece ---------------------------------------

bool Scheduled(const GroupDescription& g, uint64_t p) {
  if (g.checkpoint_interval_tokens != 0) return p % g.checkpoint_interval_tokens == 0;
  return std::find(g.checkpoint_positions.begin(), g.checkpoint_positions.end(), p) !=
         g.checkpoint_positions.end();
}

// Is block b of window group g needed for prefix p: does it overlap [p - W, p)?
bool InWindow(const GroupDescription& g, uint64_t b, uint64_t p) {
  return (b + 1) * g.block_tokens > p || (b + 1) * g.block_tokens + g.window_tokens > p;
}

// The plan's sources for p, or false when p is not recoverable.
bool Sources(const World& w, uint64_t p, std::vector<PlanSource>* out) {
  const ModelDescription& d = *w.d;
  out->clear();
  for (uint32_t gi = 0; gi < d.groups.size(); ++gi) {
    const GroupDescription& g = d.groups[gi];
    if (g.kind == GroupKind::kRecurrent) {
      if (p == 0) continue;
      if (!Scheduled(g, p) || w.At(gi, p) == Tier::kNone) return false;
      out->push_back({gi, p, p / d.key_block_tokens - 1, w.At(gi, p), g.bytes});
      continue;
    }
    if (p % g.block_tokens != 0) return false;
    for (uint64_t b = 0; b < p / g.block_tokens; ++b) {
      if (g.kind == GroupKind::kSlidingWindow && !InWindow(g, b, p)) continue;
      if (w.At(gi, b) == Tier::kNone) return false;
      const uint64_t key = ((b + 1) * g.block_tokens) / d.key_block_tokens - 1;
      out->push_back({gi, b, key, w.At(gi, b), g.bytes});
    }
  }
  return true;
}

uint64_t Bytes(const std::vector<PlanSource>& s) {
  uint64_t n = 0;
  for (const PlanSource& x : s) n += x.bytes;
  return n;
}

RecoveryPlan Reference(const World& w, uint64_t max_bytes) {
  const ModelDescription& d = *w.d;
  const uint64_t kb = d.key_block_tokens;
  RecoveryPlan plan;
  std::vector<PlanSource> s;
  auto longest = [&](uint64_t budget) {
    for (uint64_t k = w.chain + 1; k-- > 0;) {
      if (Sources(w, k * kb, &s) && Bytes(s) <= budget) return k * kb;
    }
    return uint64_t{0};
  };
  const uint64_t free = longest(kNoByteBudget);
  plan.prefix_tokens = longest(max_bytes);
  plan.budget_limited = plan.prefix_tokens < free;
  plan.prefix_keys = plan.prefix_tokens / kb;
  Sources(w, plan.prefix_tokens, &plan.sources);
  plan.source_bytes = Bytes(plan.sources);
  for (uint64_t k = w.chain + 1; k-- > 0;) {
    bool all = true;
    for (uint32_t gi = 0; gi < d.groups.size() && all; ++gi) {
      const GroupDescription& g = d.groups[gi];
      if (g.kind != GroupKind::kFullAttention) continue;
      all = (k * kb) % g.block_tokens == 0;
      for (uint64_t b = 0; all && b < k * kb / g.block_tokens; ++b)
        all = w.At(gi, b) != Tier::kNone;
    }
    if (all) {
      plan.attention_hit_tokens = k * kb;
      break;
    }
  }
  const uint64_t p = plan.prefix_tokens;
  for (uint32_t gi = 0; gi < d.groups.size(); ++gi) {
    const GroupDescription& g = d.groups[gi];
    NotNeeded n{gi, 0, 0, 0};
    if (g.kind == GroupKind::kSlidingWindow) {
      for (uint64_t b = 0; b < p / g.block_tokens; ++b) n.blocks_end += !InWindow(g, b, p);
      n.pieces = n.blocks_end;
    } else if (g.kind == GroupKind::kRecurrent) {
      for (uint64_t q = g.block_tokens; q < p; q += g.block_tokens) n.pieces += Scheduled(g, q);
    } else {
      continue;
    }
    n.bytes = n.pieces * g.bytes;
    plan.not_needed_bytes += n.bytes;
    plan.not_needed.push_back(n);
  }
  return plan;
}

// ---- random cases ---------------------------------------------------------------

ModelDescription RandomDescription(std::mt19937_64& rng) {
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  ModelDescription d;
  const uint64_t kbs[] = {1, 4, 16};
  d.key_block_tokens = kbs[pick(0, 2)];
  const uint64_t groups = pick(1, 4);
  for (uint32_t i = 0; i < groups; ++i) {
    GroupDescription g;
    g.name = "g" + std::to_string(i);
    g.kind = static_cast<GroupKind>(pick(1, 3));
    g.storage_group = i;
    const uint64_t mult[] = {1, 1, 1, 2, 3, 4};
    g.block_tokens = d.key_block_tokens * mult[pick(0, 5)];
    g.bytes = pick(1, 1000000);
    if (g.kind == GroupKind::kSlidingWindow) g.window_tokens = pick(1, 10 * g.block_tokens);
    if (g.kind == GroupKind::kRecurrent) {
      if (pick(0, 1)) {
        g.checkpoint_interval_tokens = g.block_tokens * pick(1, 4);
      } else {
        for (uint64_t p = g.block_tokens; p <= 64 * g.block_tokens; p += g.block_tokens) {
          if (pick(0, 3) == 0) g.checkpoint_positions.push_back(p);
        }
        if (g.checkpoint_positions.empty()) g.checkpoint_positions.push_back(g.block_tokens);
      }
    }
    d.groups.push_back(g);
  }
  return d;
}

World RandomWorld(const ModelDescription& d, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  World w;
  w.d = &d;
  w.chain = u(rng) < 0.1 ? rng() % 160 : rng() % 48;
  for (const GroupDescription& g : d.groups) {
    const uint64_t n = w.Pieces(g);
    // Mostly present up to a cutoff, sparser after it: long hits with holes.
    const double before = g.kind == GroupKind::kFullAttention ? 0.98 : 0.7 + 0.3 * u(rng);
    const double after = 0.3 * u(rng);
    const uint64_t cutoff = n == 0 ? 0 : n / 2 + rng() % (n / 2 + 1);
    std::vector<uint8_t> dram(n), ssd(n);
    for (uint64_t i = 0; i < n; ++i) {
      const bool present = u(rng) < (i < cutoff ? before : after);
      if (!present) continue;
      const double where = u(rng);
      dram[i] = where < 0.6;
      ssd[i] = where > 0.3;
    }
    w.dram.push_back(std::move(dram));
    w.ssd.push_back(std::move(ssd));
  }
  return w;
}

void Evict(World& w, std::mt19937_64& rng) {
  const uint64_t rounds = 1 + rng() % 4;
  for (uint64_t r = 0; r < rounds; ++r) {
    const size_t g = rng() % w.dram.size();
    if (w.dram[g].empty()) continue;
    const size_t i = rng() % w.dram[g].size();
    switch (rng() % 4) {
      case 0:  // DRAM LRU eviction: the SSD copy stays
        w.dram[g][i] = 0;
        break;
      case 1:  // the SSD ring overwrote it
        w.ssd[g][i] = 0;
        break;
      case 2:  // both
        w.dram[g][i] = w.ssd[g][i] = 0;
        break;
      default:  // promoted into DRAM by a restore (if it is anywhere)
        w.dram[g][i] = w.dram[g][i] | w.ssd[g][i];
    }
  }
}

std::string Describe(const World& w, uint64_t max_bytes) {
  std::ostringstream o;
  o << "key_block_tokens " << w.d->key_block_tokens << ", chain " << w.chain << ", budget "
    << max_bytes << "\n";
  for (size_t i = 0; i < w.d->groups.size(); ++i) {
    const GroupDescription& g = w.d->groups[i];
    o << "  group " << i << " kind " << int(g.kind) << " bt " << g.block_tokens << " W "
      << g.window_tokens << " N " << g.checkpoint_interval_tokens << " positions "
      << g.checkpoint_positions.size() << " present ";
    for (size_t s = 0; s < w.dram[i].size(); ++s) {
      o << (w.dram[i][s] ? 'D' : w.ssd[i][s] ? 'S' : '.');
    }
    o << "\n";
  }
  return o.str();
}

::testing::AssertionResult SamePlan(const RecoveryPlan& got, const RecoveryPlan& want) {
  auto fail = [&](const std::string& what, uint64_t g, uint64_t w) {
    return ::testing::AssertionFailure() << what << ": got " << g << ", want " << w;
  };
  if (got.prefix_tokens != want.prefix_tokens) {
    return fail("prefix_tokens", got.prefix_tokens, want.prefix_tokens);
  }
  if (got.prefix_keys != want.prefix_keys)
    return fail("prefix_keys", got.prefix_keys, want.prefix_keys);
  if (got.attention_hit_tokens != want.attention_hit_tokens) {
    return fail("attention_hit_tokens", got.attention_hit_tokens, want.attention_hit_tokens);
  }
  if (got.budget_limited != want.budget_limited) {
    return fail("budget_limited", got.budget_limited, want.budget_limited);
  }
  if (got.sources != want.sources)
    return fail("sources (count)", got.sources.size(), want.sources.size());
  if (got.source_bytes != want.source_bytes)
    return fail("source_bytes", got.source_bytes, want.source_bytes);
  if (got.not_needed != want.not_needed) {
    return fail("not_needed (groups)", got.not_needed.size(), want.not_needed.size());
  }
  if (got.not_needed_bytes != want.not_needed_bytes) {
    return fail("not_needed_bytes", got.not_needed_bytes, want.not_needed_bytes);
  }
  return ::testing::AssertionSuccess();
}

TEST(RecoveryPlanModel, EqualsTheReferenceUnderRandomPresenceAndEvictions) {
  const uint64_t seed = EnvOr("ORBITKV_RECOVERY_SEED", 20261201);
  const uint64_t cases = EnvOr("ORBITKV_RECOVERY_CASES", 4000);
  uint64_t plans = 0, nonzero = 0, below_hit = 0, budget_cuts = 0;
  for (uint64_t c = 0; c < cases; ++c) {
    const uint64_t case_seed = seed + c;
    std::mt19937_64 rng(case_seed);
    const ModelDescription d = RandomDescription(rng);
    ASSERT_TRUE(ValidateModelDescription(d).ok()) << ValidateModelDescription(d).message();
    World w = RandomWorld(d, rng);
    for (int round = 0; round < 4; ++round) {
      uint64_t max_bytes = kNoByteBudget;
      if (rng() % 3 == 0) {
        const RecoveryPlan free = Reference(w, kNoByteBudget);
        max_bytes = free.source_bytes == 0 ? 0 : rng() % (free.source_bytes + 1);
      }
      WorldOracle oracle(w);
      Result<RecoveryPlan> got = CompileRecoveryPlan(d, w.chain, oracle, max_bytes);
      ASSERT_TRUE(got.ok()) << got.status().message();
      const RecoveryPlan want = Reference(w, max_bytes);
      ASSERT_TRUE(SamePlan(*got, want))
          << "case seed " << case_seed << " round " << round
          << " (rerun: ORBITKV_RECOVERY_SEED=" << case_seed << " ORBITKV_RECOVERY_CASES=1)\n"
          << Describe(w, max_bytes);
      ASSERT_EQ(oracle.errors.str(), "") << "case seed " << case_seed << " round " << round;
      ++plans;
      nonzero += want.prefix_tokens > 0;
      below_hit += want.prefix_tokens > 0 && want.prefix_tokens < want.attention_hit_tokens;
      budget_cuts += want.budget_limited;
      Evict(w, rng);
    }
  }
  // The cases must exercise what they claim to.
  if (cases >= 1000) {
    EXPECT_GT(nonzero, plans / 4);
    EXPECT_GT(below_hit, plans / 10);
    EXPECT_GT(budget_cuts, plans / 20);
  }
  std::printf(
      "recovery model test: %llu plans from seed %llu: %llu with P > 0, %llu with 0 < P "
      "< the attention hit, %llu budget cuts\n",
      static_cast<unsigned long long>(plans), static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(nonzero), static_cast<unsigned long long>(below_hit),
      static_cast<unsigned long long>(budget_cuts));
}

}  // namespace
}  // namespace orbitkv::recovery
