// --publish-depth (Publish's D2H pipeline, manager/publish.cc): two instances
// on one CUDA device (a FakePlatform, whose streams run their work on threads
// of their own, in order) publish at once, each call many small D2H batches
// pipelined 1, 2 or 4 deep. Every object restores byte-exact; each call had
// exactly `depth` jobs in flight at its peak (each job holds a D2H stream of
// its instance until its wait, so the streams made say so); unregistering and
// destroying the Manager release every stream, event and mapping.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "gpu/fake_platform.h"
#include "gpu/fault_injecting_platform.h"
#include "manager/manager.h"

namespace orbitkv {
namespace {

constexpr uint64_t kSlot = 24u << 10;
constexpr uint64_t kPages = 96;
constexpr uint64_t kKeys = 40;  // published from pages [0, kKeys), restored into [48, 48 + kKeys)

BlockKey K(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[31] = 0x5d;
  return k;
}
uint8_t Pattern(uint32_t inst, uint64_t key, uint32_t slot, uint64_t i) {
  return static_cast<uint8_t>(inst * 29 + key * 97 + slot * 53 + i * 11 + (i >> 9));
}

struct Engine {
  std::vector<uint8_t> mem[2];  // "device" memory: one region per slot, kPages pages
  InstanceId id = 0;
  uint8_t* page(uint32_t slot, uint64_t p) { return mem[slot].data() + p * kSlot; }
};

class PublishDepthTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  gpu::FakePlatform fake;
  gpu::FaultInjectingPlatform faults{&fake};
  MetricsRegistry metrics;
  std::unique_ptr<Manager> mgr;
  SessionId session = 0;
  Engine engines[2];

  void SetUp() override {
    ManagerConfig c;
    c.options.pool_size = 32u << 20;
    c.options.publish_batch_bytes = 64u << 10;  // two objects per batch: many jobs per call
    c.options.publish_depth = GetParam();
    c.lock_memory = false;
    c.metrics = &metrics;
    c.gpu = &faults;
    auto m = Manager::Create(c);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    mgr = std::move(m).value();
    session = mgr->OpenSession(getpid());
    for (uint32_t e = 0; e < 2; ++e) {
      Engine& g = engines[e];
      RegisterRequest req;
      req.ns = "publish-depth-" + std::to_string(e);
      req.device = "cuda:0";
      req.layout.num_pages = kPages;
      GroupLayout grp;
      grp.num_slots = 2;
      grp.slot_bytes = {kSlot, kSlot};
      for (uint32_t s = 0; s < 2; ++s) {
        g.mem[s].assign(kPages * kSlot, 0xEE);
        req.layout.region_bytes.push_back(kPages * kSlot);
        grp.slots.push_back({s, s, 0, kSlot, kSlot});
        req.ipc_handles.push_back(fake.Export(g.mem[s].data(), g.mem[s].size(), 0));
      }
      req.layout.groups.push_back(grp);
      auto id = mgr->RegisterInstance(session, req, {});
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      g.id = *id;
    }
  }

  void TearDown() override {
    if (!mgr) return;
    for (Engine& g : engines) EXPECT_TRUE(mgr->UnregisterInstance(session, g.id).ok());
    // Nothing of a call is left: no assembly unsealed, no pool scratch (the
    // GPU CRCs'), no pin.
    const DramStats d = mgr->gauges().dram;
    EXPECT_EQ(d.assembling_entries, 0u);
    EXPECT_EQ(d.scratch_bytes, 0u);
    EXPECT_EQ(d.pinned_bytes, 0u);
    mgr.reset();
    EXPECT_EQ(fake.counters(), gpu::FakePlatformCounters{});
  }

  Result<PublishResult> PublishAll(uint32_t e) {
    Engine& g = engines[e];
    PublishRequest p;
    p.instance = g.id;
    for (uint64_t k = 0; k < kKeys; ++k) {
      for (uint32_t s = 0; s < 2; ++s) {
        for (uint64_t b = 0; b < kSlot; ++b) g.page(s, k)[b] = Pattern(e, 1 + k, s, b);
      }
      p.keys.push_back(K(1 + k));
      p.pages.push_back(k);
    }
    return mgr->Publish(session, p);
  }

