#include "manager/manager.h"

#include <gtest/gtest.h>

#include "manager/manager_test_fixture.h"

namespace orbitkv {
namespace {

TEST_F(ManagerTest, RestoresFromDramByteExactSplitAndPageFirst) {
  Start(8u << 20);
  for (bool split : {true, false}) {
    // Unaligned components: neither 512 nor 4096 multiples.
    std::vector<uint64_t> slots{1000, 333, 4096, 70};
    InstanceLayout l = split ? SplitLayout(16, slots) : PageFirstLayout(16, slots);
    HostPages pages(l);
    InstanceId inst = Register(pages, l, split ? "split" : "page-first");
    for (uint64_t p = 0; p < 4; ++p) pages.Fill(0, p, 100 + p);
    PublishResult pr = Publish(inst, {1, 2, 3, 4}, {0, 1, 2, 3});
    EXPECT_EQ(pr.sealed, 4u);
    QueryResult q = Query(inst, {1, 2, 3, 4, 5});
    ASSERT_EQ(q.prefix, 4u);
    for (Tier t : q.sources) EXPECT_EQ(t, Tier::kDram);
    RestoreResult r = Restore(inst, q.query, {0, 1, 2, 3}, {8, 9, 10, 11});
    for (const BlockResult& b : r.blocks) EXPECT_TRUE(b.status.ok()) << b.status.ToString();
    for (uint64_t p = 0; p < 4; ++p) EXPECT_TRUE(pages.Holds(0, 8 + p, 100 + p)) << p;
    EXPECT_TRUE(mgr->UnregisterInstance(session, inst).ok());
  }
  ExpectAllReleased();
}

TEST_F(ManagerTest, RestoresFromSsdAfterDramEviction) {
  Start(1u << 20);  // room for ~15 objects of 64 KiB
  InstanceLayout l = SplitLayout(64, {32768, 32768 - 100});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  std::vector<uint64_t> keys, pg;
  for (uint64_t i = 0; i < 48; ++i) {
    pages.Fill(0, i, 1000 + i);
    Publish(inst, {i}, {i});
    mgr->Drain();  // writeback before the next publish evicts it
  }
  QueryResult q = Query(inst, {0, 1, 2, 3});
  ASSERT_EQ(q.prefix, 4u);
  for (Tier t : q.sources) EXPECT_EQ(t, Tier::kSsd);
  RestoreResult r = Restore(inst, q.query, {0, 1, 2, 3}, {60, 61, 62, 63});
  for (const BlockResult& b : r.blocks) {
    EXPECT_TRUE(b.status.ok()) << b.status.ToString();
    EXPECT_EQ(b.source, Tier::kSsd);
  }
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(pages.Holds(0, 60 + i, 1000 + i)) << i;
  EXPECT_GT(metrics.Read("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
  EXPECT_GT(metrics.Read("orbitkv_cache_hits_total", {{"tier", "ssd"}}), 0);
  ExpectAllReleased();
}

// Query takes runs of DRAM blocks under one pool lock and SSD blocks between
// them: a chain that alternates tiers must still come back in order, each
// block from its own tier, with nothing held past the prefix (a miss or a
// budget cut), and repeated keys charged once.
TEST_F(ManagerTest, AQueryOfAChainAlternatingDramAndSsdHoldsExactlyItsPrefix) {
  Start(1u << 20, true, 1, /*budget=*/4 * 70000);  // room for ~12 objects of 64 KiB
  InstanceLayout l = SplitLayout(64, {32768, 32768 - 100});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 48);
  // 40.. are in DRAM, 0.. only on the SSD; 999 was never published.
  QueryResult q = Query(inst, {40, 0, 40, 0, 999, 41});
  ASSERT_EQ(q.prefix, 4u);
  EXPECT_FALSE(q.budget_limited);
  EXPECT_EQ(q.sources, (std::vector<Tier>{Tier::kDram, Tier::kSsd, Tier::kDram, Tier::kSsd}));
  Manager::Gauges g = mgr->gauges();
  EXPECT_EQ(g.dram.pinned_entries, 1u);  // one entry, pinned twice
  EXPECT_EQ(g.ssd_leases, 2u);
  EXPECT_EQ(g.query_budget_used, q.logical_bytes);
  const uint64_t object = q.logical_bytes / 2;  // two distinct keys, each charged once
  EXPECT_EQ(q.logical_bytes % 2, 0u);
  RestoreResult r = Restore(inst, q.query, {0, 1, 2, 3}, {60, 61, 62, 63});
  for (const BlockResult& b : r.blocks) EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 40));
  EXPECT_TRUE(pages.Holds(0, 61, 0));
  EXPECT_TRUE(pages.Holds(0, 62, 40));
  EXPECT_TRUE(pages.Holds(0, 63, 0));
  ExpectAllReleased();
  // Four objects fit the budget: the fifth ends the prefix, and neither it nor
  // anything after it stays pinned or leased.
  q = Query(inst, {41, 1, 42, 2, 43, 3, 44});
  ASSERT_EQ(q.prefix, 4u);
  EXPECT_TRUE(q.budget_limited);
  EXPECT_EQ(q.logical_bytes, 4 * object);
  g = mgr->gauges();
  EXPECT_EQ(g.dram.pinned_entries, 2u);
  EXPECT_EQ(g.ssd_leases, 2u);
  EXPECT_EQ(metrics.Read("orbitkv_query_budget_cuts_total", {{"limit", "manager"}}), 1);
  EXPECT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  ExpectAllReleased();
}

// The restore timeline: asked for, a DRAM restore reports no I/O, an SSD one
// every stage, in order; not asked for, none.
// A long-context restore (a 128k-token prefix is 8192 blocks of 16 tokens)
// names every block of its query in one call: its validation once counted
// each block over the whole call under the query table's lock (quadratic).
// A block given twice anywhere in it still refuses the whole call, and the
// query then restores in full.
TEST_F(ManagerTest, ALongRestoreNamingABlockTwiceIsRefusedWholeAndTheQueryStillRestores) {
  constexpr uint64_t kBlocks = 8192;
  Start(32u << 20, /*ssd=*/false);
  InstanceLayout l = SplitLayout(2 * kBlocks, {512});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  std::vector<uint64_t> keys, src, dst;
  std::vector<uint32_t> blocks;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    pages.Fill(0, i, 1000 + i);
    keys.push_back(1000 + i);
    src.push_back(i);
    dst.push_back(kBlocks + i);
    blocks.push_back(static_cast<uint32_t>(i));
  }
  EXPECT_EQ(Publish(inst, keys, src).sealed, kBlocks);
  QueryResult q = Query(inst, keys);
  ASSERT_EQ(q.prefix, kBlocks);
  std::vector<uint32_t> twice = blocks;
  twice.back() = 0;  // block 0 again, last
  Result<RestoreResult> bad = mgr->Restore(session, {inst, q.query, twice, dst});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("block 0 given twice"), std::string::npos)
      << bad.status().ToString();
  RestoreResult r = Restore(inst, q.query, blocks, dst);
  ASSERT_EQ(r.blocks.size(), kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE(r.blocks[i].status.ok()) << i << ": " << r.blocks[i].status.ToString();
    ASSERT_TRUE(pages.Holds(0, kBlocks + i, 1000 + i)) << i;
  }
  EXPECT_TRUE(mgr->UnregisterInstance(session, inst).ok());
  ExpectAllReleased();
}

