#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "manager/manager_test_fixture.h"

namespace orbitkv {
namespace {

// A foreign file as the SSD cache is refused before the pool is mapped and
// registered (it was refused only after the whole pool had been faulted in
// and locked: 80 s for the default 4 GB on a loaded CI machine).
TEST_F(ManagerTest, ForeignSsdFileIsRefusedBeforeThePoolIsAllocated) {
  ManagerConfig c = Config(8u << 20);
  {
    std::FILE* f = std::fopen(c.options.ssd_cache_path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string notes(100000, 'x');
    ASSERT_EQ(std::fwrite(notes.data(), 1, notes.size(), f), notes.size());
    std::fclose(f);
  }
  int arenas = 0;
  c.register_host_memory = [&](void*, uint64_t) {
    ++arenas;
    return Status::OK();
  };
  c.unregister_host_memory = [](void*) {};
  auto m = Manager::Create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().ToString().find(c.options.ssd_cache_path), std::string::npos)
      << m.status().ToString();
  EXPECT_EQ(arenas, 0) << "the pool was allocated before the SSD cache was checked";
}

TEST_F(ManagerTest, BadInputGetsAnErrorAndChangesNothing) {
  Start(8u << 20);
  InstanceLayout l = SplitLayout(8, {4000});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  // Publish: page out of range, unknown group, slot not held, key/page mismatch.
  EXPECT_FALSE(mgr->Publish(session, {inst, 0, {K(1)}, {8}, {}}).ok());
  EXPECT_FALSE(mgr->Publish(session, {inst, 3, {K(1)}, {0}, {}}).ok());
  EXPECT_FALSE(mgr->Publish(session, {inst, 0, {K(1)}, {0}, {5}}).ok());
  EXPECT_FALSE(mgr->Publish(session, {inst, 0, {K(1), K(2)}, {0}, {}}).ok());
  EXPECT_FALSE(mgr->Publish(session, {inst + 100, 0, {K(1)}, {0}, {}}).ok());
  // Another session cannot use this instance or its queries.
  SessionId other = mgr->OpenSession(1);
  EXPECT_FALSE(mgr->Publish(other, {inst, 0, {K(1)}, {0}, {}}).ok());
  Publish(inst, {1}, {0});
  QueryResult q = Query(inst, {1});
  EXPECT_FALSE(mgr->Restore(other, {inst, q.query, {0}, {1}}).ok());
  // Restore: block beyond the prefix, page out of range, duplicates.
  EXPECT_FALSE(mgr->Restore(session, {inst, q.query, {1}, {1}}).ok());
  EXPECT_FALSE(mgr->Restore(session, {inst, q.query, {0}, {99}}).ok());
  EXPECT_FALSE(mgr->Restore(session, {inst, q.query, {0, 0}, {1, 2}}).ok());
  // The query survived the bad restores.
  RestoreResult ok = Restore(inst, q.query, {0}, {1});
  EXPECT_TRUE(ok.blocks[0].status.ok());
  // Register: fd that is not a memfd, memfd without seals, region too small, layout errors.
  RegisterRequest rr;
  rr.ns = "x";
  rr.layout = l;
  int devnull = ::open("/dev/null", O_RDWR);
  EXPECT_FALSE(mgr->RegisterInstance(session, rr, {devnull}).ok());
  int unsealed = ::memfd_create("x", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, 1 << 20), 0);
  EXPECT_FALSE(mgr->RegisterInstance(session, rr, {unsealed}).ok());
  InstanceLayout big = l;
  big.region_bytes[0] *= 2;
  rr.layout = big;
  EXPECT_FALSE(mgr->RegisterInstance(session, rr, pages.DupFds()).ok());
  rr.layout = l;
  rr.layout.groups[0].slots[0].page_stride = 1ull << 62;
  EXPECT_FALSE(mgr->RegisterInstance(session, rr, pages.DupFds()).ok());
  rr.layout = l;
  rr.device = "cuda:0";
  EXPECT_FALSE(mgr->RegisterInstance(session, rr, pages.DupFds()).ok());
  // A second instance of the namespace with other slot sizes is refused.
  InstanceLayout l2 = SplitLayout(8, {4001});
  HostPages p2(l2);
  RegisterRequest r2;
  r2.ns = "model-a";
  r2.layout = l2;
  EXPECT_FALSE(mgr->RegisterInstance(session, r2, p2.DupFds()).ok());
  mgr->CloseSession(other);
  ExpectAllReleased();
}

// Where key v's object starts in the shard files (its header's magic and key).
std::pair<std::string, uint64_t> FindObject(const std::string& base, uint32_t shards, uint64_t v) {
  const BlockKey key = K(v);
  for (const std::string& path : ShardPaths(base, shards)) {
    std::ifstream in(path, std::ios::binary);
    std::string file{std::istreambuf_iterator<char>(in), {}};
    for (uint64_t off = kShardHeaderSize; off + 64 <= file.size(); off += 4096) {
      if (std::memcmp(file.data() + off, kObjectMagic, sizeof kObjectMagic) == 0 &&
          std::memcmp(file.data() + off + 32, key.data(), key.size()) == 0) {
        return {path, off};
      }
    }
  }
  ADD_FAILURE() << "key " << v << " is not on disk";
  return {};
}

void FlipByte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x20;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

// The SSD tests' start: a 1 MiB pool over the SSD cache, one instance of 64
// pages of 64 KiB, and keys 0..n-1 published one by one from pages 0..n-1, so
// the oldest keys are left on SSD only.
class ManagerSsdTest : public ManagerTest {
 protected:
  void StartWithKeysOnSsd(uint64_t n = 40, Clock* clock = nullptr, uint64_t budget = 0) {
    Start(1u << 20, true, /*workers=*/1, budget, clock);
    inst = Register(pages, l);
    PublishOneByOne(inst, pages, n);
  }

