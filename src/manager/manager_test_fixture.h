// ManagerTest: the fixture of the Manager library tests (manager_test.cc,
// manager_ssd_test.cc): a Manager over a temporary SSD cache with scripted
// io_uring faults, host page instances and helpers for each operation.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "manager/manager.h"
#include "store/object_format.h"
#include "store/shard_file.h"
#include "testing/host_pages.h"
#include "testing/temp_dir.h"

namespace orbitkv {

using testing::HostPages;
using testing::PageFirstLayout;
using testing::SplitLayout;

inline BlockKey K(uint64_t v) {
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
  // For tests that drive time: declared before mgr, so it outlives the
  // Manager's reaper thread, which reads it until the Manager is gone.
  ManualClock manual_clock;
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
    // The longest lease the Manager allows: under a sanitizer on a loaded
    // 2-core machine one restore has taken over 30 s (the default), and a
    // second query of the same test expired before its restore.
    q.ttl_ms = 60000;
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

  // Queries key `key` (expecting it on tier `from`) and restores it into
  // `page`: the page must then hold the bytes of seed `key`.
  void ExpectRestores(HostPages& pages, InstanceId inst, uint64_t key, uint64_t page, Tier from) {
    pages.Fill(0, page, 77);
    QueryResult q = Query(inst, {key});
    ASSERT_EQ(q.prefix, 1u);
    EXPECT_EQ(q.sources[0], from);
    RestoreResult r = Restore(inst, q.query, {0}, {page});
    ASSERT_EQ(r.blocks.size(), 1u);
    EXPECT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
    EXPECT_TRUE(pages.Holds(0, page, key));
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
    EXPECT_EQ(g.ssd_restore_reads, 0u);  // else the writeback would yield for nothing
  }
};

}  // namespace orbitkv