TEST_F(ManagerTest, RestoreTimelineStampsEachStageOfTheRouteInOrder) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(64, {32768, 32768 - 100});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
  auto restore = [&](uint64_t key, Tier from, bool want) {
    QueryResult q = Query(inst, {key});
    EXPECT_EQ(q.sources, std::vector<Tier>{from});
    RestoreRequest r{inst, q.query, {0}, {60}, want};
    auto res = mgr->Restore(session, r);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_TRUE(pages.Holds(0, 60, key));
    return res.ok() ? res->timeline : std::nullopt;
  };
  EXPECT_FALSE(restore(39, Tier::kDram, false).has_value());
  std::optional<RestoreTimeline> dram = restore(39, Tier::kDram, true);
  ASSERT_TRUE(dram.has_value());
  EXPECT_GE(dram->source_ready_ns, 0);
  EXPECT_EQ(dram->io_submitted_ns, -1);
  EXPECT_EQ(dram->io_complete_ns, -1);
  EXPECT_GE(dram->copy_complete_ns, dram->source_ready_ns);
  EXPECT_GE(dram->done_ns, dram->copy_complete_ns);
  std::optional<RestoreTimeline> ssd = restore(0, Tier::kSsd, true);
  ASSERT_TRUE(ssd.has_value());
  EXPECT_GE(ssd->source_ready_ns, 0);
  EXPECT_GE(ssd->io_submitted_ns, ssd->source_ready_ns);
  EXPECT_GT(ssd->io_complete_ns, ssd->io_submitted_ns);
  EXPECT_GE(ssd->copy_complete_ns, ssd->io_complete_ns);
  EXPECT_GE(ssd->done_ns, ssd->copy_complete_ns);
  ExpectAllReleased();
}