  // Flips a byte of key `key`'s object payload (`at` bytes past its header).
  void FlipPayloadByte(uint64_t key, uint64_t at) {
    auto [path, off] = FindObject(dir.File("cache.bin"), 2, key);
    FlipByte(path, off + ObjectHeaderSize(1) + at);
  }

  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages{l};
  InstanceId inst = 0;
};

TEST_F(ManagerSsdTest, SsdReadFailureAndCorruptionAreBlockErrors) {
  StartWithKeysOnSsd();
  faults.AddRule({IoOp::kRead, 1, ScriptedIoFaults::Fault::kError, EIO});
  QueryResult q = Query(inst, {0});
  ASSERT_EQ(q.sources[0], Tier::kSsd);
  RestoreResult r = Restore(inst, q.query, {0}, {60});
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kIOError) << r.blocks[0].status.ToString();
  // Corrupt every shard's data region: a restore must fail, not return junk.
  for (const std::string& p : ShardPaths(dir.File("cache.bin"), 2)) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    std::string junk(1 << 20, 'J');
    f.seekp(kShardHeaderSize);
    f.write(junk.data(), junk.size());
  }
  QueryResult q2 = Query(inst, {1});
  ASSERT_EQ(q2.prefix, 1u);
  RestoreResult r2 = Restore(inst, q2.query, {0}, {61});
  EXPECT_EQ(r2.blocks[0].status.code(), StatusCode::kCorruption) << r2.blocks[0].status.ToString();
  ExpectAllReleased();
}

// The query budget ends a prefix at an SSD block: that block's lease, taken
// before the budget said no, is given back (QueryTable::Open builds the block
// in the query's own list and takes it off again), and the blocks before it
// keep theirs until the query goes.
TEST_F(ManagerSsdTest, ABudgetCutAtAnSsdBlockGivesItsLeaseBack) {
  // 64 KiB objects and their headers: four fit 5 x 64 KiB, the fifth does not.
  StartWithKeysOnSsd(40, nullptr, /*budget=*/5 * 65536);
  QueryResult q = Query(inst, {0, 1, 2, 3, 4, 5});
  ASSERT_EQ(q.prefix, 4u);
  EXPECT_TRUE(q.budget_limited);
  for (Tier t : q.sources) EXPECT_EQ(t, Tier::kSsd);
  EXPECT_EQ(metrics.Read("orbitkv_query_budget_cuts_total", {{"limit", "manager"}}), 1);
  EXPECT_EQ(mgr->gauges().ssd_leases, 4u);
  // What it holds restores byte-exact.
  RestoreResult r = Restore(inst, q.query, {0, 3}, {60, 61});
  ASSERT_EQ(r.blocks.size(), 2u);
  for (const BlockResult& b : r.blocks) EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 0));
  EXPECT_TRUE(pages.Holds(0, 61, 3));
  EXPECT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  ExpectAllReleased();
}

