// Hybrid models through the Manager: publish under group masks, queries that
// compile the recovery plan over DRAM and SSD, restores of every piece into its
// own group's pages, the window (nothing older is held), checkpoints, budgets,
// release on expiry, and namespaces that keep descriptions apart.
#include <gtest/gtest.h>

#include "manager/manager_test_fixture.h"

namespace orbitkv {
namespace {

// 16-token keys; "attn" (full attention, layout group 0, one 4096-byte slot),
// "swa" (a 48-token window, group 1, 2048 bytes), "gdn" (recurrent, group 2,
// a conv slot of 1000 and an SSM slot of 3000 bytes, checkpoints every 64 tokens).
ModelDescription Description(uint64_t window = 48) {
  ModelDescription d;
  d.key_block_tokens = 16;
  GroupDescription attn{"attn", GroupKind::kFullAttention, 0, 16, 4096};
  GroupDescription swa{"swa", GroupKind::kSlidingWindow, 1, 16, 2048, window};
  GroupDescription gdn{"gdn", GroupKind::kRecurrent, 2, 16, 4000};
  gdn.checkpoint_interval_tokens = 64;
  d.groups = {attn, swa, gdn};
  return d;
}

constexpr uint64_t kPages = 32;
enum : uint32_t { kAttn = 0, kSwa = 1, kGdn = 2 };  // layout group index == description index

InstanceLayout HybridLayout() {
  InstanceLayout l;
  l.num_pages = kPages;
  const std::vector<std::vector<uint64_t>> groups = {{4096}, {2048}, {1000, 3000}};
  for (uint32_t g = 0; g < groups.size(); ++g) {
    GroupLayout gl;
    gl.group_id = g;
    gl.num_slots = static_cast<uint32_t>(groups[g].size());
    gl.slot_bytes = groups[g];
    for (uint32_t s = 0; s < groups[g].size(); ++s) {
      gl.slots.push_back(
          {s, static_cast<uint32_t>(l.region_bytes.size()), 0, groups[g][s], groups[g][s]});
      l.region_bytes.push_back(kPages * groups[g][s]);
    }
    l.groups.push_back(std::move(gl));
  }
  return l;
}

// The chain of the test sequence: key i names tokens [0, 16 (i + 1)).
uint64_t ChainKey(uint64_t i) { return 500 + i; }
// What page content a piece carries: group and index, so a piece written into
// another group's page or another index's page is caught.
uint64_t Seed(uint32_t group, uint64_t index) { return (uint64_t{group} + 1) * 100000 + index; }

class HybridTest : public ManagerTest {
 protected:
  InstanceLayout layout = HybridLayout();
  HostPages pages{layout};

  InstanceId RegisterHybrid(HostPages& p, const ModelDescription& d, std::string ns = "hybrid") {
    RegisterRequest r;
    r.ns = std::move(ns);
    r.layout = layout;
    r.model = d;
    auto id = mgr->RegisterInstance(session, r, p.DupFds());
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }

  // Publishes block `b` of group `g` (attn or swa) from page `page`: the key
  // is the chain key of the prefix ending with the block.
  void PublishPiece(InstanceId inst, uint32_t g, uint64_t key_index, uint64_t index,
                    uint64_t page) {
    pages.Fill(g, page, Seed(g, index));
    PublishRequest p;
    p.instance = inst;
    p.group_id = g;
    p.keys = {K(ChainKey(key_index))};
    p.pages = {page};
    auto r = mgr->Publish(session, p);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->sealed, 1u);
  }
  void PublishBlocks(InstanceId inst, uint32_t g, std::vector<uint64_t> blocks) {
    for (uint64_t b : blocks) PublishPiece(inst, g, b, b, b % kPages);
  }
  void PublishCheckpoint(InstanceId inst, uint64_t position) {
    PublishPiece(inst, kGdn, position / 16 - 1, position, position / 16);
  }

  QueryResult QueryChain(InstanceId inst, uint64_t n, uint32_t ttl_ms = 30000) {
    QueryRequest q;
    q.instance = inst;
    q.ttl_ms = ttl_ms;
    for (uint64_t i = 0; i < n; ++i) q.keys.push_back(K(ChainKey(i)));
    auto r = mgr->Query(session, q);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : QueryResult{};
  }