TEST_F(ManagerTest, RestoreLargerThanStagingIsReadInRunsAndPublishWaitsForWriteback) {
  Start(1u << 20);  // 768 KiB of objects, 256 KiB of read staging
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  // Published back to back: later publishes wait for writeback to free room.
  std::vector<uint64_t> keys, pg;
  for (uint64_t i = 0; i < 40; ++i) {
    pages.Fill(0, i, 500 + i);
    keys.push_back(i);
    pg.push_back(i);
  }
  PublishResult pr = Publish(inst, keys, pg);
  EXPECT_EQ(pr.sealed, 40u);
  EXPECT_EQ(metrics.Read("orbitkv_publish_dropped_total"), 0);
  mgr->Drain();
  std::vector<uint64_t> chain;
  for (uint64_t i = 0; i < 10; ++i) chain.push_back(i);  // within the query budget
  QueryResult q = Query(inst, chain);
  ASSERT_EQ(q.prefix, 10u);
  std::vector<uint32_t> blocks;
  std::vector<uint64_t> dst;
  for (uint32_t i = 0; i < 10; ++i) {
    blocks.push_back(i);
    dst.push_back(40 + i);
  }
  RestoreResult r = Restore(inst, q.query, blocks, dst);
  for (const BlockResult& b : r.blocks) EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(pages.Holds(0, 40 + i, 500 + i)) << i;
  ExpectAllReleased();
}

// A Publish copies its objects in batches before sealing them: a key given
// twice in one call must still be stored once (the first copy) and skipped once.
TEST_F(ManagerTest, APublishBatchStoresAKeyGivenTwiceOnce) {
  Start(8u << 20, false);
  InstanceLayout l = SplitLayout(8, {4000});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  pages.Fill(0, 0, 5);
  pages.Fill(0, 1, 6);
  PublishResult r = Publish(inst, {5, 5}, {0, 1});
  EXPECT_EQ(r.stored, 1u);
  EXPECT_EQ(r.skipped, 1u);
  ExpectRestores(pages, inst, 5, 2, Tier::kDram);
  EXPECT_TRUE(pages.Holds(0, 2, 5));  // the first copy's bytes, not page 1's
  ExpectAllReleased();
}

TEST_F(ManagerTest, FragmentedPublicationSealsWhenComplete) {
  Start(8u << 20);
  InstanceLayout l = SplitLayout(8, {512, 1000, 7});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  pages.Fill(0, 0, 7);
  EXPECT_EQ(Publish(inst, {9}, {0}, {0}).sealed, 0u);
  EXPECT_EQ(Query(inst, {9}).prefix, 0u);  // invisible while assembling
  EXPECT_EQ(Publish(inst, {9}, {0}, {2}).sealed, 0u);
  EXPECT_EQ(Query(inst, {9}).prefix, 0u);
  EXPECT_EQ(Publish(inst, {9}, {0}, {1}).sealed, 1u);
  QueryResult q = Query(inst, {9});
  ASSERT_EQ(q.prefix, 1u);
  Restore(inst, q.query, {0}, {5});
  EXPECT_TRUE(pages.Holds(0, 5, 7));
  ExpectAllReleased();
}