TEST_F(ManagerSsdTest, PrepareWarmsSsdObjectsIntoDram) {
  StartWithKeysOnSsd();
  ASSERT_EQ(Query(inst, {0}).sources[0], Tier::kSsd);
  mgr->CloseSession(session);
  session = mgr->OpenSession(getpid());
  inst = Register(pages, l);
  auto n = mgr->Prepare(session, {inst, 0, {K(0), K(1)}});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  mgr->Drain();
  QueryResult q = Query(inst, {0, 1});
  ASSERT_EQ(q.prefix, 2u);
  EXPECT_EQ(q.sources[0], Tier::kDram);
  Restore(inst, q.query, {0, 1}, {62, 63});
  EXPECT_TRUE(pages.Holds(0, 62, 0));
  EXPECT_TRUE(pages.Holds(0, 63, 1));
  ExpectAllReleased();
}

// ---- integrity (issue 10) ------------------------------------------------------

TEST_F(ManagerSsdTest, UringRestoreAndPrepareRefuseAFlippedPayloadByte) {
  StartWithKeysOnSsd();
  for (uint64_t key : {0, 2}) FlipPayloadByte(key, 4321);
  pages.Fill(0, 60, 77);
  QueryResult q = Query(inst, {0});
  ASSERT_EQ(q.sources[0], Tier::kSsd);
  RestoreResult r = Restore(inst, q.query, {0}, {60});
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
  EXPECT_NE(r.blocks[0].status.message().find("payload CRC32C"), std::string_view::npos)
      << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 77)) << "bytes reached the page";
  // Prepare does not warm a damaged object into DRAM (DRAM restores trust it);
  // the good one it does.
  auto n = mgr->Prepare(session, {inst, 0, {K(2), K(1)}});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  mgr->Drain();
  QueryResult q2 = Query(inst, {1});
  ASSERT_EQ(q2.prefix, 1u);
  EXPECT_EQ(q2.sources[0], Tier::kDram);
  ASSERT_TRUE(mgr->ReleaseQuery(session, q2.query).ok());
  // Both damaged objects left the SSD cache (the restore's and the prepare's).
  EXPECT_EQ(Query(inst, {2}).prefix, 0u);
  EXPECT_EQ(Query(inst, {0}).prefix, 0u);
  EXPECT_EQ(metrics.Read("orbitkv_ssd_corrupt_objects_dropped_total"), 2);
  ExpectAllReleased();
}

// A restore that finds an SSD object damaged drops it from the SSD cache.
// Before, the damaged extent stayed in the SSD directory, so the next publish
// of the key was skipped as "already present" and the key could not be cached
// again until the Manager restarted.
TEST_F(ManagerSsdTest, KeyRepublishedAfterACorruptSsdRestoreIsStoredAndRestoresExactly) {
  StartWithKeysOnSsd();  // key 0 left DRAM; only its SSD copy is left
  FlipPayloadByte(0, 999);
  QueryResult q = Query(inst, {0});
  ASSERT_EQ(q.sources[0], Tier::kSsd);
  RestoreResult r = Restore(inst, q.query, {0}, {60});
  ASSERT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
  EXPECT_EQ(metrics.Read("orbitkv_ssd_corrupt_objects_dropped_total"), 1);
  EXPECT_EQ(Query(inst, {0}).prefix, 0u) << "the damaged object is still served";

  // Published again, the key is stored, not skipped as already present.
  pages.Fill(0, 0, 0);
  PublishResult p = Publish(inst, {0}, {0});
  EXPECT_EQ(p.skipped, 0u);
  EXPECT_EQ(p.sealed, 1u);
  mgr->Drain();
  for (uint64_t k = 100; k < 120; ++k) {  // push key 0 out of DRAM: restore its new SSD copy
    pages.Fill(0, 1, k);
    Publish(inst, {k}, {1});
    mgr->Drain();
  }
  ExpectRestores(pages, inst, 0, 61, Tier::kSsd);
  ExpectAllReleased();
}

// Only the SSD copy was damaged: a DRAM copy of the object stays and serves.
// A query that leased the damaged extent before it was dropped reads it to
// the end (Corruption) and releases it.
TEST_F(ManagerSsdTest, CorruptSsdCopyIsDroppedAndTheDramCopyStillServes) {
  StartWithKeysOnSsd();
  QueryResult first = Query(inst, {0}), second = Query(inst, {0});
  ASSERT_EQ(first.sources[0], Tier::kSsd);
  ASSERT_EQ(second.sources[0], Tier::kSsd);
  RestoreResult r1 = Restore(inst, first.query, {0}, {60});  // promotes key 0 into DRAM
  ASSERT_TRUE(r1.blocks[0].status.ok()) << r1.blocks[0].status.ToString();
  FlipPayloadByte(0, 5);
  RestoreResult r2 = Restore(inst, second.query, {0}, {61});
  ASSERT_EQ(r2.blocks.size(), 1u);  // a failed call is a test failure, not a crash
  EXPECT_EQ(r2.blocks[0].status.code(), StatusCode::kCorruption) << r2.blocks[0].status.ToString();
  EXPECT_EQ(metrics.Read("orbitkv_ssd_corrupt_objects_dropped_total"), 1);
  ExpectRestores(pages, inst, 0, 62, Tier::kDram);
  ExpectAllReleased();
}

