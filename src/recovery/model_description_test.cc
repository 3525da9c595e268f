// Model descriptions: one refusal per rule (the message names the field),
// the canonical bytes and fingerprint (stable, order-free, sensitive to every
// field), namespace keys, layout agreement, and the object-key derivation.
#include "recovery/model_description.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <functional>
#include <set>
#include <string>

#include "recovery/object_keys.h"
#include "recovery/recovery_test_util.h"

namespace orbitkv::recovery {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace testing;  // NOLINT: the description helpers

ModelDescription Hybrid() {
  return Describe(16, {Full("attn", 0, 16, 1 << 20), Window("swa", 1, 16, 1 << 19, 4096),
                       Recurrent("gdn", 2, 16, 37 << 20, 256)});
}

// The status message of validating `d`, "" when valid.
std::string Refusal(const ModelDescription& d) {
  Status st = ValidateModelDescription(d);
  if (st.ok()) return "";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  return std::string(st.message());
}

TEST(ModelDescription, HybridAndDenseAreValid) {
  EXPECT_EQ(Refusal(Hybrid()), "");
  EXPECT_EQ(Refusal(Describe(16, {Full("attn", 0, 16, 4096)})), "");
  EXPECT_EQ(Refusal(Describe(16, {Recurrent("s", 3, 32, 1, 0, {32, 64, 256})})), "");
}

TEST(ModelDescription, RefusesWindowOfZero) {
  ModelDescription d = Hybrid();
  d.groups[1].window_tokens = 0;
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[1].window_tokens: 0"));
}

TEST(ModelDescription, RefusesCheckpointPositionsOffTheBlockGrid) {
  ModelDescription d = Describe(16, {Recurrent("gdn", 0, 32, 1, 0, {32, 48})});
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[0].checkpoint_positions[1]: 48 is off the "
                                     "block grid"));
  d.groups[0].checkpoint_positions.clear();
  d.groups[0].checkpoint_interval_tokens = 40;
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[0].checkpoint_interval_tokens: 40 is off the "
                                     "block grid"));
}

TEST(ModelDescription, RefusesGroupNamedTwice) {
  ModelDescription d = Hybrid();
  d.groups[2].name = "attn";
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[2].name: \"attn\" names two groups"));
}

TEST(ModelDescription, RefusesNoGroups) {
  EXPECT_THAT(Refusal(Describe(16, {})), StartsWith("model.groups: no groups"));
}

TEST(ModelDescription, RefusesAbsurdSizes) {
  ModelDescription d = Hybrid();
  d.groups[0].bytes = 0;
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[0].bytes: 0 is outside"));
  d.groups[0].bytes = kMaxPieceBytes + 1;
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[0].bytes: 68719476737 is outside"));
  d = Hybrid();
  d.groups[1].window_tokens = kMaxSequenceTokens + 1;
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[1].window_tokens: 4294967297 is larger"));
  d = Hybrid();
  d.groups[0].block_tokens = kMaxBlockTokens * 2;
  EXPECT_THAT(Refusal(d), StartsWith("model.groups[0].block_tokens: 2097152 is outside"));
  d = Hybrid();
  d.key_block_tokens = 0;
  EXPECT_THAT(Refusal(d), StartsWith("model.key_block_tokens: 0 is outside"));
  d = Hybrid();
  d.groups.resize(kMaxModelGroups + 1, d.groups[0]);
  EXPECT_THAT(Refusal(d), StartsWith("model.groups: 65 groups, more than the limit 64"));
}