TEST_F(ManagerTest, TwoWritersOfOneGroupAssembleInDram) {
  Start(8u << 20);
  // One namespace, a group of 4 slots; rank 0 holds slots 0-1, rank 1 slots 2-3.
  auto half = [](uint32_t first) {
    InstanceLayout l = SplitLayout(4, {600, 600, 900, 900});
    GroupLayout& g = l.groups[0];
    std::vector<SlotLayout> mine;
    for (SlotLayout s : g.slots) {
      if (s.slot_id == first || s.slot_id == first + 1) mine.push_back(s);
    }
    l.region_bytes = {l.region_bytes[first], l.region_bytes[first + 1]};
    mine[0].region = 0;
    mine[1].region = 1;
    g.slots = mine;
    return l;
  };
  InstanceLayout l0 = half(0), l1 = half(2);
  HostPages p0(l0), p1(l1);
  InstanceId r0 = Register(p0, l0, "tp2"), r1 = Register(p1, l1, "tp2");
  p0.Fill(0, 1, 42);
  p1.Fill(0, 1, 42);
  EXPECT_EQ(Publish(r0, {5}, {1}).sealed, 0u);
  EXPECT_EQ(Publish(r1, {5}, {1}).sealed, 1u);
  for (InstanceId inst : {r0, r1}) {
    QueryResult q = Query(inst, {5});
    ASSERT_EQ(q.prefix, 1u);
    Restore(inst, q.query, {0}, {3});
  }
  EXPECT_TRUE(p0.Holds(0, 3, 42));
  EXPECT_TRUE(p1.Holds(0, 3, 42));
  ExpectAllReleased();
}

TEST_F(ManagerTest, CancelBeforeSubmissionReleasesAfterSubmissionCompletes) {
  Start(1u << 20, true, /*workers=*/1);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
  QueryResult qa = Query(inst, {0});
  QueryResult qb = Query(inst, {1});
  ASSERT_EQ(qa.sources[0], Tier::kSsd);
  ASSERT_EQ(qb.sources[0], Tier::kSsd);
  // The single reader stalls on A's read; B waits in the queue.
  faults.AddRule(
      {IoOp::kRead, 1, ScriptedIoFaults::Fault::kStall, 0, false, std::chrono::milliseconds(400)});
  std::promise<Result<RestoreResult>> a_done, b_done;
  auto a = mgr->StartRestore(session, {inst, qa.query, {0}, {50}},
                             [&](Result<RestoreResult> r) { a_done.set_value(std::move(r)); });
  ASSERT_TRUE(a.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto b = mgr->StartRestore(session, {inst, qb.query, {0}, {51}},
                             [&](Result<RestoreResult> r) { b_done.set_value(std::move(r)); });
  ASSERT_TRUE(b.ok());
  auto released_b = mgr->CancelRestore(session, *b);  // queued: released now
  ASSERT_TRUE(released_b.ok());
  EXPECT_EQ(*released_b, 1u);
  auto br = b_done.get_future().get();
  ASSERT_TRUE(br.ok());
  EXPECT_TRUE(br->blocks[0].status.IsCancelled()) << br->blocks[0].status.ToString();
  auto released_a = mgr->CancelRestore(session, *a);  // submitted: completes normally
  ASSERT_TRUE(released_a.ok());
  EXPECT_EQ(*released_a, 0u);
  auto ar = a_done.get_future().get();
  ASSERT_TRUE(ar.ok());
  EXPECT_TRUE(ar->blocks[0].status.ok()) << ar->blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 50, 0));
  ExpectAllReleased();
}

TEST_F(ManagerTest, SessionCloseReleasesEverything) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(32, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 24);
  pages.Fill(0, 30, 99);
  Publish(inst, {99}, {30}, {});
  QueryResult q = Query(inst, {0, 1, 2});
  EXPECT_GT(q.prefix, 0u);
  QueryResult q2 = Query(inst, {99});
  EXPECT_EQ(q2.prefix, 1u);
  EXPECT_GT(mgr->gauges().ssd_leases + mgr->gauges().dram.pinned_entries, 0u);
  mgr->CloseSession(session);
  ExpectAllReleased();
  EXPECT_EQ(mgr->gauges().instances, 0u);
}