TEST_F(ManagerSsdTest, UringRestoreOfAnExtentHoldingAnotherKeysObjectIsCorruption) {
  StartWithKeysOnSsd();
  auto [p0, o0] = FindObject(dir.File("cache.bin"), 2, 0);
  auto [p1, o1] = FindObject(dir.File("cache.bin"), 2, 1);
  {
    std::ifstream in(p1, std::ios::binary);
    std::string other(AlignUp(ObjectSize({65536}), 4096), '\0');
    in.seekg(static_cast<std::streamoff>(o1));
    in.read(other.data(), static_cast<std::streamsize>(other.size()));
    std::fstream out(p0, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(static_cast<std::streamoff>(o0));
    out.write(other.data(), static_cast<std::streamsize>(other.size()));
  }
  pages.Fill(0, 60, 77);
  QueryResult q = Query(inst, {0});
  RestoreResult r = Restore(inst, q.query, {0}, {60});
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 77));
  ExpectAllReleased();
}

TEST_F(ManagerSsdTest, RestoreQueuedPastItsQueryTtlKeepsItsLease) {
  ManualClock& clock = manual_clock;  // the fixture's: it must outlive mgr
  StartWithKeysOnSsd(40, &clock);
  auto query = [&](uint64_t key) {
    auto r = mgr->Query(session, QueryRequest{inst, 0, {K(key)}, /*ttl_ms=*/1000});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : QueryResult{};
  };
  QueryResult qa = query(0), qb = query(1);
  ASSERT_EQ(qa.sources[0], Tier::kSsd);
  ASSERT_EQ(qb.sources[0], Tier::kSsd);
  // The single reader stalls on A's read; B waits in the queue past its TTL.
  faults.AddRule(
      {IoOp::kRead, 1, ScriptedIoFaults::Fault::kStall, 0, false, std::chrono::milliseconds(400)});
  std::promise<Result<RestoreResult>> a_done, b_done;
  ASSERT_TRUE(mgr->StartRestore(session, {inst, qa.query, {0}, {50}},
                                [&](Result<RestoreResult> r) { a_done.set_value(std::move(r)); })
                  .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(mgr->StartRestore(session, {inst, qb.query, {0}, {51}},
                                [&](Result<RestoreResult> r) { b_done.set_value(std::move(r)); })
                  .ok());
  EXPECT_EQ(mgr->gauges().ssd_restore_reads, 2u);  // A reading, B queued: writeback yields
  clock.Advance(std::chrono::seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the reaper runs every 50 ms
  auto ar = a_done.get_future().get();
  auto br = b_done.get_future().get();
  ASSERT_TRUE(ar.ok() && br.ok());
  EXPECT_TRUE(ar->blocks[0].status.ok()) << ar->blocks[0].status.ToString();
  EXPECT_TRUE(br->blocks[0].status.ok()) << br->blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 50, 0));
  EXPECT_TRUE(pages.Holds(0, 51, 1));
  ExpectAllReleased();
}

TEST_F(ManagerSsdTest, SecondManagerOnTheSsdPathRefusesToStartAndNamesTheHolder) {
  StartWithKeysOnSsd();
  MetricsRegistry other_metrics;
  ManagerConfig c = Config(1u << 20);
  c.metrics = &other_metrics;
  auto second = Manager::Create(c);
  ASSERT_FALSE(second.ok()) << "two Managers share " << dir.File("cache.bin");
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("pid " + std::to_string(getpid())),
            std::string_view::npos)
      << second.status().ToString();
  // The first one's objects are untouched.
  QueryResult q = Query(inst, {0});
  ASSERT_EQ(q.sources[0], Tier::kSsd);
  RestoreResult r = Restore(inst, q.query, {0}, {60});
  EXPECT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 0));
  ExpectAllReleased();
  mgr.reset();  // its locks go with it
  ASSERT_TRUE(Manager::Create(c).ok());
}

