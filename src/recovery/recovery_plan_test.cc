// Hand-written recovery plans: dense only, window only, a recurrent group
// whose checkpoint puts P below the attention hit, a missing block inside a
// window, an empty chain, mixed block sizes, the byte budget, and refusals.
#include "recovery/recovery_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "recovery/model_description.h"
#include "recovery/recovery_test_util.h"

namespace orbitkv::recovery {
namespace {

using namespace testing;  // NOLINT: the description helpers

constexpr Tier D = Tier::kDram;
constexpr Tier S = Tier::kSsd;

RecoveryPlan Plan(const ModelDescription& d, uint64_t chain, MapOracle& o,
                  uint64_t max_bytes = kNoByteBudget) {
  EXPECT_TRUE(ValidateModelDescription(d).ok()) << ValidateModelDescription(d).message();
  o.ClearAsks();
  Result<RecoveryPlan> p = CompileRecoveryPlan(d, chain, o, max_bytes);
  EXPECT_TRUE(p.ok()) << p.status().message();
  EXPECT_LE(o.MaxAsks(), 1) << "a piece was asked twice";
  return p.ok() ? *p : RecoveryPlan{};
}

PlanSource Src(uint32_t g, uint64_t index, uint64_t key, Tier t, uint64_t bytes) {
  return {g, index, key, t, bytes};
}

TEST(RecoveryPlan, DenseOnlyIsTheLongestPresentPrefix) {
  const ModelDescription d = Describe(16, {Full("attn", 0, 16, 100)});
  MapOracle o;
  for (uint64_t b = 0; b < 7; ++b) o.SetBlock(0, b, b % 2 ? S : D);
  o.SetBlock(0, 8, D);  // after the hole: not recoverable
  const RecoveryPlan p = Plan(d, 10, o);
  EXPECT_EQ(p.prefix_tokens, 112u);
  EXPECT_EQ(p.prefix_keys, 7u);
  EXPECT_EQ(p.attention_hit_tokens, 112u);
  ASSERT_EQ(p.sources.size(), 7u);
  EXPECT_EQ(p.sources[1], Src(0, 1, 1, S, 100));
  EXPECT_EQ(p.source_bytes, 700u);
  EXPECT_TRUE(p.not_needed.empty());
  EXPECT_EQ(p.oracle_calls, 8u);  // blocks 0..7
  EXPECT_FALSE(p.budget_limited);
}

TEST(RecoveryPlan, WindowOnlyNeedsTheTrailingBlocks) {
  const ModelDescription d = Describe(16, {Window("swa", 0, 16, 10, 32)});
  MapOracle o;
  for (uint64_t b : {5, 6, 7, 8}) o.SetBlock(0, b, D);
  const RecoveryPlan p = Plan(d, 10, o);
  // P = 160 needs blocks 8, 9 (9 is absent); P = 144 needs 7, 8.
  EXPECT_EQ(p.prefix_tokens, 144u);
  EXPECT_EQ(p.sources, (std::vector<PlanSource>{Src(0, 7, 7, D, 10), Src(0, 8, 8, D, 10)}));
  ASSERT_EQ(p.not_needed.size(), 1u);
  EXPECT_EQ(p.not_needed[0], (NotNeeded{0, 7, 7, 70}));
  EXPECT_EQ(p.not_needed_bytes, 70u);
  EXPECT_EQ(p.attention_hit_tokens, 160u);  // no full-attention group: the whole chain
  EXPECT_EQ(p.oracle_calls, 3u);            // 9 (absent), 8, 7
}

TEST(RecoveryPlan, WindowNotOnTheBlockGridCoversPartlyOlderBlocks) {
  // W = 20 tokens of 16-token blocks: [P - 20, P) reaches into a second block.
  const ModelDescription d = Describe(16, {Window("swa", 0, 16, 10, 20)});
  MapOracle o;
  for (uint64_t b : {2, 3}) o.SetBlock(0, b, S);
  const RecoveryPlan p = Plan(d, 4, o);
  EXPECT_EQ(p.prefix_tokens, 64u);
  EXPECT_EQ(p.sources, (std::vector<PlanSource>{Src(0, 2, 2, S, 10), Src(0, 3, 3, S, 10)}));
}

TEST(RecoveryPlan, RecurrentLandsOnACheckpointBelowTheAttentionHit) {
  const ModelDescription d =
      Describe(16, {Full("attn", 0, 16, 100), Recurrent("gdn", 1, 16, 5000, 64)});
  MapOracle o;
  for (uint64_t b = 0; b < 10; ++b) o.SetBlock(0, b, D);
  o.SetCheckpoint(1, 64, S);  // 128 is scheduled but absent; 160 is not scheduled
  const RecoveryPlan p = Plan(d, 10, o);
  EXPECT_EQ(p.attention_hit_tokens, 160u);
  EXPECT_EQ(p.prefix_tokens, 64u);
  ASSERT_EQ(p.sources.size(), 5u);
  EXPECT_EQ(p.sources.back(), Src(1, 64, 3, S, 5000));
  EXPECT_EQ(p.source_bytes, 4 * 100u + 5000u);
  EXPECT_EQ(p.not_needed, (std::vector<NotNeeded>{{1, 0, 0, 0}}));

  o.SetCheckpoint(1, 128, D);
  const RecoveryPlan q = Plan(d, 10, o);
  EXPECT_EQ(q.prefix_tokens, 128u);
  EXPECT_EQ(q.sources.back(), Src(1, 128, 7, D, 5000));
  EXPECT_EQ(q.not_needed, (std::vector<NotNeeded>{{1, 0, 1, 5000}}));  // the one at 64
}

TEST(RecoveryPlan, ExplicitCheckpointPositions) {
  const ModelDescription d =
      Describe(16, {Full("attn", 0, 16, 1), Recurrent("gdn", 1, 32, 50, 0, {32, 96, 128})});
  MapOracle o;
  for (uint64_t b = 0; b < 7; ++b) o.SetBlock(0, b, D);  // hit 112 tokens
  o.SetCheckpoint(1, 32, D);
  o.SetCheckpoint(1, 96, D);
  o.SetCheckpoint(1, 128, D);  // beyond the hit
  const RecoveryPlan p = Plan(d, 8, o);
  EXPECT_EQ(p.prefix_tokens, 96u);
  EXPECT_EQ(p.not_needed, (std::vector<NotNeeded>{{1, 0, 1, 50}}));
}

TEST(RecoveryPlan, MissingWindowBlockInsideTheWindowMovesPBelowIt) {
  const ModelDescription d = Describe(16, {Full("attn", 0, 16, 100), Window("swa", 1, 16, 10, 48)});
  MapOracle o;
  for (uint64_t b = 0; b < 10; ++b) {
    o.SetBlock(0, b, D);
    if (b != 8) o.SetBlock(1, b, S);
  }
  const RecoveryPlan p = Plan(d, 10, o);
  // P = 160 needs window blocks 7, 8, 9: 8 is missing. P = 128 needs 5, 6, 7.
  EXPECT_EQ(p.prefix_tokens, 128u);
  std::vector<PlanSource> window(p.sources.begin() + 8, p.sources.end());
  EXPECT_EQ(window, (std::vector<PlanSource>{Src(1, 5, 5, S, 10), Src(1, 6, 6, S, 10),
                                             Src(1, 7, 7, S, 10)}));
  EXPECT_EQ(p.not_needed, (std::vector<NotNeeded>{{1, 5, 5, 50}}));
  EXPECT_EQ(p.oracle_calls, 10u + 5u);  // attention 0..9; window 9, 8, 7, 6, 5
}

// The example of the README's "Hybrid models" section.
TEST(RecoveryPlan, ReadmeExample) {
  const ModelDescription d =
      Describe(16, {Full("attn", 0, 16, 1 << 20), Window("swa", 1, 16, 1 << 19, 48),
                    Recurrent("gdn", 2, 16, 37 << 20, 64)});
  MapOracle o;
  for (uint64_t b = 0; b < 10; ++b) {
    o.SetBlock(0, b, D);
    if (b != 8) o.SetBlock(1, b, S);
  }
  o.SetCheckpoint(2, 64, S);
  o.SetCheckpoint(2, 128, S);
  const RecoveryPlan p = Plan(d, 10, o);
  EXPECT_EQ(p.prefix_tokens, 128u);
  ASSERT_EQ(p.sources.size(), 8u + 3u + 1u);
  EXPECT_EQ(p.sources[8], Src(1, 5, 5, S, 1 << 19));
  EXPECT_EQ(p.sources.back(), Src(2, 128, 7, S, 37 << 20));
  EXPECT_EQ(p.not_needed, (std::vector<NotNeeded>{{1, 5, 5, 5ull << 19}, {2, 0, 1, 37ull << 20}}));
}

TEST(RecoveryPlan, EmptyChainNeedsNothingAndAsksNothing) {
  const ModelDescription d = Describe(
      16, {Full("attn", 0, 16, 1), Window("swa", 1, 16, 1, 16), Recurrent("r", 2, 16, 1, 16)});
  MapOracle o;
  const RecoveryPlan p = Plan(d, 0, o);
  EXPECT_EQ(p.prefix_tokens, 0u);
  EXPECT_TRUE(p.sources.empty());
  EXPECT_EQ(p.oracle_calls, 0u);
  EXPECT_EQ(p.not_needed, (std::vector<NotNeeded>{{1, 0, 0, 0}, {2, 0, 0, 0}}));
}

TEST(RecoveryPlan, NothingPresentIsPrefixZero) {
  const ModelDescription d =
      Describe(16, {Window("swa", 0, 16, 1, 16), Recurrent("r", 1, 16, 1, 16)});
  MapOracle o;
  const RecoveryPlan p = Plan(d, 50, o);
  EXPECT_EQ(p.prefix_tokens, 0u);
  EXPECT_TRUE(p.sources.empty());
}

TEST(RecoveryPlan, GroupsWithLargerBlocksPutPOnTheirGrid) {
  // Keys every 16 tokens; attention blocks of 32, a window of 16-token blocks.
  const ModelDescription d = Describe(16, {Full("attn", 0, 32, 100), Window("swa", 1, 16, 10, 16)});
  MapOracle o;
  for (uint64_t b = 0; b < 3; ++b) o.SetBlock(0, b, D);  // tokens [0, 96)
  for (uint64_t b = 0; b < 7; ++b) o.SetBlock(1, b, D);
  const RecoveryPlan p = Plan(d, 7, o);  // 112 tokens
  EXPECT_EQ(p.attention_hit_tokens, 96u);
  EXPECT_EQ(p.prefix_tokens, 96u);
  EXPECT_EQ(p.sources.front(), Src(0, 0, 1, D, 100));  // block 0 of 32 tokens: key 1
  EXPECT_EQ(p.sources.back(), Src(1, 5, 5, D, 10));
}

TEST(RecoveryPlan, BudgetCutsToTheLongestPrefixWithinIt) {
  const ModelDescription d =
      Describe(16, {Full("attn", 0, 16, 100), Recurrent("gdn", 1, 16, 1000, 32)});
  MapOracle o;
  for (uint64_t b = 0; b < 8; ++b) o.SetBlock(0, b, D);
  for (uint64_t p : {32, 64, 96, 128}) o.SetCheckpoint(1, p, D);
  // The whole plan: 8 blocks + one checkpoint = 1800 bytes.
  EXPECT_FALSE(Plan(d, 8, o, 1800).budget_limited);
  const RecoveryPlan p = Plan(d, 8, o, 1799);
  EXPECT_TRUE(p.budget_limited);
  EXPECT_EQ(p.prefix_tokens, 96u);  // 6 blocks + a checkpoint: 1600
  EXPECT_EQ(p.source_bytes, 1600u);
  EXPECT_EQ(Plan(d, 8, o, 999).prefix_tokens, 0u);
}

TEST(RecoveryPlan, RefusesChainsLongerThanTheLimit) {
  const ModelDescription d = Describe(16, {Full("attn", 0, 16, 1)});
  MapOracle o;
  Result<RecoveryPlan> p = CompileRecoveryPlan(d, kMaxChainKeys + 1, o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), ::testing::HasSubstr("longer than the limit"));
}

}  // namespace
}  // namespace orbitkv::recovery
