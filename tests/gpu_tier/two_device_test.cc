// Two instances of one namespace (TP ranks 0 and 1) on cuda:0 and cuda:1 with
// one Manager (issue 6), over a two-device FakePlatform: each device gets its
// own lazily created cuFile worker and staging, a group written by both ranks
// assembles in DRAM, is written back through io_uring and restores to both
// devices through cuFile byte-exact; metrics are per device; cancelling a
// restore on one device does not disturb the other; unregister releases all.
#include <unistd.h>

#include <cstring>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "gpu/fake_platform.h"
#include "gpu/fault_injecting_platform.h"
#include "manager/manager.h"
#include "store/object_format.h"
#include "testing/temp_dir.h"

namespace orbitkv {
namespace {

constexpr uint64_t kSlot = (64u << 10) - 1024;  // two slots + header: one 128 KiB extent
constexpr uint64_t kPages = 16;

BlockKey K(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[31] = 0x2d;
  return k;
}
uint8_t Pattern(uint64_t key, uint32_t slot, uint64_t i) {
  return static_cast<uint8_t>(key * 97 + slot * 53 + i * 11 + (i >> 10));
}

gpu::FakePlatformOptions TwoDeviceOptions() {
  gpu::FakePlatformOptions o;
  o.devices = 2;
  return o;
}

struct Rank {
  uint32_t rank = 0;
  std::vector<uint8_t> mem;  // "device" memory of this rank's slot, kPages pages
  InstanceId id = 0;
  uint8_t* page(uint64_t p) { return mem.data() + p * kSlot; }
};

class TwoDevices : public ::testing::Test {
 protected:
  gpu::FakePlatform fake{TwoDeviceOptions()};
  gpu::FaultInjectingPlatform faults{&fake};
  testing::TempDir dir;
  MetricsRegistry metrics;
  std::unique_ptr<Manager> mgr;
  SessionId session = 0;
  Rank ranks[2];

  void SetUp() override {
    ManagerConfig c;
    c.options.pool_size = 32u << 20;
    c.options.ssd_cache_path = dir.File("cache.bin");
    c.options.ssd_cache_capacity = 64u << 20;
    c.options.ssd_shards = 2;
    c.options.ssd_backend = SsdBackend::kCufile;
    c.options.admission_reuse = true;
    c.gpu_slot_bytes = 128u << 10;  // one object per batch
    c.lock_memory = false;
    c.metrics = &metrics;
    c.gpu = &faults;
    auto m = Manager::Create(c);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    mgr = std::move(m).value();
    session = mgr->OpenSession(getpid());
    for (uint32_t r = 0; r < 2; ++r) {
      Rank& k = ranks[r];
      k.rank = r;
      k.mem.assign(kPages * kSlot, 0xEE);
      RegisterRequest req;
      req.ns = "tp2";
      req.rank = r;
      req.device = "cuda:" + std::to_string(r);
      req.layout.num_pages = kPages;
      req.layout.region_bytes = {kPages * kSlot};
      GroupLayout g;
      g.num_slots = 2;
      g.slot_bytes = {kSlot, kSlot};
      g.slots.push_back({r, 0, 0, kSlot, kSlot});
      req.layout.groups.push_back(g);
      req.ipc_handles.push_back(fake.Export(k.mem.data(), k.mem.size(), static_cast<int>(r)));
      auto id = mgr->RegisterInstance(session, req, {});
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      k.id = *id;
    }
  }

  void TearDown() override {
    if (!mgr) return;
    mgr->Drain();
    for (Rank& k : ranks) EXPECT_TRUE(mgr->UnregisterInstance(session, k.id).ok());
    Manager::Gauges g = mgr->gauges();
    EXPECT_EQ(g.ssd_leases, 0u);
    EXPECT_EQ(g.ssd_reservations, 0u);
    EXPECT_EQ(g.gpu_workers, 0u);
    EXPECT_EQ(g.gpu_ipc_mappings, 0u);
    EXPECT_EQ(g.dram.pinned_bytes, 0u);
    for (const char* d : {"cuda:0", "cuda:1"}) {
      EXPECT_EQ(metrics.Read("orbitkv_ssd_gpu_staging_bytes", {{"device", d}}), 0) << d;
    }
    mgr.reset();
    EXPECT_EQ(fake.counters(), gpu::FakePlatformCounters{});
  }

  // Both ranks publish their slot of keys [1, n] from pages [0, n).
  void PublishBoth(uint64_t n) {
    for (Rank& k : ranks) {
      PublishRequest p;
      p.instance = k.id;
      p.slot_ids = {k.rank};
      for (uint64_t i = 0; i < n; ++i) {
        for (uint64_t b = 0; b < kSlot; ++b) k.page(i)[b] = Pattern(1 + i, k.rank, b);
        p.keys.push_back(K(1 + i));
        p.pages.push_back(i);
      }
      auto r = mgr->Publish(session, p);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->stored, n);
      EXPECT_EQ(r->sealed, k.rank == 1 ? n : 0u);  // the second writer completes each group
    }
    mgr->Drain();
  }