// --admission reuse reaches the Manager through ManagerOptions alone (it was
// once a second ManagerConfig field, and the option was ignored).
TEST_F(ManagerTest, AdmissionReuseOptionSendsFirstSeenKeysToSsdOnly) {
  ManagerConfig c = Config(8u << 20);
  c.options.admission_reuse = true;
  auto m = Manager::Create(c);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  mgr = std::move(m).value();
  session = mgr->OpenSession(getpid());
  InstanceLayout l = SplitLayout(16, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  pages.Fill(0, 0, 7);
  EXPECT_EQ(Publish(inst, {0}, {0}).sealed, 1u);
  mgr->Drain();
  QueryResult q = Query(inst, {0});
  ASSERT_EQ(q.prefix, 1u);
  EXPECT_EQ(q.sources[0], Tier::kSsd) << "a key seen once stayed in DRAM under --admission reuse";
  RestoreResult r = Restore(inst, q.query, {0}, {5});
  EXPECT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 5, 7));
  ExpectAllReleased();
}

// ClearNamespace drops the namespace's objects from DRAM and SSD and nothing
// of another namespace. Sources a query took before the clear still restore
// exactly (and are not promoted back into DRAM), then are released.
TEST_F(ManagerSsdTest, ClearNamespaceDropsItsObjectsFromDramAndSsdAndNothingElse) {
  StartWithKeysOnSsd(30);  // all on SSD, the newest in DRAM too
  HostPages other_pages(l);
  InstanceId other = Register(other_pages, l, "model-b");
  other_pages.Fill(0, 5, 5);
  Publish(other, {5}, {5});
  mgr->Drain();
  QueryResult held_ssd = Query(inst, {0}), held_dram = Query(inst, {29});
  ASSERT_EQ(held_ssd.sources[0], Tier::kSsd);
  ASSERT_EQ(held_dram.sources[0], Tier::kDram);

  Result<ClearNamespaceResult> cleared = mgr->ClearNamespace(session, {inst});
  ASSERT_TRUE(cleared.ok()) << cleared.status().ToString();
  EXPECT_GT(cleared->dram_objects, 0u);
  EXPECT_EQ(cleared->ssd_objects, 30u);
  for (uint64_t k = 0; k < 30; ++k) EXPECT_EQ(Query(inst, {k}).prefix, 0u) << "key " << k;
  ExpectRestores(other_pages, other, 5, 40, Tier::kDram);  // the other namespace keeps it

  RestoreResult r = Restore(inst, held_ssd.query, {0}, {60});
  EXPECT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 0));
  r = Restore(inst, held_dram.query, {0}, {61});
  EXPECT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 61, 29));
  EXPECT_EQ(Query(inst, {0}).prefix, 0u) << "a restore promoted a cleared object";
  EXPECT_EQ(mgr->ClearNamespace(session, {inst + 1000}).status().code(), StatusCode::kNotFound);
  // Published again, a key is stored and served.
  pages.Fill(0, 0, 0);
  EXPECT_EQ(Publish(inst, {0}, {0}).sealed, 1u);
  mgr->Drain();
  ExpectRestores(pages, inst, 0, 62, Tier::kDram);
  ExpectAllReleased();
}

// CI stop 26 (SGLang's clear() test): a key published just before
// ClearNamespace was still restorable after it. Its writeback had reserved an
// SSD extent before the clear and published it after, so the cleared object
// came back from the SSD. Now that write is aborted and the key stays gone.
TEST_F(ManagerSsdTest, ClearNamespaceDuringAWritebackDoesNotBringTheObjectBack) {
  StartWithKeysOnSsd(0);
  faults.AddRule(
      {IoOp::kWrite, 1, ScriptedIoFaults::Fault::kStall, 0, false, std::chrono::milliseconds(300)});
  pages.Fill(0, 0, 0);
  ASSERT_EQ(Publish(inst, {0}, {0}).sealed, 1u);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (mgr->gauges().ssd_reservations == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(mgr->gauges().ssd_reservations, 1u) << "the writeback never reserved its extent";
  Result<ClearNamespaceResult> cleared = mgr->ClearNamespace(session, {inst});
  ASSERT_TRUE(cleared.ok()) << cleared.status().ToString();
  EXPECT_EQ(cleared->ssd_objects, 0u);  // the write was still under way
  mgr->Drain();                         // the stalled write finishes
  EXPECT_EQ(Query(inst, {0}).prefix, 0u) << "the cleared object came back from the SSD";
  ExpectAllReleased();
  // Published again after the clear, it is written back and served from SSD.
  pages.Fill(0, 1, 0);
  ASSERT_EQ(Publish(inst, {0}, {1}).sealed, 1u);
  mgr->Drain();
  ExpectRestores(pages, inst, 0, 2, Tier::kDram);
  ExpectAllReleased();
}

}  // namespace
}  // namespace orbitkv