  // Restores keys [1, n] of engine e into pages [48, 48 + n) and expects each
  // to hold exactly what was published.
  void RestoreExact(uint32_t e, uint64_t n) {
    Engine& g = engines[e];
    QueryRequest qr;
    qr.instance = g.id;
    for (uint64_t k = 0; k < kKeys; ++k) qr.keys.push_back(K(1 + k));
    auto q = mgr->Query(session, qr);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    ASSERT_EQ(q->prefix, n);
    RestoreRequest rr;
    rr.instance = g.id;
    rr.query = q->query;
    for (uint32_t k = 0; k < n; ++k) {
      rr.blocks.push_back(k);
      rr.pages.push_back(48 + k);
      for (uint32_t s = 0; s < 2; ++s) std::memset(g.page(s, 48 + k), 0xC3, kSlot);
    }
    auto r = mgr->Restore(session, rr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->blocks.size(), n);
    for (const BlockResult& b : r->blocks) {
      ASSERT_TRUE(b.status.ok()) << b.status.ToString();
      for (uint32_t s = 0; s < 2; ++s) {
        const uint8_t* got = g.page(s, 48 + b.block);
        uint64_t bad = kSlot;
        for (uint64_t i = 0; i < kSlot && bad == kSlot; ++i) {
          if (got[i] != Pattern(e, 1 + b.block, s, i)) bad = i;
        }
        EXPECT_EQ(bad, kSlot) << "instance " << e << " block " << b.block << " slot " << s;
      }
    }
  }
};

TEST_P(PublishDepthTest, ConcurrentPublishesOfTwoInstancesOnOneDeviceRestoreByteExact) {
  const int streams_before = fake.counters().live_streams;
  Result<PublishResult> results[2] = {Status::Internal("not run"), Status::Internal("not run")};
  {
    std::thread t0([&] { results[0] = PublishAll(0); });
    std::thread t1([&] { results[1] = PublishAll(1); });
    t0.join();
    t1.join();
  }
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->stored, kKeys);
    EXPECT_EQ(r->sealed, kKeys);
  }
  // Each instance made one up front; a call with `depth` jobs in flight
  // holds two streams per job at its peak (the copies' and the CRCs') and
  // keeps them for reuse.
  EXPECT_EQ(fake.counters().live_streams - streams_before,
            2 * (2 * static_cast<int>(GetParam()) - 1));
  for (uint32_t e = 0; e < 2; ++e) RestoreExact(e, kKeys);
}

// A D2H job that fails part way through a call, with `depth` jobs in flight:
// the call returns the error; every object before the failed page is stored
// byte-exact (the failed batch is redone object by object), jobs already in
// flight behind it are waited for and sealed or aborted, and nothing of the
// call stays in the pool (TearDown).
TEST_P(PublishDepthTest, FailedD2hPartWayLeavesTheObjectsBeforeItExactAndNothingHeld) {
  constexpr uint64_t kFailedPage = 25;
  faults.RefuseCopiesFrom(reinterpret_cast<gpu::DevPtr>(engines[0].page(0, kFailedPage)), kSlot, 2,
                          Status::IOError("injected D2H failure of page 25", EIO));
  Result<PublishResult> r = PublishAll(0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected D2H failure of page 25"), std::string::npos)
      << r.status().ToString();
  RestoreExact(0, kFailedPage);
}

// Issue 18 (Manager CPU per GB): a request thread waiting for a D2H job
// with more of its call's jobs queued behind it does not spin (WaitLong: the
// copy engines still have work, and its end is not needed the moment it
// comes); only the call's last job, whose end the engine waits for, is a
// short wait that may spin. At depth 1 no job has another behind it.
TEST_P(PublishDepthTest, OnlyTheLastJobInFlightOfACallSpinsTheOthersSleepAtOnce) {
  faults.ResetCalls();
  Result<PublishResult> r = PublishAll(0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->sealed, kKeys);
  const gpu::FaultInjectingPlatform::Calls c = faults.calls();
  if (GetParam() == 1) {
    EXPECT_EQ(c.long_waits, 0u);
    EXPECT_GE(c.waits, 2u * 10);  // two events (copies, CRCs) per job, 2 objects per job
  } else {
    EXPECT_EQ(c.waits, 2u);  // the last job's copies and CRCs
    EXPECT_GE(c.long_waits, 2u * 9);
  }
  RestoreExact(0, kKeys);
}

INSTANTIATE_TEST_SUITE_P(Depths, PublishDepthTest, ::testing::Values(1u, 2u, 4u));

}  // namespace
}  // namespace orbitkv