TEST_F(ManagerTest, QueryBudgetAndExpiryReleaseSources) {
  Start(8u << 20, false, 1, /*budget=*/3 * 5000);
  InstanceLayout l = SplitLayout(8, {4000});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  for (uint64_t i = 0; i < 6; ++i) Publish(inst, {i}, {i});
  QueryResult q = Query(inst, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(q.prefix, 3u);  // 4.5 KB objects: three fit the budget
  EXPECT_TRUE(q.budget_limited);
  EXPECT_EQ(metrics.Read("orbitkv_query_budget_cuts_total", {{"limit", "manager"}}), 1);
  EXPECT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  EXPECT_EQ(mgr->gauges().query_budget_used, 0u);
  QueryRequest short_ttl{inst, 0, {K(0)}, 1};
  auto r = mgr->Query(session, short_ttl);
  ASSERT_TRUE(r.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // reaper runs every 50 ms
  EXPECT_EQ(mgr->gauges().queries, 0u);
  auto late = mgr->Restore(session, {inst, r->query, {0}, {1}});
  EXPECT_TRUE(late.status().IsNotFound()) << late.status().ToString();
  ExpectAllReleased();
}

// A query of 65,536 copies of one key took the whole Manager-wide budget (each
// copy was charged), and every other engine saw prefix 0 for the query's TTL.
TEST_F(ManagerTest, RepeatedKeysAreChargedOnceSoOneQueryCannotStarveOthers) {
  Start(8u << 20, false, 1, /*budget=*/3 * 5000);
  InstanceLayout l = SplitLayout(8, {4000});
  HostPages pa(l), pb(l);
  InstanceId a = Register(pa, l, "model-a");
  SessionId other = mgr->OpenSession(getpid());
  InstanceId b = Register(pb, l, "model-b", other);
  pa.Fill(0, 0, 10);
  Publish(a, {1}, {0});
  pb.Fill(0, 0, 20);
  ASSERT_TRUE(mgr->Publish(other, {b, 0, {K(2)}, {0}, {}}).ok());
  QueryRequest greedy{a, 0, std::vector<BlockKey>(65536, K(1)), 5000};
  auto qa = mgr->Query(session, greedy);
  ASSERT_TRUE(qa.ok()) << qa.status().ToString();
  EXPECT_EQ(qa->prefix, 65536u);
  EXPECT_FALSE(qa->budget_limited);
  const uint64_t object = qa->logical_bytes;
  EXPECT_LT(object, 5000u);  // one object's bytes, not 65,536 of them
  EXPECT_EQ(mgr->gauges().query_budget_used, object);
  auto qb = mgr->Query(other, {b, 0, {K(2)}, 5000});
  ASSERT_TRUE(qb.ok());
  EXPECT_EQ(qb->prefix, 1u);
  EXPECT_FALSE(qb->budget_limited);
  // Restoring one copy keeps the key charged; the charge goes with the last copy.
  Restore(a, qa->query, {7}, {3});
  EXPECT_TRUE(pa.Holds(0, 3, 10));
  EXPECT_EQ(mgr->gauges().query_budget_used, 2 * object);
  EXPECT_TRUE(mgr->ReleaseQuery(session, qa->query).ok());
  EXPECT_EQ(mgr->gauges().query_budget_used, object);
  EXPECT_TRUE(mgr->ReleaseQuery(other, qb->query).ok());
  mgr->CloseSession(other);
  ExpectAllReleased();
}

TEST_F(ManagerTest, EachSessionGetsAShareOfTheQueryBudgetAndACutIsNotAMiss) {
  Start(8u << 20, false, 1, /*budget=*/4 * 5000);
  InstanceLayout l = SplitLayout(8, {4000});
  HostPages pa(l), pb(l);
  InstanceId a = Register(pa, l);
  for (uint64_t i = 0; i < 6; ++i) Publish(a, {i}, {i});
  SessionId idle = mgr->OpenSession(getpid());  // no instance: takes no share
  SessionId other = mgr->OpenSession(getpid());
  InstanceId b = Register(pb, l, "model-a", other);
  // Two sessions with instances: each may hold half the budget (two objects).
  QueryResult qa = Query(a, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(qa.prefix, 2u);
  EXPECT_TRUE(qa.budget_limited);
  auto qb = mgr->Query(other, {b, 0, {K(0), K(1), K(2), K(3)}, 5000});
  ASSERT_TRUE(qb.ok());
  EXPECT_EQ(qb->prefix, 2u) << "the greedy session left the other its share";
  EXPECT_TRUE(qb->budget_limited);
  EXPECT_EQ(metrics.Read("orbitkv_query_budget_cuts_total", {{"limit", "session"}}), 2);
  EXPECT_EQ(metrics.Read("orbitkv_query_budget_cuts_total", {{"limit", "manager"}}), 0);
  const double misses = metrics.Read("orbitkv_cache_misses_total");
  EXPECT_TRUE(mgr->ReleaseQuery(session, qa.query).ok());
  // A real miss is not a cut: the chain ends at key 77.
  QueryResult miss = Query(a, {0, 77, 1});
  EXPECT_EQ(miss.prefix, 1u);
  EXPECT_FALSE(miss.budget_limited);
  EXPECT_EQ(metrics.Read("orbitkv_cache_misses_total"), misses + 2);
  EXPECT_TRUE(mgr->ReleaseQuery(session, miss.query).ok());
  // The other session leaves: this one may use the whole budget again.
  mgr->CloseSession(other);
  QueryResult all = Query(a, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(all.prefix, 4u);
  EXPECT_TRUE(all.budget_limited);
  EXPECT_TRUE(mgr->ReleaseQuery(session, all.query).ok());
  mgr->CloseSession(idle);
  ExpectAllReleased();
}

TEST_F(ManagerTest, QueryTtlAboveTheCapIsRefused) {
  ManagerConfig c;
  c.options.pool_size = 8u << 20;
  c.options.max_query_ttl_ms = 1000;
  c.lock_memory = false;
  c.metrics = &metrics;
  auto m = Manager::Create(c);
  ASSERT_TRUE(m.ok());
  mgr = std::move(m).value();
  session = mgr->OpenSession(getpid());
  InstanceLayout l = SplitLayout(8, {4000});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  Publish(inst, {1}, {0});
  auto over = mgr->Query(session, {inst, 0, {K(1)}, 1001});
  ASSERT_TRUE(over.status().code() == StatusCode::kInvalidArgument) << over.status().ToString();
  EXPECT_NE(over.status().ToString().find("--max-query-ttl-ms"), std::string::npos);
  EXPECT_TRUE(mgr->Query(session, {inst, 0, {K(1)}, 0}).status().code() ==
              StatusCode::kInvalidArgument);
  auto at = mgr->Query(session, {inst, 0, {K(1)}, 1000});
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->prefix, 1u);
  EXPECT_TRUE(mgr->ReleaseQuery(session, at->query).ok());
  ExpectAllReleased();
  // The default cap is 60 s.
  EXPECT_EQ(ManagerOptions{}.max_query_ttl_ms, 60000u);
}

// A killed engine's partial fragment publishes held the pool until
// assembly_timeout (60 s): its session's close now aborts them at once.
TEST_F(ManagerTest, KilledFragmentPublisherReturnsPoolBytesAtOnce) {
  Start(8u << 20);
  InstanceLayout l = SplitLayout(8, {4096, 4096, 4096});
  HostPages pages(l);
  SessionId engine = mgr->OpenSession(getpid());
  InstanceId inst = Register(pages, l, "model-a", engine);
  pages.Fill(0, 0, 1);
  pages.Fill(0, 1, 2);
  pages.Fill(0, 2, 3);
  auto pr = mgr->Publish(engine, {inst, 0, {K(1), K(2)}, {0, 1}, {0, 2}});
  ASSERT_TRUE(pr.ok());
  EXPECT_EQ(pr->stored, 2u);
  EXPECT_EQ(pr->sealed, 0u);
  ASSERT_TRUE(mgr->Publish(engine, {inst, 0, {K(3)}, {2}, {}}).ok());  // complete: stays
  mgr->Drain();
  EXPECT_EQ(mgr->gauges().dram.assembling_entries, 2u);
  const uint64_t used_with_fragments = mgr->gauges().dram.used_bytes;
  mgr->CloseSession(engine);  // what the server does when the engine is killed
  Manager::Gauges g = mgr->gauges();
  EXPECT_EQ(g.dram.assembling_entries, 0u);
  EXPECT_LT(g.dram.used_bytes, used_with_fragments);
  EXPECT_EQ(g.dram.sealed_entries, 1u);
  EXPECT_EQ(metrics.Read("orbitkv_assemblies_aborted_total"), 2);
  // A new writer of key 1 starts afresh: the dead writer's slots are not in it.
  InstanceId again = Register(pages, l);
  EXPECT_EQ(Publish(again, {1}, {0}, {1}).sealed, 0u);
  EXPECT_EQ(Query(again, {1}).prefix, 0u);
  EXPECT_EQ(Publish(again, {1}, {0}, {0, 2}).sealed, 1u);
  QueryResult q = Query(again, {1, 3});
  ASSERT_EQ(q.prefix, 2u);
  Restore(again, q.query, {0, 1}, {5, 6});
  EXPECT_TRUE(pages.Holds(0, 5, 1));
  EXPECT_TRUE(pages.Holds(0, 6, 3));
  ExpectAllReleased();
}

TEST_F(ManagerTest, AClosingWriterLeavesGroupsItHelpedSealAndOthersAssemblies) {
  Start(8u << 20);
  // One namespace, a group of 2 slots; rank 0 (this session) holds slot 0, rank 1 slot 1.
  auto rank = [](uint32_t slot) {
    InstanceLayout l = SplitLayout(4, {600, 900});
    GroupLayout& g = l.groups[0];
    SlotLayout s = g.slots[slot];
    s.region = 0;
    g.slots = {s};
    l.region_bytes = {l.region_bytes[slot]};
    return l;
  };
  InstanceLayout l0 = rank(0), l1 = rank(1);
  HostPages p0(l0), p1(l1);
  SessionId s1 = mgr->OpenSession(getpid());
  InstanceId r0 = Register(p0, l0, "tp2"), r1 = Register(p1, l1, "tp2", s1);
  p0.Fill(0, 0, 7);
  p1.Fill(0, 0, 7);
  EXPECT_EQ(Publish(r0, {5}, {0}).sealed, 0u);  // rank 0's half of key 5
  ASSERT_EQ(mgr->Publish(s1, {r1, 0, {K(5)}, {0}, {}})->sealed, 1u);
  ASSERT_EQ(mgr->Publish(s1, {r1, 0, {K(6)}, {0}, {}})->sealed, 0u);  // rank 1's half of 6
  mgr->CloseSession(session);  // rank 0 dies: key 5 is sealed, key 6 is rank 1's
  EXPECT_EQ(mgr->gauges().dram.assembling_entries, 1u);
  QueryResult q = *mgr->Query(s1, {r1, 0, {K(5)}, 5000});
  ASSERT_EQ(q.prefix, 1u);
  ASSERT_TRUE(mgr->Restore(s1, {r1, q.query, {0}, {2}}).ok());
  EXPECT_TRUE(p1.Holds(0, 2, 7));
  mgr->CloseSession(s1);
  session = mgr->OpenSession(getpid());
  ExpectAllReleased();
}

// An instance holding no slot of a group got stored=1 and an assembly that
// could never complete.
TEST_F(ManagerTest, PublishOfSlotsTheInstanceDoesNotHoldIsRefused) {
  Start(8u << 20);
  InstanceLayout l = SplitLayout(4, {600});
  GroupLayout other;  // group 1: two slots, both held by another rank
  other.group_id = 1;
  other.num_slots = 2;
  other.slot_bytes = {600, 600};
  l.groups.push_back(other);
  HostPages pages(l);
  InstanceId inst = Register(pages, l, "tp2");
  auto none = mgr->Publish(session, {inst, 1, {K(1)}, {0}, {}});
  ASSERT_TRUE(none.status().code() == StatusCode::kInvalidArgument) << none.status().ToString();
  EXPECT_NE(none.status().ToString().find("group 1"), std::string::npos);
  auto foreign = mgr->Publish(session, {inst, 1, {K(1)}, {0}, {1}});
  ASSERT_TRUE(foreign.status().code() == StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().ToString().find("group 1: slot 1"), std::string::npos)
      << foreign.status().ToString();
  EXPECT_EQ(mgr->gauges().dram.assembling_entries, 0u);
  EXPECT_EQ(mgr->gauges().dram.used_bytes, 0u);
  ExpectAllReleased();
}

// A namespace's slot sizes stayed fixed until restart, even after its last
// instance unregistered.
TEST_F(ManagerTest, NamespaceSlotSizesAreReleasedWithItsLastInstance) {
  Start(8u << 20);
  InstanceLayout old_shape = SplitLayout(8, {4000}), new_shape = SplitLayout(8, {4001});
  HostPages po(old_shape), pn(new_shape);
  InstanceId first = Register(po, old_shape, "model-a");
  po.Fill(0, 0, 1);
  Publish(first, {1}, {0});
  RegisterRequest r;
  r.ns = "model-a";
  r.layout = new_shape;
  EXPECT_TRUE(mgr->RegisterInstance(session, r, pn.DupFds()).status().code() ==
              StatusCode::kInvalidArgument)
      << "an instance is live: its shape holds";
  ASSERT_TRUE(mgr->UnregisterInstance(session, first).ok());
  auto second = mgr->RegisterInstance(session, r, pn.DupFds());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  // Objects of the old shape are never served to the new one, nor block its publishes.
  EXPECT_EQ(Query(*second, {1}).prefix, 0u);
  pn.Fill(0, 0, 2);
  EXPECT_EQ(Publish(*second, {1}, {0}).sealed, 1u);
  QueryResult q = Query(*second, {1});
  ASSERT_EQ(q.prefix, 1u);
  Restore(*second, q.query, {0}, {4});
  EXPECT_TRUE(pn.Holds(0, 4, 2));
  ASSERT_TRUE(mgr->UnregisterInstance(session, *second).ok());
  // The same shape again keeps the namespace's cache.
  InstanceId third = Register(pn, new_shape, "model-a");
  QueryResult kept = Query(third, {1});
  EXPECT_EQ(kept.prefix, 1u);
  EXPECT_TRUE(mgr->ReleaseQuery(session, kept.query).ok());
  ExpectAllReleased();
}

// --host-copy-threads: a restore into host pages larger than a copy chunk is
// shared with helper threads, and every byte still lands where it belongs.
TEST_F(ManagerTest, HostCopyHelpersShareALargeRestoreAndItStaysByteExact) {
  ManagerConfig c = Config(64u << 20, /*ssd=*/false);
  c.options.host_copy_threads = 2;
  auto m = Manager::Create(c);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  mgr = std::move(m).value();
  session = mgr->OpenSession(getpid());
  InstanceLayout l = SplitLayout(32, {(1u << 20) + 1000, 333 << 10});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  for (uint64_t i = 0; i < 12; ++i) pages.Fill(0, i, 500 + i);
  PublishResult pr =
      Publish(inst, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  ASSERT_EQ(pr.sealed, 12u);
  for (int round = 0; round < 20; ++round) {
    QueryResult q = Query(inst, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    ASSERT_EQ(q.prefix, 12u);
    for (uint64_t p = 16; p < 28; ++p) pages.Fill(0, p, 0);  // poison the destinations
    RestoreResult r = Restore(inst, q.query, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
                              {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27});
    for (const BlockResult& b : r.blocks) ASSERT_TRUE(b.status.ok()) << b.status.ToString();
    for (uint64_t i = 0; i < 12; ++i)
      ASSERT_TRUE(pages.Holds(0, 16 + i, 500 + i)) << round << " " << i;
    if (metrics.Read("orbitkv_host_copy_helped_bytes_total") > 0) break;
  }
  EXPECT_GT(metrics.Read("orbitkv_host_copy_helped_bytes_total"), 0)
      << "no helper took a chunk of 20 restores of 16 MiB";
  EXPECT_TRUE(mgr->UnregisterInstance(session, inst).ok());
  ExpectAllReleased();
}

}  // namespace
}  // namespace orbitkv
