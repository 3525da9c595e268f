// The randomised multi-process torture test (issue 10): a real
// orbitkv-cache-manager process with a small pool (objects move to SSD and
// back) and several orbitkv-torture-engine processes (torture_engine.cc) doing
// random publish / fragment publish / query / restore / cancel / prepare /
// release over the C++ client, while this test kills engines with SIGKILL at
// random times and starts new ones. Every restored byte is checked by the
// engine that restored it (page content derives from the key). At the end
// every engine still alive must exit 0, no engine may have seen a wrong byte,
// and /metrics must drain to zero: queries, restores, budget, pins, leases,
// assemblies, read staging, reservations, instances and sessions.
//
// Seeded: the same seed gives the same kill schedule and engine seeds (the
// interleaving still varies). Short by default (ctest, label integration);
// for a long run (one line):
//   ORBITKV_TORTURE_SECONDS=600 ORBITKV_TORTURE_SEED=7 ORBITKV_TORTURE_ENGINES=6
//   build/tests/torture_test
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <random>

#include <gtest/gtest.h>

#include "process_harness.h"
#include "testing/temp_dir.h"

namespace orbitkv::integration {
namespace {

uint64_t EnvU64(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : def;
}

struct EngineSlot {
  std::unique_ptr<Proc> proc;
  uint64_t seed = 0;
  int generation = 0;
};

TEST(Torture, KilledAndRestartedEnginesNeverSeeAWrongByteAndEverythingDrains) {
  const std::string manager_bin = BinaryFromEnv("ORBITKV_MANAGER_BINARY");
  const std::string engine_bin = BinaryFromEnv("ORBITKV_TORTURE_ENGINE_BINARY");
  ASSERT_FALSE(manager_bin.empty()) << "set ORBITKV_MANAGER_BINARY (ctest does)";
  ASSERT_FALSE(engine_bin.empty()) << "set ORBITKV_TORTURE_ENGINE_BINARY (ctest does)";
  const uint64_t seconds = EnvU64("ORBITKV_TORTURE_SECONDS", 15);
  const uint64_t seed = EnvU64("ORBITKV_TORTURE_SEED", 1);
  const uint64_t engines = std::max<uint64_t>(2, EnvU64("ORBITKV_TORTURE_ENGINES", 3));
  std::printf("torture: seed=%llu seconds=%llu engines=%llu\n", (unsigned long long)seed,
              (unsigned long long)seconds, (unsigned long long)engines);

  testing::TempDir dir;
  ManagerProc mgr(manager_bin, dir.File("mgr.sock"), dir.File("cache.bin"),
                  {.pool = "6mib", .ssd_capacity = "24mib", .shards = 2, .io_workers = 2});
  ASSERT_TRUE(mgr.ok()) << mgr.error();

  std::mt19937_64 rng(seed);
  const auto start = Clock::now();
  const auto end = start + std::chrono::seconds(seconds);
  auto left = [&] { return std::chrono::duration<double>(end - Clock::now()).count(); };
  std::vector<EngineSlot> slots(engines);
  std::vector<std::string> outputs;  // of finished and killed engines
  auto spawn = [&](EngineSlot& s, size_t index) {
    s.seed = rng();
    ++s.generation;
    s.proc = std::make_unique<Proc>(
        "torture engine " + std::to_string(index),
        std::vector<std::string>{engine_bin, "--socket", mgr.socket(), "--seed",
                                 std::to_string(s.seed), "--seconds", std::to_string(left()),
                                 "--id", std::to_string(index * 100 + s.generation)});
    ASSERT_TRUE(s.proc->started()) << s.proc->error();
  };
  for (size_t i = 0; i < slots.size(); ++i) ASSERT_NO_FATAL_FAILURE(spawn(slots[i], i));

  // Kill an engine now and then and start another in its place.
  int killed = 0;
  while (left() > 2.0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 1200));
    if (left() <= 2.0) break;
    const size_t victim = rng() % slots.size();
    EngineSlot& s = slots[victim];
    if (!s.proc->Running()) {
      ADD_FAILURE() << "engine " << victim << " (seed " << s.seed << ") ended early ("
                    << DescribeStatus(s.proc->WaitExit(0ms)) << "): " << s.proc->Tail();
      return;
    }
    s.proc->Signal(SIGKILL);
    s.proc->WaitExit(10s);
    s.proc->WaitEof(5s);
    outputs.push_back(s.proc->Output());
    ++killed;
    ASSERT_NO_FATAL_FAILURE(spawn(s, victim));
  }
  EXPECT_GT(killed, 0);

  // The survivors finish their run and report.
  uint64_t restored = 0, ops = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    Proc& p = *slots[i].proc;
    std::optional<int> st = p.WaitExit(std::chrono::seconds(seconds + 60));
    p.WaitEof(5s);
    const std::string out = p.Output();
    outputs.push_back(out);
    EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
        << "engine " << i << " (seed " << slots[i].seed << "): " << DescribeStatus(st) << "\n"
        << p.Tail();
    if (Field(out, "torture", "restored") > 0) restored += Field(out, "torture", "restored");
    if (Field(out, "torture", "ops") > 0) ops += Field(out, "torture", "ops");
  }
  for (const std::string& out : outputs) {
    EXPECT_EQ(out.find("@ wrong"), std::string::npos) << out;
  }
  EXPECT_GT(restored, 0u) << "no engine restored anything: the test checked nothing";

  std::vector<std::string> drained = kReleaseGauges;
  for (const char* g : {"orbitkv_pool_assembling_objects", "orbitkv_ssd_read_staging_used_bytes",
                        "orbitkv_ssd_reservations_inflight"}) {
    drained.push_back(g);
  }
  EXPECT_TRUE(mgr.GaugesReachZero(drained, 20s)) << mgr.proc().Tail(2000);
  std::string err;
  std::optional<Metrics> m = mgr.Scrape(&err);
  ASSERT_TRUE(m) << err;
  std::printf(
      "torture: %d engines killed, %llu ops and %llu restored blocks checked in the survivors' "
      "last runs; restore blocks ok=%.0f error=%.0f; bytes restored dram=%.0f ssd=%.0f; "
      "assemblies aborted=%.0f; budget cuts=%.0f\n",
      killed, (unsigned long long)ops, (unsigned long long)restored,
      m->Get("orbitkv_restore_blocks_total{outcome=\"ok\"}").value_or(-1),
      m->Get("orbitkv_restore_blocks_total{outcome=\"error\"}").value_or(-1),
      m->Get("orbitkv_bytes_total{route=\"restore_dram\"}").value_or(-1),
      m->Get("orbitkv_bytes_total{route=\"restore_ssd_uring\"}").value_or(-1),
      m->Get("orbitkv_assemblies_aborted_total").value_or(-1),
      m->Get("orbitkv_query_budget_cuts_total").value_or(-1));
  // Every engine left unsealed fragments behind: unregistering or being
  // killed aborted them (the assembling gauge above is back at zero).
  EXPECT_GT(m->Get("orbitkv_assemblies_aborted_total").value_or(0), 0);
  EXPECT_TRUE(mgr.Stop());
}

}  // namespace
}  // namespace orbitkv::integration