TEST(ModelDescription, RefusesEveryOtherRuleNamingTheField) {
  struct Case {
    std::function<void(ModelDescription&)> edit;
    std::string prefix;
  };
  const std::vector<Case> cases = {
      {[](auto& d) { d.groups[0].name = ""; }, "model.groups[0].name: empty"},
      {[](auto& d) { d.groups[0].name = "a b"; }, "model.groups[0].name: \"a b\": only printable"},
      {[](auto& d) { d.groups[0].name = std::string(129, 'x'); },
       "model.groups[0].name: 129 bytes, longer than the limit 128"},
      {[](auto& d) { d.groups[0].name = "a\x01"; }, "model.groups[0].name: \"a\\x01\""},
      {[](auto& d) { d.groups[0].kind = static_cast<GroupKind>(9); },
       "model.groups[0].kind: unknown kind 9"},
      {[](auto& d) { d.groups[1].storage_group = 64; },
       "model.groups[1].storage_group: 64 is not below the limit 64"},
      {[](auto& d) { d.groups[1].storage_group = 0; },
       "model.groups[1].storage_group: 0 is the storage group of two groups"},
      {[](auto& d) { d.groups[0].block_tokens = 24; },
       "model.groups[0].block_tokens: 24 is not a multiple of key_block_tokens 16"},
      {[](auto& d) { d.groups[0].window_tokens = 5; },
       "model.groups[0].window_tokens: set on a full attention group"},
      {[](auto& d) { d.groups[1].checkpoint_interval_tokens = 16; },
       "model.groups[1].checkpoint_interval_tokens: set on a sliding window group"},
      {[](auto& d) { d.groups[0].checkpoint_positions = {16}; },
       "model.groups[0].checkpoint_positions: set on a full attention group"},
      {[](auto& d) { d.groups[2].checkpoint_positions = {16}; },
       "model.groups[2].checkpoint_interval_tokens: set together with checkpoint_positions"},
      {[](auto& d) { d.groups[2].checkpoint_interval_tokens = 0; },
       "model.groups[2].checkpoint_interval_tokens: neither it nor checkpoint_positions"},
      {[](auto& d) { d.groups[2].checkpoint_interval_tokens = kMaxSequenceTokens + 16; },
       "model.groups[2].checkpoint_interval_tokens: 4294967312 is larger than the limit"},
      {[](auto& d) {
         d.groups[2].checkpoint_interval_tokens = 0;
         d.groups[2].checkpoint_positions = {32, 32};
       },
       "model.groups[2].checkpoint_positions[1]: 32 does not ascend"},
      {[](auto& d) {
         d.groups[2].checkpoint_interval_tokens = 0;
         d.groups[2].checkpoint_positions = {0};
       },
       "model.groups[2].checkpoint_positions[0]: 0 is outside (0, 4294967296]"},
      {[](auto& d) {
         d.groups[2].checkpoint_interval_tokens = 0;
         d.groups[2].checkpoint_positions.assign(kMaxCheckpointPositions + 1, 16);
       },
       "model.groups[2].checkpoint_positions: 65537 positions, more than the limit 65536"},
  };
  for (const Case& c : cases) {
    ModelDescription d = Hybrid();
    c.edit(d);
    EXPECT_THAT(Refusal(d), StartsWith(c.prefix)) << c.prefix;
  }
}

TEST(ModelDescription, ValidateUsesTheCallersFieldPrefix) {
  ModelDescription d = Hybrid();
  d.groups[1].window_tokens = 0;
  Status st = ValidateModelDescription(d, "RegisterInstance.model");
  EXPECT_THAT(st.message(), StartsWith("RegisterInstance.model.groups[1].window_tokens: "));
}

TEST(ModelDescription, CanonicalBytesAreTheDocumentedLayout) {
  const std::vector<uint8_t> b = CanonicalBytes(Describe(16, {Window("w", 5, 32, 0x0102, 0x40)}));
  const std::vector<uint8_t> want = {'O',  'K', 'V', 'M', 'O', 'D', 'E', 'L',
                                     1,    0,                                // magic, version
                                     16,   0,   0,   0,   0,   0,   0,   0,  // key_block_tokens
                                     1,    0,   0,   0,                      // groups
                                     1,    0,   0,   0,   'w',               // name
                                     2,                                      // kind
                                     5,    0,   0,   0,                      // storage_group
                                     32,   0,   0,   0,   0,   0,   0,   0,  // block_tokens
                                     2,    1,   0,   0,   0,   0,   0,   0,  // bytes
                                     0x40, 0,   0,   0,   0,   0,   0,   0,  // window
                                     0,    0,   0,   0,   0,   0,   0,   0,  // interval
                                     0,    0,   0,   0};                     // positions
  EXPECT_EQ(b, want);
}

TEST(ModelDescription, FingerprintIgnoresGroupOrderAndSeesEveryField) {
  const ModelDescription base = Hybrid();
  ModelDescription reordered = base;
  std::swap(reordered.groups[0], reordered.groups[2]);
  EXPECT_EQ(Fingerprint(base), Fingerprint(reordered));
  EXPECT_EQ(FingerprintHex(Fingerprint(base)).size(), 64u);

  std::vector<ModelDescription> variants(10, base);
  variants[0].key_block_tokens = 8;
  variants[1].groups[0].name = "attn2";
  variants[2].groups[0].storage_group = 7;
  variants[3].groups[0].block_tokens = 32;
  variants[4].groups[0].bytes += 1;
  variants[5].groups[1].window_tokens += 1;
  variants[6].groups[2].checkpoint_interval_tokens = 512;
  variants[7].groups[2].checkpoint_interval_tokens = 0;
  variants[7].groups[2].checkpoint_positions = {256};
  variants[8].groups[1].kind = GroupKind::kFullAttention;
  variants[8].groups[1].window_tokens = 0;
  variants[9].groups.pop_back();
  std::set<ModelFingerprint> seen = {Fingerprint(base)};
  for (const ModelDescription& v : variants) {
    ASSERT_TRUE(ValidateModelDescription(v).ok()) << ValidateModelDescription(v).message();
    EXPECT_TRUE(seen.insert(Fingerprint(v)).second);
  }
}