  // The README's example: attn 0..9, swa all but 8, gdn at 64 and 128.
  InstanceId PublishExample() {
    InstanceId inst = RegisterHybrid(pages, Description());
    PublishBlocks(inst, kAttn, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    PublishBlocks(inst, kSwa, {0, 1, 2, 3, 4, 5, 6, 7, 9});
    PublishCheckpoint(inst, 64);
    PublishCheckpoint(inst, 128);
    mgr->Drain();
    return inst;
  }

  // Restores every source into page 16 + i of its group (cleared first) and
  // checks each piece's bytes, and that no other page changed.
  void RestoreAllAndCheck(InstanceId inst, const QueryResult& q) {
    ASSERT_LE(q.pieces.size(), kPages - 16);
    std::vector<uint32_t> blocks;
    std::vector<uint64_t> dest;
    for (uint32_t g = 0; g < 3; ++g) {
      for (uint64_t p = 16; p < kPages; ++p) pages.Clear(g, p);
    }
    for (uint32_t i = 0; i < q.pieces.size(); ++i) {
      blocks.push_back(i);
      dest.push_back(16 + i);
    }
    RestoreResult r = Restore(inst, q.query, blocks, dest);
    ASSERT_EQ(r.blocks.size(), q.pieces.size());
    for (uint32_t i = 0; i < q.pieces.size(); ++i) {
      const QuerySource& s = q.pieces[i];
      EXPECT_TRUE(r.blocks[i].status.ok()) << i << ": " << r.blocks[i].status.ToString();
      EXPECT_EQ(r.blocks[i].source, s.tier);
      EXPECT_TRUE(pages.Holds(s.storage_group, 16 + i, Seed(s.group, s.index)))
          << "source " << i << " (group " << s.group << ", index " << s.index << ")";
      for (uint32_t g = 0; g < 3; ++g) {  // the other groups' page 16 + i is untouched
        if (g == s.storage_group) continue;
        std::vector<uint8_t> zero(layout.groups[g].slots[0].bytes_per_page, 0);
        EXPECT_EQ(std::memcmp(pages.Slot(g, 0, 16 + i), zero.data(), zero.size()), 0)
            << "source " << i << " wrote into group " << g;
      }
    }
  }
};

// The plan's sources, all on `tier`: attn blocks [0, attn_end), swa blocks
// [swa_first, swa_end), the gdn checkpoint at `checkpoint`.
std::vector<QuerySource> Sources(uint64_t attn_end, uint64_t swa_first, uint64_t swa_end,
                                 uint64_t checkpoint, Tier tier) {
  std::vector<QuerySource> out;
  for (uint64_t b = 0; b < attn_end; ++b) out.push_back({kAttn, kAttn, b, tier, 4096});
  for (uint64_t b = swa_first; b < swa_end; ++b) out.push_back({kSwa, kSwa, b, tier, 2048});
  out.push_back({kGdn, kGdn, checkpoint, tier, 4000});
  return out;
}

TEST_F(HybridTest, ThePlanOfTheReadmeExampleRestoresByteExactFromDram) {
  Start(8u << 20);
  InstanceId inst = PublishExample();
  QueryResult q = QueryChain(inst, 10);
  EXPECT_EQ(q.prefix_tokens, 128u);
  EXPECT_EQ(q.pieces, Sources(/*attn*/ 8, /*swa*/ 5, 8, /*gdn at*/ 128, Tier::kDram));
  EXPECT_EQ(q.prefix, q.pieces.size());
  ASSERT_EQ(q.sources.size(), q.pieces.size());
  EXPECT_FALSE(q.budget_limited);
  EXPECT_EQ(q.logical_bytes, 8 * 4096u + 3 * 2048u + 4000u);
  EXPECT_EQ(q.not_needed_bytes, 5 * 2048u + 4000u);  // swa 0..4, the checkpoint at 64
  // Exactly the plan's sources are held: swa 0..4, 8.., attn 8, 9 and the
  // checkpoint at 64 are not pinned; the charge is the plan's bytes.
  Manager::Gauges g = mgr->gauges();
  EXPECT_EQ(g.dram.pinned_entries, 12u);
  EXPECT_EQ(g.query_budget_used, q.logical_bytes);
  EXPECT_EQ(g.ssd_leases, 0u);
  RestoreAllAndCheck(inst, q);
  ExpectAllReleased();
}

TEST_F(HybridTest, RestoresFromSsdAfterDramEvictionHoldOnlyThePlansLeases) {
  Start(1u << 20);
  InstanceId inst = PublishExample();
  // Push every hybrid object out of DRAM with a dense namespace's blocks.
  InstanceLayout dl = SplitLayout(64, {65536});
  HostPages dense(dl);
  InstanceId d = Register(dense, dl, "dense");
  PublishOneByOne(d, dense, 40);
  QueryResult q = QueryChain(inst, 10);
  EXPECT_EQ(q.prefix_tokens, 128u);
  ASSERT_EQ(q.pieces.size(), 12u);
  for (const QuerySource& s : q.pieces) EXPECT_EQ(s.tier, Tier::kSsd);
  // The window: swa blocks 0..4 (and the checkpoint at 64) are neither leased nor read.
  Manager::Gauges g = mgr->gauges();
  EXPECT_EQ(g.ssd_leases, 12u);
  EXPECT_EQ(g.dram.pinned_entries, 0u);
  RestoreAllAndCheck(inst, q);
  ExpectAllReleased();
}

TEST_F(HybridTest, AMissingCheckpointShortensThePrefixToThePreviousOne) {
  Start(8u << 20);
  InstanceId inst = RegisterHybrid(pages, Description());
  PublishBlocks(inst, kAttn, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  PublishBlocks(inst, kSwa, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  PublishCheckpoint(inst, 64);  // none at 128
  mgr->Drain();                 // the writeback lane's pins are gone
  QueryResult q = QueryChain(inst, 10);
  EXPECT_EQ(q.prefix_tokens, 64u);
  EXPECT_EQ(q.pieces, Sources(/*attn*/ 4, /*swa*/ 1, 4, /*gdn at*/ 64, Tier::kDram));
  EXPECT_EQ(mgr->gauges().dram.pinned_entries, 8u);
  RestoreAllAndCheck(inst, q);
  // No checkpoint at all: nothing is restorable, nothing is held.
  InstanceLayout l2 = HybridLayout();
  HostPages p2(l2);
  InstanceId other = RegisterHybrid(p2, Description(), "hybrid-2");
  QueryResult none = QueryChain(other, 10);
  EXPECT_EQ(none.query, 0u);
  EXPECT_EQ(none.prefix_tokens, 0u);
  EXPECT_TRUE(none.pieces.empty());
  ExpectAllReleased();
}

TEST_F(HybridTest, TheBudgetCapsThePlanAndSaysSo) {
  // P = 64 costs 4 attn + 3 swa + 1 checkpoint = 26528 bytes; P = 128 42912.
  Start(8u << 20, true, 1, /*budget=*/30000);
  InstanceId inst = PublishExample();
  QueryResult q = QueryChain(inst, 10);
  EXPECT_EQ(q.prefix_tokens, 64u);
  EXPECT_TRUE(q.budget_limited);
  EXPECT_EQ(q.logical_bytes, 26528u);
  EXPECT_EQ(mgr->gauges().query_budget_used, 26528u);
  // A second query finds the budget spent: nothing, and it says why.
  QueryResult q2 = QueryChain(inst, 10);
  EXPECT_EQ(q2.query, 0u);
  EXPECT_TRUE(q2.budget_limited);
  ASSERT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  ExpectAllReleased();
}

TEST_F(HybridTest, ExpiryAndReleaseFreeEveryLeaseOfAPartlyRestoredPlan) {
  ManualClock& clock = manual_clock;
  Start(1u << 20, true, 1, 0, &clock);
  InstanceId inst = PublishExample();
  InstanceLayout dl = SplitLayout(64, {65536});
  HostPages dense(dl);
  PublishOneByOne(Register(dense, dl, "dense"), dense, 40);  // the plan is on SSD
  QueryResult q = QueryChain(inst, 10, /*ttl_ms=*/1000);
  ASSERT_EQ(q.pieces.size(), 12u);
  // Restore a part (attn 0..3), leave the rest to expire.
  RestoreResult r = Restore(inst, q.query, {0, 1, 2, 3}, {16, 17, 18, 19});
  for (const BlockResult& b : r.blocks) EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  mgr->Drain();
  EXPECT_EQ(mgr->gauges().ssd_leases, 8u);
  clock.Advance(std::chrono::seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the reaper runs every 50 ms
  ExpectAllReleased();
  // And released by the engine, part way.
  QueryResult q2 = QueryChain(inst, 10);
  ASSERT_EQ(q2.pieces.size(), 12u);
  Restore(inst, q2.query, {11}, {30});
  EXPECT_TRUE(pages.Holds(kGdn, 30, Seed(kGdn, 128)));
  ASSERT_TRUE(mgr->ReleaseQuery(session, q2.query).ok());
  ExpectAllReleased();
}

TEST_F(HybridTest, InstancesWhoseDescriptionsDifferShareNothing) {
  Start(8u << 20);
  InstanceId inst = PublishExample();
  // The same name with another window, or dense: other namespaces.
  HostPages p2(layout);
  InstanceId other = RegisterHybrid(p2, Description(/*window=*/32));
  EXPECT_EQ(QueryChain(other, 10).query, 0u);
  InstanceLayout dl = SplitLayout(kPages, {4096});
  HostPages dense(dl);
  InstanceId d = Register(dense, dl, "hybrid");
  QueryRequest dq;
  dq.instance = d;
  for (uint64_t i = 0; i < 10; ++i) dq.keys.push_back(K(ChainKey(i)));
  auto dr = mgr->Query(session, dq);
  ASSERT_TRUE(dr.ok());
  EXPECT_EQ(dr->prefix, 0u);
  // The same description again shares: a second instance sees the plan.
  HostPages p3(layout);
  InstanceId same = RegisterHybrid(p3, Description());
  QueryResult q = QueryChain(same, 10);
  EXPECT_EQ(q.prefix_tokens, 128u);
  ASSERT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  ExpectAllReleased();
}

TEST_F(HybridTest, CheckpointsStreamingInLeaveTheAttentionBlocksInDram) {
  // A 2 MiB pool (1.5 MiB for objects) with 1% for checkpoints: 300
  // checkpoints (about 2.4 MiB) would flush it without the cap.
  ManagerConfig c = Config(2u << 20);
  c.options.checkpoint_dram_percent = 1;
  auto m = Manager::Create(c);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  mgr = std::move(m).value();
  session = mgr->OpenSession(getpid());
  InstanceId inst = RegisterHybrid(pages, Description());
  PublishBlocks(inst, kAttn, {0, 1, 2, 3, 4, 5, 6, 7});
  PublishBlocks(inst, kSwa, {5, 6, 7});
  mgr->Drain();
  for (uint64_t k = 1; k <= 300; ++k) {
    PublishPiece(inst, kGdn, k * 4 - 1, k * 64, k % kPages);  // a checkpoint every 64 tokens
    if (k % 16 == 0) mgr->Drain();
  }
  mgr->Drain();
  const DramStats s = mgr->gauges().dram;
  EXPECT_GT(s.checkpoints_demoted, 250u);
  EXPECT_LE(s.checkpoint_bytes, (1536u << 10) / 100);
  // The attention blocks are all still in DRAM; the checkpoint at 128 comes from SSD.
  QueryResult q = QueryChain(inst, 8);
  EXPECT_EQ(q.prefix_tokens, 128u);
  ASSERT_EQ(q.pieces.size(), 12u);
  for (const QuerySource& p : q.pieces) {
    EXPECT_EQ(p.tier, p.group == kGdn ? Tier::kSsd : Tier::kDram) << p.group << "/" << p.index;
  }
  ASSERT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  ExpectAllReleased();
}

TEST_F(HybridTest, ADescriptionThatDisagreesWithTheLayoutIsRefused) {
  Start(8u << 20);
  RegisterRequest r;
  r.ns = "hybrid";
  r.layout = layout;
  r.model = Description();
  r.model->groups[2].bytes = 4001;  // the layout's gdn group holds 4000
  auto id = mgr->RegisterInstance(session, r, pages.DupFds());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << id.status().ToString();
  r.model = Description(/*window=*/0);
  id = mgr->RegisterInstance(session, r, pages.DupFds());
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("window_tokens"), std::string::npos)
      << id.status().ToString();
}

}  // namespace
}  // namespace orbitkv