  RestoreRequest Plan(Rank& k, uint64_t n, QueryResult* q) {
    QueryRequest qr;
    qr.instance = k.id;
    for (uint64_t i = 0; i < n; ++i) qr.keys.push_back(K(1 + i));
    auto res = mgr->Query(session, qr);
    EXPECT_TRUE(res.ok());
    *q = *res;
    EXPECT_EQ(q->prefix, n);
    for (Tier t : q->sources) EXPECT_EQ(t, Tier::kSsd);
    RestoreRequest r;
    r.instance = k.id;
    r.query = q->query;
    for (uint32_t i = 0; i < n; ++i) {
      r.blocks.push_back(i);
      r.pages.push_back(8 + i);
      std::memset(k.page(8 + i), 0xC3, kSlot);
    }
    return r;
  }

  bool Holds(Rank& k, uint64_t page, uint64_t key) {
    for (uint64_t b = 0; b < kSlot; ++b) {
      if (k.page(page)[b] != Pattern(key, k.rank, b)) return false;
    }
    return true;
  }
};

TEST_F(TwoDevices, GroupWrittenByBothRanksRestoresToBothDevicesThroughCufile) {
  PublishBoth(8);
  EXPECT_GT(metrics.Read("orbitkv_bytes_total", {{"route", "writeback_ssd"}}), 0);  // io_uring
  for (Rank& k : ranks) {
    QueryResult q;
    auto r = mgr->Restore(session, Plan(k, 8, &q));
    ASSERT_TRUE(r.ok());
    for (const BlockResult& b : r->blocks) {
      ASSERT_TRUE(b.status.ok()) << b.status.ToString();
      EXPECT_TRUE(Holds(k, 8 + b.block, 1 + b.block)) << "rank " << k.rank << " block " << b.block;
    }
  }
  // Each device lazily got its own worker and staging; metrics are per device.
  EXPECT_EQ(mgr->gauges().gpu_workers, 2u);
  for (const char* d : {"cuda:0", "cuda:1"}) {
    EXPECT_EQ(metrics.Read("orbitkv_ssd_cufile_read_bytes_total", {{"device", d}}), 8 * (128 << 10))
        << d;
    EXPECT_EQ(metrics.Read("orbitkv_ssd_gpu_staging_bytes", {{"device", d}}), 2 * (128 << 10)) << d;
  }
}

TEST_F(TwoDevices, CancellingOnOneDeviceDoesNotDisturbTheOther) {
  PublishBoth(6);
  QueryResult q0, q1;
  RestoreRequest r0 = Plan(ranks[0], 6, &q0);
  RestoreRequest r1 = Plan(ranks[1], 6, &q1);
  faults.HoldReads(true);
  std::promise<Result<RestoreResult>> done0;
  std::future<Result<RestoreResult>> f0 = done0.get_future();
  auto id0 = mgr->StartRestore(session, r0,
                               [&](Result<RestoreResult> r) { done0.set_value(std::move(r)); });
  ASSERT_TRUE(id0.ok());
  while (faults.held_events() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  faults.HoldReads(false);
  auto released = mgr->CancelRestore(session, *id0);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(*released, 4u);
  // cuda:1 restores in full while cuda:0's two slots are still held.
  auto res1 = mgr->Restore(session, r1);
  ASSERT_TRUE(res1.ok());
  for (const BlockResult& b : res1->blocks) {
    ASSERT_TRUE(b.status.ok()) << b.status.ToString();
    EXPECT_TRUE(Holds(ranks[1], 8 + b.block, 1 + b.block));
  }
  EXPECT_EQ(f0.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  faults.ReleaseHeld();
  Result<RestoreResult> res0 = f0.get();
  ASSERT_TRUE(res0.ok());
  int ok = 0;
  for (const BlockResult& b : res0->blocks) {
    if (b.status.ok()) {
      ++ok;
      EXPECT_TRUE(Holds(ranks[0], 8 + b.block, 1 + b.block));
    } else {
      EXPECT_EQ(b.status.code(), StatusCode::kCancelled);
    }
  }
  EXPECT_EQ(ok, 2);
}

// Bad CUDA registrations fail with the reason and leave nothing mapped.
TEST_F(TwoDevices, BadCudaRegistrationsAreRefusedAndReleaseWhatTheyMapped) {
  std::vector<uint8_t> small(4096);
  RegisterRequest req;
  req.ns = "tp2";
  req.device = "cuda:0";
  req.layout = SplitLayout(kPages, {kSlot, kSlot});
  // Two regions: one real but too small, one handle nobody exported.
  req.ipc_handles.push_back(fake.Export(small.data(), small.size(), 0));
  req.ipc_handles.push_back(gpu::IpcHandle{});
  const int mapped_before = fake.open_ipc_mappings();
  auto r = mgr->RegisterInstance(session, req, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("the layout needs"), std::string_view::npos)
      << r.status().ToString();
  EXPECT_EQ(fake.open_ipc_mappings(), mapped_before);
  std::vector<uint8_t> big(kPages * kSlot);
  req.ipc_handles[0] = fake.Export(big.data(), big.size(), 0);
  r = mgr->RegisterInstance(session, req, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("region 1"), std::string_view::npos) << r.status().ToString();
  EXPECT_EQ(fake.open_ipc_mappings(), mapped_before);
  req.ipc_handles.pop_back();  // one handle for two regions
  r = mgr->RegisterInstance(session, req, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("CUDA IPC handles"), std::string_view::npos)
      << r.status().ToString();
  req.device = "cuda:01";
  r = mgr->RegisterInstance(session, req, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fake.open_ipc_mappings(), mapped_before);
}

}  // namespace
}  // namespace orbitkv