TEST(ModelDescription, NamespaceKeysSeparateDescriptionsAndDenseInstances) {
  const NamespaceKey dense = MakeNamespaceKey("qwen3-next/bf16/tp1", std::nullopt);
  const NamespaceKey hybrid = MakeNamespaceKey("qwen3-next/bf16/tp1", Hybrid());
  ModelDescription other = Hybrid();
  other.groups[1].window_tokens = 2048;
  EXPECT_EQ(dense.ns, "qwen3-next/bf16/tp1");
  EXPECT_FALSE(dense.model.has_value());
  EXPECT_NE(dense, hybrid);
  EXPECT_NE(hybrid, MakeNamespaceKey("qwen3-next/bf16/tp1", other));
  EXPECT_EQ(hybrid, MakeNamespaceKey("qwen3-next/bf16/tp1", Hybrid()));
}

TEST(ModelDescription, LayoutAgreement) {
  const ModelDescription d =
      Describe(16, {Full("attn", 0, 16, 3000), Recurrent("s", 2, 16, 700, 16)});
  InstanceLayout l = SplitLayout(4, {1000, 2000}, 0);
  EXPECT_TRUE(CheckLayoutAgreement(d, l).ok());
  l.groups.push_back(SplitLayout(4, {700}, 2).groups[0]);
  EXPECT_TRUE(CheckLayoutAgreement(d, l).ok());
  l.groups[1].slot_bytes = {701};
  EXPECT_THAT(CheckLayoutAgreement(d, l).message(),
              HasSubstr("layout group 2: its slots hold 701 bytes per object, model group \"s\" "
                        "says 700"));
  l.groups[1].group_id = 1;
  EXPECT_THAT(CheckLayoutAgreement(d, l).message(),
              HasSubstr("layout group 1: no group of the model description stores into it"));
}

TEST(ObjectKeys, DistinctPerGroupAndPieceFromOneChain) {
  const ModelDescription d = Hybrid();
  const std::vector<BlockKey> masks = GroupMasks(d);
  ASSERT_EQ(masks.size(), 3u);
  std::vector<BlockKey> chain;
  for (uint64_t i = 0; i < 64; ++i) {
    BlockKey k{};
    for (int b = 0; b < 8; ++b) k[b] = static_cast<uint8_t>(i >> (8 * b));
    k[31] = 0x5a;
    chain.push_back(k);
  }
  std::set<BlockKey> keys;
  for (uint32_t g = 0; g < 3; ++g) {
    for (uint64_t i = 0; i < chain.size(); ++i) {
      EXPECT_TRUE(keys.insert(ObjectKey(chain[i], masks[g])).second) << g << " " << i;
      EXPECT_EQ(ObjectKey(ObjectKey(chain[i], masks[g]), masks[g]), chain[i]);
    }
  }
  // The mask depends on the name and kind only.
  GroupDescription g = d.groups[0];
  g.bytes = 7;
  g.storage_group = 9;
  EXPECT_EQ(GroupMask(g), masks[0]);
  g.kind = GroupKind::kSlidingWindow;
  EXPECT_NE(GroupMask(g), masks[0]);
}

TEST(ObjectKeys, KeyIndicesNameThePrefixThroughThePiece) {
  const ModelDescription d = Describe(16, {Full("a", 0, 64, 1), Recurrent("r", 1, 32, 1, 32)});
  EXPECT_EQ(BlockKeyIndex(d, d.groups[0], 0), 3u);   // tokens [0, 64): key 3 names [0, 64)
  EXPECT_EQ(BlockKeyIndex(d, d.groups[0], 2), 11u);  // [128, 192)
  EXPECT_EQ(CheckpointKeyIndex(d, 32), 1u);
  EXPECT_EQ(CheckpointKeyIndex(d, 16), 0u);
}

// The mask of "attn" (full attention), computed with Python's hashlib from the
// documented formula: keys are on disk and derived by python/orbitkv/hybrid.py
// too, so the derivation must never change silently.
TEST(ObjectKeys, GroupMaskIsStable) {
  const BlockKey m = GroupMask(Full("attn", 0, 16, 1));
  std::string hex;
  for (uint8_t b : m) hex += fmt::format("{:02x}", b);
  EXPECT_EQ(hex, "10e2404093749c5a01495f0527b76030e0204f3a0585a2297d736e23aa4b82f6");
}

}  // namespace
}  // namespace orbitkv::recovery
