#include "manager/manager.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "store/object_format.h"
#include "store/shard_file.h"
#include "testing/host_pages.h"
#include "testing/temp_dir.h"

namespace orbitkv {
namespace {

using testing::HostPages;
using testing::PageFirstLayout;
using testing::SplitLayout;

BlockKey K(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[31] = 0x5a;
  return k;
}

class ManagerTest : public ::testing::Test {
 protected:
  testing::TempDir dir;
  MetricsRegistry metrics;
  ScriptedIoFaults faults;
  std::unique_ptr<Manager> mgr;
  SessionId session = 0;

  void Start(uint64_t pool, bool ssd = true, uint32_t workers = 1, uint64_t budget = 0,
             Clock* clock = nullptr) {
    ManagerConfig c = Config(pool, ssd, workers, budget, clock);
    auto m = Manager::Create(c);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    mgr = std::move(m).value();
    session = mgr->OpenSession(getpid());
  }

  ManagerConfig Config(uint64_t pool, bool ssd = true, uint32_t workers = 1, uint64_t budget = 0,
                       Clock* clock = nullptr) {
    ManagerConfig c;
    if (clock) c.clock = clock;
    c.options.pool_size = pool;
    if (ssd) {
      c.options.ssd_cache_path = dir.File("cache.bin");
      c.options.ssd_cache_capacity = 64u << 20;
      c.options.ssd_shards = 2;
    }
    c.options.ssd_io_workers = workers;
    c.options.ssd_queue_depth = 8;
    c.lock_memory = false;
    c.metrics = &metrics;
    c.io_faults = &faults;
    c.query_budget_bytes = budget;
    return c;
  }

  InstanceId Register(HostPages& pages, const InstanceLayout& layout, std::string ns = "model-a",
                      SessionId s = 0) {
    RegisterRequest r;
    r.ns = ns;
    r.layout = layout;
    auto id = mgr->RegisterInstance(s ? s : session, r, pages.DupFds());
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : 0;
  }

  PublishResult Publish(InstanceId inst, const std::vector<uint64_t>& keys,
                        const std::vector<uint64_t>& pages, std::vector<uint32_t> slots = {}) {
    PublishRequest p;
    p.instance = inst;
    for (uint64_t k : keys) p.keys.push_back(K(k));
    p.pages = pages;
    p.slot_ids = std::move(slots);
    auto r = mgr->Publish(session, p);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : PublishResult{};
  }

  QueryResult Query(InstanceId inst, const std::vector<uint64_t>& keys) {
    QueryRequest q;
    q.instance = inst;
    for (uint64_t k : keys) q.keys.push_back(K(k));
    auto r = mgr->Query(session, q);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : QueryResult{};
  }

  RestoreResult Restore(InstanceId inst, QueryId q, const std::vector<uint32_t>& blocks,
                        const std::vector<uint64_t>& pages) {
    auto r = mgr->Restore(session, {inst, q, blocks, pages});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : RestoreResult{};
  }

  // Keys 0..n-1 from pages 0..n-1 (seed = key), each written back to SSD before
  // the next, so a small pool evicts the oldest to SSD.
  void PublishOneByOne(InstanceId inst, HostPages& pages, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      pages.Fill(0, i, i);
      Publish(inst, {i}, {i});
      mgr->Drain();
    }
  }

  void ExpectAllReleased() {
    mgr->Drain();
    Manager::Gauges g = mgr->gauges();
    EXPECT_EQ(g.queries, 0u);
    EXPECT_EQ(g.restores_inflight, 0u);
    EXPECT_EQ(g.query_budget_used, 0u);
    EXPECT_EQ(g.dram.pinned_entries, 0u);
    EXPECT_EQ(g.dram.pinned_bytes, 0u);
    EXPECT_EQ(g.dram.assembling_entries, 0u);
    EXPECT_EQ(g.ssd_leases, 0u);
    EXPECT_EQ(g.ssd_pinned_bytes, 0u);
    EXPECT_EQ(g.ssd_reservations, 0u);
  }
};

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

TEST_F(ManagerTest, SsdReadFailureAndCorruptionAreBlockErrors) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
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

TEST_F(ManagerTest, PrepareWarmsSsdObjectsIntoDram) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
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

TEST_F(ManagerTest, UringRestoreAndPrepareRefuseAFlippedPayloadByte) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
  auto [path, off] = FindObject(dir.File("cache.bin"), 2, 0);
  FlipByte(path, off + ObjectHeaderSize(1) + 4321);  // payload, not header
  pages.Fill(0, 60, 77);
  QueryResult q = Query(inst, {0});
  ASSERT_EQ(q.sources[0], Tier::kSsd);
  RestoreResult r = Restore(inst, q.query, {0}, {60});
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
  EXPECT_NE(r.blocks[0].status.message().find("payload CRC32C"), std::string_view::npos)
      << r.blocks[0].status.ToString();
  EXPECT_TRUE(pages.Holds(0, 60, 77)) << "bytes reached the page";
  // Prepare does not warm the damaged object into DRAM (DRAM restores trust it).
  auto n = mgr->Prepare(session, {inst, 0, {K(0), K(1)}});
  ASSERT_TRUE(n.ok());
  mgr->Drain();
  QueryResult q2 = Query(inst, {0, 1});
  ASSERT_EQ(q2.prefix, 2u);
  EXPECT_EQ(q2.sources[0], Tier::kSsd);
  EXPECT_EQ(q2.sources[1], Tier::kDram);
  ASSERT_TRUE(mgr->ReleaseQuery(session, q2.query).ok());
  ExpectAllReleased();
}

TEST_F(ManagerTest, UringRestoreOfAnExtentHoldingAnotherKeysObjectIsCorruption) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
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

TEST_F(ManagerTest, RestoreQueuedPastItsQueryTtlKeepsItsLease) {
  ManualClock clock;
  Start(1u << 20, true, /*workers=*/1, 0, &clock);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
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

TEST_F(ManagerTest, SecondManagerOnTheSsdPathRefusesToStartAndNamesTheHolder) {
  Start(1u << 20);
  InstanceLayout l = SplitLayout(64, {65536});
  HostPages pages(l);
  InstanceId inst = Register(pages, l);
  PublishOneByOne(inst, pages, 40);
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

}  // namespace
}  // namespace orbitkv
