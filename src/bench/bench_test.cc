// Unit tests of orbitkv-bench's pure parts: presets (and the hybrid ones'
// descriptions), the engine side of hybrid descriptions (workload/hybrid.h),
// routes, plans, fio and /proc parsing, throughput aggregation, the naive store.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "bench/ceilings.h"
#include "bench/disk_probe.h"
#include "bench/figures.h"
#include "bench/model.h"
#include "bench/naive_store.h"
#include "bench/proc_stat.h"
#include "bench/report.h"
#include "bench/route.h"
#include "bench/workloads.h"
#include "common/thread_name.h"
#include "orbitkv/units.h"
#include "recovery/model_description.h"
#include "testing/temp_dir.h"
#include "workload/hybrid.h"

namespace orbitkv::bench {
namespace {

TEST(ModelTest, EightBModelsHaveTheirBytesPerToken) {
  const ModelPreset* llama = FindModel("llama-3.1-8b");
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->KvBytesPerToken(), 128 * kKiB);
  EXPECT_EQ(llama->BlockBytes(16), 2 * kMiB);
  EXPECT_EQ(llama->SlotBytes(16).size(), 64u);
  EXPECT_EQ(FindModel("qwen3-8b")->BlockBytes(16), 2 * kMiB + 256 * kKiB);
  EXPECT_EQ(FindModel("llama-3.1-70b-tp8")->KvBytesPerToken(), 40 * kKiB);
  const ModelPreset* hybrid = FindModel("qwen3-next-hybrid");
  ASSERT_NE(hybrid, nullptr);
  EXPECT_EQ(hybrid->CheckpointBytes(), 36 * (8192ull * 3 * 2 + 32ull * 128 * 128 * 2));
  uint64_t sum = 0;
  for (uint64_t b : hybrid->SlotBytes(256)) sum += b;
  EXPECT_EQ(sum, hybrid->BlockBytes(256));
  EXPECT_EQ(FindModel("nope"), nullptr);
}

// The hybrid presets register a real description: Qwen3-Next's full
// attention and Gated DeltaNet groups (no sliding window), each group's
// bytes those of its slots; the test preset has every kind.
TEST(ModelTest, HybridPresetsDescribeTheirGroups) {
  const ModelPreset* q = FindModel("qwen3-next-hybrid");
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->hybrid());
  const ModelDescription d = q->Description(256);
  ASSERT_TRUE(recovery::ValidateModelDescription(d).ok());
  EXPECT_EQ(d.key_block_tokens, 256u);
  ASSERT_EQ(d.groups.size(), 2u);
  EXPECT_EQ(d.groups[0].name, "attn");
  EXPECT_EQ(d.groups[0].kind, GroupKind::kFullAttention);
  EXPECT_EQ(d.groups[0].bytes, 6 * kMiB);  // 12 layers x K/V x 2 heads x 256 dim x 256 tokens
  EXPECT_EQ(d.groups[1].name, "gdn");
  EXPECT_EQ(d.groups[1].kind, GroupKind::kRecurrent);
  EXPECT_EQ(d.groups[1].bytes, q->CheckpointBytes());
  EXPECT_EQ(d.groups[1].checkpoint_interval_tokens, 256u);
  EXPECT_GT(q->CheckpointBytes(), 37 * kMiB);  // the issue's 37-74 MiB per checkpoint
  EXPECT_LT(q->CheckpointBytes(), 74 * kMiB);
  const std::vector<std::vector<uint64_t>> slots = q->GroupSlotBytes(256);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].size(), 24u);
  EXPECT_EQ(slots[1].size(), 72u);
  for (uint32_t g = 0; g < 2; ++g) {
    uint64_t sum = 0;
    for (uint64_t b : slots[g]) sum += b;
    EXPECT_EQ(sum, d.groups[g].bytes) << g;
  }
  // The layout agrees with the description, as the Manager checks at register.
  EXPECT_TRUE(recovery::CheckLayoutAgreement(d, demo::HybridLayout(d, slots, 4)).ok());
  EXPECT_TRUE(recovery::CheckLayoutAgreement(d, demo::HybridLayout(d, slots, 4, true)).ok());

  const ModelPreset* t = FindModel("tiny-hybrid");
  ASSERT_NE(t, nullptr);
  const ModelDescription td = t->Description(16);
  ASSERT_TRUE(recovery::ValidateModelDescription(td).ok());
  ASSERT_EQ(td.groups.size(), 3u);
  EXPECT_EQ(td.groups[1].kind, GroupKind::kSlidingWindow);
  EXPECT_EQ(td.groups[1].window_tokens, 64u);
  EXPECT_EQ(t->BlockBytes(16), td.groups[0].bytes + td.groups[1].bytes + td.groups[2].bytes);
  EXPECT_FALSE(FindModel("llama-3.1-8b")->hybrid());
  EXPECT_FALSE(FindModel("tiny")->hybrid());
}

// What an engine publishes and what a plan must list (workload/hybrid.h):
// 16-token keys, attn, a 48-token window, a checkpoint every 64 tokens.
TEST(HybridShapeTest, ChainPiecesAndRequiredPiecesFollowTheDescription) {
  ModelDescription d;
  d.key_block_tokens = 16;
  GroupDescription attn{"attn", GroupKind::kFullAttention, 0, 16, 100};
  GroupDescription swa{"swa", GroupKind::kSlidingWindow, 1, 16, 50, 48};
  GroupDescription gdn{"gdn", GroupKind::kRecurrent, 2, 16, 400};
  gdn.checkpoint_interval_tokens = 64;
  d.groups = {attn, swa, gdn};
  ASSERT_TRUE(recovery::ValidateModelDescription(d).ok());
  using P = demo::ChainPiece;
  // Tokens [64, 160): blocks 4..9 of both attention groups, checkpoints at 128 (key 7).
  std::vector<P> want;
  for (uint32_t g : {0u, 1u})
    for (uint64_t b = 4; b < 10; ++b) want.push_back({g, b, b});
  want.push_back({2, 128, 7});
  EXPECT_EQ(demo::ChainPieces(d, 64, 160), want);
  EXPECT_TRUE(demo::ChainPieces(d, 160, 160).empty());
  // P = 128: attn 0..7, swa 5..7 (covering [80, 128)), gdn at 128.
  want.clear();
  for (uint64_t b = 0; b < 8; ++b) want.push_back({0, b, b});
  for (uint64_t b = 5; b < 8; ++b) want.push_back({1, b, b});
  want.push_back({2, 128, 7});
  EXPECT_EQ(demo::RequiredPieces(d, 128), want);
  EXPECT_TRUE(demo::RequiredPieces(d, 0).empty());
  // Explicit positions instead of an interval; a 32-token attention block spans two keys.
  d.groups[2].checkpoint_interval_tokens = 0;
  d.groups[2].checkpoint_positions = {32, 96};
  d.groups[0].block_tokens = 32;
  ASSERT_TRUE(recovery::ValidateModelDescription(d).ok());
  std::vector<P> got = demo::ChainPieces(d, 0, 96);
  EXPECT_EQ(got.front(), (P{0, 0, 1}));
  EXPECT_EQ(got.back(), (P{2, 96, 5}));
  EXPECT_EQ(demo::PieceKeyIndex(d, 0, 2), 5u);
  // Content keys differ per group and keep group 0's chain key.
  BlockKey k{};
  k[3] = 7;
  EXPECT_EQ(demo::PieceContentKey(k, 0), k);
  EXPECT_NE(demo::PieceContentKey(k, 1), k);
  EXPECT_NE(demo::PieceContentKey(k, 1), demo::PieceContentKey(k, 2));
}

TEST(RouteTest, ParsesListsAndNamesUnknownRoutes) {
  Result<std::vector<Route>> r = ParseRoutes("naive,dram,naive");
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, ::testing::ElementsAre(Route::kNaive, Route::kDram));
  Result<std::vector<Route>> bad = ParseRoutes("dram,floppy");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("floppy"));
  EXPECT_FALSE(ParseRoutes(",").ok());
  EXPECT_FALSE(RouteSupported(Route::kSsdAuto, "host").ok());
  EXPECT_TRUE(RouteSupported(Route::kSsdUring, "host").ok());
  EXPECT_EQ(RestoreCeiling(Route::kDram, "host"), CeilingKind::kMemcpy);
  EXPECT_EQ(RestoreCeiling(Route::kDram, "cuda:0"), CeilingKind::kCudaH2D);
  EXPECT_EQ(RestoreCeiling(Route::kNaive, "host"), CeilingKind::kFioRead);
}

TEST(RouteTest, MoverRoutesNeedCudaPagesAndSetTheMover) {
  Result<std::vector<Route>> r = ParseRoutes("dram-engines,dram-kernel");
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, ::testing::ElementsAre(Route::kDramEngines, Route::kDramKernel));
  EXPECT_FALSE(RouteSupported(Route::kDramEngines, "host").ok());
  EXPECT_TRUE(RouteSupported(Route::kDramKernel, "cuda:0").ok());
  EXPECT_THAT(Info(Route::kDramEngines).manager_env,
              ::testing::ElementsAre("ORBITKV_GPU_COPY=engines"));
  EXPECT_THAT(Info(Route::kDramKernel).manager_env,
              ::testing::ElementsAre("ORBITKV_GPU_COPY=kernel"));
  EXPECT_TRUE(Info(Route::kDram).manager_env.empty());  // the default mover
  EXPECT_EQ(RestoreCeiling(Route::kDramEngines, "cuda:0"), CeilingKind::kCudaH2D);
}

TEST(RouteTest, DramEncodedKeepsEncodedDramCopiesOnAnyPages) {
  Result<std::vector<Route>> r = ParseRoutes("dram,dram-encoded");
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, ::testing::ElementsAre(Route::kDram, Route::kDramEncoded));
  EXPECT_TRUE(RouteSupported(Route::kDramEncoded, "host").ok());
  EXPECT_EQ(Info(Route::kDramEncoded).tier, Tier::kDram);
  EXPECT_THAT(Info(Route::kDramEncoded).manager_flags,
              ::testing::IsSupersetOf({"--codec-dram-copy", "encoded"}));
  EXPECT_EQ(RestoreCeiling(Route::kDramEncoded, "cuda:0"), CeilingKind::kCudaH2D);
}

// gpu-encoded is the only route whose publishes encode on the GPU: the GPU
// tier's cuFile backend with the encoded DRAM copy, CUDA pages only.
TEST(RouteTest, GpuEncodedPublishesThroughTheGpuTierOnCudaPagesOnly) {
  Result<std::vector<Route>> r = ParseRoutes("gpu-encoded");
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(*r, ::testing::ElementsAre(Route::kGpuEncoded));
  EXPECT_EQ(RouteSupported(Route::kGpuEncoded, "host").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(RouteSupported(Route::kGpuEncoded, "cuda:0").ok());
  EXPECT_THAT(Info(Route::kGpuEncoded).manager_flags,
              ::testing::ElementsAre("--admission", "all", "--ssd-backend", "auto",
                                     "--codec-dram-copy", "encoded"));
}

// The fp8 target compares dram-encoded's effective KV GB/s with dram's (the
// uncompressed route) of the same run, on CUDA pages only.
TEST(ReportTest, Fp8EncodedDramTargetComparesWithTheUncompressedRoute) {
  BenchReport r;
  r.model = "llama-3.1-8b";
  r.device = "cuda:0";
  r.storage_codec = "fp8";
  Point p;
  p.block_tokens = 16;
  auto route = [](Route which, double gbps) {
    RouteFigures f;
    f.route = which;
    f.restore.bytes = 1 << 30;
    f.restore.bytes_per_s = gbps * 1e9;
    return f;
  };
  p.routes = {route(Route::kDram, 25), route(Route::kDramEncoded, 50)};
  r.points = {p};
  auto target = [&] {
    for (const Target& t : EvaluateTargets(r)) {
      if (t.name.rfind("fp8 effective DRAM -> HBM", 0) == 0) return t;
    }
    ADD_FAILURE() << "no fp8 target";
    return Target{};
  };
  Target t = target();
  ASSERT_TRUE(t.met.has_value());
  EXPECT_TRUE(*t.met);
  EXPECT_DOUBLE_EQ(t.value, 2.0);
  r.points[0].routes[1].restore.bytes_per_s = 40e9;  // 1.6x
  t = target();
  ASSERT_TRUE(t.met.has_value());
  EXPECT_FALSE(*t.met);
  r.storage_codec = "ans";
  EXPECT_FALSE(target().met.has_value());
  EXPECT_THAT(target().note, ::testing::HasSubstr("--storage-codec ans"));
  r.storage_codec = "fp8";
  r.device = "host";
  EXPECT_THAT(target().note, ::testing::HasSubstr("host pages"));
  r.device = "cuda:0";
  r.points[0].routes.pop_back();
  EXPECT_THAT(target().note, ::testing::HasSubstr("dram-encoded"));
}

// Regression: without fio (the H200 host) the disk ceiling was n/a; the
// bench's own io_uring probe measures it instead.
TEST(DiskProbeTest, MeasuresReadsAndWritesWithoutFio) {
  testing::TempDir dir;
  FioParams p;
  p.dir = dir.path();
  p.block_bytes = 61000;  // rounded up to 4 KiB (60 KiB), like an object's extent
  p.iodepth = 4;
  p.jobs = 2;
  p.file_bytes = 8 * kMiB;
  p.seconds = 0.2;
  for (FioMode mode : {FioMode::kRandRead, FioMode::kRead, FioMode::kWrite}) {
    p.mode = mode;
    Ceiling c = MeasureUringProbe(p);
    if (!c.ok && c.reason.find("O_DIRECT") != std::string::npos) {
      GTEST_SKIP() << "no O_DIRECT here: " << c.reason;
    }
    ASSERT_TRUE(c.ok) << c.reason;
    EXPECT_GT(c.bytes_per_s, 0);
    EXPECT_THAT(c.what, ::testing::HasSubstr("io_uring probe"));
    EXPECT_THAT(c.what, ::testing::HasSubstr("bs=60 KiB iodepth=4 x 2 threads"));
  }
  Ceiling best = MeasureUringProbeRead(p, 128 * 1024);  // staging allows depth 1
  ASSERT_TRUE(best.ok) << best.reason;
  EXPECT_THAT(best.what, ::testing::HasSubstr("qd 1"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("uring-probe.bin")));
  p.dir = dir.path() + "/missing";
  Ceiling none = MeasureUringProbe(p);
  EXPECT_FALSE(none.ok);
  EXPECT_THAT(none.reason, ::testing::HasSubstr("cannot open"));
}

WorkloadParams Small() {
  WorkloadParams p;
  p.engines = 2;
  p.block_tokens = 16;
  p.block_bytes = 4096;
  p.users = 3;
  p.rounds = 2;
  p.system_prompt_tokens = 64;
  p.history_tokens = 64;
  p.question_tokens = 16;
  p.answer_tokens = 16;
  p.documents = 3;
  p.document_tokens = 256;
  p.repeats = 2;
  p.steps = 3;
  p.step_tokens = 32;
  p.requests = 10;
  p.families = 4;
  p.prefix_tokens = 64;
  p.tail_tokens = 40;
  p.working_set_bytes = 4096 * 20;
  p.blocks_per_request = 8;
  return p;
}

TEST(WorkloadsTest, EqualSeedsGiveEqualPlans) {
  for (const WorkloadInfo& w : Workloads()) {
    // Their own drivers (scale.h, query_scale.h), no plan.
    if (w.name == "scale" || w.name == "query-scale") continue;
    Result<Plan> a = MakePlan(w.name, Small());
    Result<Plan> b = MakePlan(w.name, Small());
    ASSERT_TRUE(a.ok()) << w.name << ": " << a.status().ToString();
    ASSERT_TRUE(b.ok());
    ASSERT_EQ(a->phases.size(), b->phases.size()) << w.name;
    for (size_t k = 0; k < a->phases.size(); ++k) {
      for (size_t e = 0; e < a->phases[k].engines.size(); ++e) {
        ASSERT_EQ(a->phases[k].engines[e].size(), b->phases[k].engines[e].size());
        for (size_t i = 0; i < a->phases[k].engines[e].size(); ++i)
          EXPECT_EQ(a->phases[k].engines[e][i].keys, b->phases[k].engines[e][i].keys) << w.name;
      }
    }
    EXPECT_GT(a->working_set_blocks, 0u) << w.name;
    EXPECT_GT(a->measured_requests, 0u) << w.name;
  }
  WorkloadParams other = Small();
  other.seed = 2;
  EXPECT_NE(MakePlan("sustained-mixed-prefix", Small())->phases[0].engines[0][0].keys,
            MakePlan("sustained-mixed-prefix", other)->phases[0].engines[0][0].keys);
}

TEST(WorkloadsTest, MultiRoundQaSharesTheSystemPromptAndGrowsHistory) {
  Result<Plan> plan = MakePlan("multi-round-qa", Small());
  ASSERT_TRUE(plan.ok());
  const auto& e0 = plan->phases[0].engines[0];
  const auto& e1 = plan->phases[0].engines[1];
  // 64 system tokens = 4 blocks shared by every user.
  for (int b = 0; b < 4; ++b) EXPECT_EQ(e0[0].keys[b], e1[0].keys[b]);
  EXPECT_NE(e0[0].keys[4], e1[0].keys[4]);
  // Users 0 and 2 on engine 0, round-major: user 0 round 1 extends round 0.
  const BenchRequest& r0 = e0[0];
  const BenchRequest& r1 = e0[2];
  EXPECT_GT(r1.prompt_blocks, r0.prompt_blocks);
  for (size_t b = 0; b < r0.keys.size(); ++b) EXPECT_EQ(r0.keys[b], r1.keys[b]);
}

TEST(WorkloadsTest, RestoreOnlyPublishesThenRestoresAfterWriteback) {
  Result<Plan> plan = MakePlan("restore-only", Small());
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->phases.size(), 2u);
  EXPECT_FALSE(plan->phases[0].measured);
  EXPECT_TRUE(plan->phases[1].drain_before);
  EXPECT_EQ(plan->working_set_blocks, 20u);
  EXPECT_FALSE(plan->phases[0].engines[0][0].query);
  EXPECT_TRUE(plan->phases[1].engines[0][0].query);
}

TEST(CeilingsTest, ReadsFioJson) {
  const std::string out =
      "note: both iodepth >= 1 and synchronous I/O engine are selected\n"
      R"({"jobs":[{"jobname":"x","error":0,"read":{"bw_bytes":2500000000,"iops":1200},)"
      R"("write":{"bw_bytes":0}}]})";
  Ceiling c = ParseFioJson(out, /*write=*/false);
  EXPECT_TRUE(c.ok);
  EXPECT_DOUBLE_EQ(c.bytes_per_s, 2.5e9);
  EXPECT_FALSE(ParseFioJson(out, /*write=*/true).ok);
  EXPECT_FALSE(ParseFioJson("garbage", false).ok);
  EXPECT_FALSE(ParseFioJson(R"({"jobs":[]})", false).ok);
}

TEST(CeilingsTest, MissingFioIsNotApplicable) {
  FioParams p;
  p.fio = "/nonexistent/fio";
  p.dir = "/tmp";
  p.block_bytes = 4096;
  Ceiling c = MeasureFio(p);
  EXPECT_FALSE(c.ok);
  EXPECT_THAT(c.reason, ::testing::HasSubstr("fio not found"));
}

TEST(CeilingsTest, MemcpyMeasuresSomething) {
  Ceiling c = MeasureMemcpy({16 * kKiB, 16 * kKiB, 32 * kKiB}, 2, 0.05);
  EXPECT_TRUE(c.ok);
  EXPECT_GT(c.bytes_per_s, 1e8);
}

TEST(ProcStatTest, ParsesUtimeAndStime) {
  // comm with spaces and a ')' inside.
  const std::string stat = "123 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100";
  Result<double> s = ParseProcStatCpuSeconds(stat, 100);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(*s, 3.0);
  EXPECT_FALSE(ParseProcStatCpuSeconds("garbage", 100).ok());
  EXPECT_TRUE(ProcessCpuSeconds(::getpid()).ok());
}

TEST(ProcStatTest, ThreadCpuIsSummedByRoleBetweenSnapshots) {
  EXPECT_EQ(ParseProcStatComm("123 (a b) c) S 1 2"), "a b) c");
  EXPECT_EQ(ParseProcStatComm("garbage"), "");
  ASSERT_TRUE(ParseSchedstatRunNs("62656211 90444 98\n").ok());
  EXPECT_EQ(*ParseSchedstatRunNs("62656211 90444 98\n"), 62656211u);
  EXPECT_FALSE(ParseSchedstatRunNs("").ok());
  EXPECT_FALSE(ParseSchedstatRunNs("x1 2 3").ok());
  EXPECT_EQ(ThreadRole("okv-ssd-read12"), "okv-ssd-read");
  EXPECT_EQ(ThreadRole("okv-req"), "okv-req");
  EXPECT_EQ(ThreadRole("123"), "123");  // all digits: kept whole
  std::map<pid_t, ThreadCpu> before{{1, {"okv-ssd-read0", 1.0}},
                                    {2, {"okv-ssd-read1", 2.0}},
                                    {3, {"okv-req", 5.0}},
                                    {4, {"okv-gone", 9.0}},
                                    {6, {"okv-old", 3.0}}};
  std::map<pid_t, ThreadCpu> after{{1, {"okv-ssd-read0", 1.5}},
                                   {2, {"okv-ssd-read1", 2.25}},
                                   {3, {"okv-req", 5.0}},       // idle: not counted
                                   {5, {"okv-new", 0.5}},       // started in between
                                   {6, {"okv-reused", 0.25}}};  // tid reused by another thread
  after[2].ticks = true;  // one thread counted in clock ticks only
  std::map<std::string, RoleCpu> roles = CpuByRole(before, after);
  EXPECT_TRUE(roles["okv-ssd-read"].ticks);
  EXPECT_FALSE(roles["okv-new"].ticks);
  ASSERT_EQ(roles.size(), 3u);
  EXPECT_DOUBLE_EQ(roles["okv-ssd-read"].seconds, 0.75);
  EXPECT_EQ(roles["okv-ssd-read"].threads, 2);
  EXPECT_DOUBLE_EQ(roles["okv-new"].seconds, 0.5);
  EXPECT_DOUBLE_EQ(roles["okv-reused"].seconds, 0.25);
}

TEST(ProcStatTest, ThreadCpuSecondsSeesANamedThreadOfThisProcess) {
  std::atomic<bool> named{false}, stop{false};
  std::thread t([&] {
    SetThreadName("okv-bench-probe");
    named = true;
    while (!stop) std::this_thread::yield();
  });
  while (!named) std::this_thread::yield();
  Result<std::map<pid_t, ThreadCpu>> threads = ThreadCpuSeconds(::getpid());
  stop = true;
  t.join();
  ASSERT_TRUE(threads.ok()) << threads.status().ToString();
  bool found = false;
  double total = 0;
  for (const auto& [tid, c] : *threads) {
    found |= c.name == "okv-bench-probe";
    total += c.seconds;
  }
  EXPECT_TRUE(found);
  // The live threads' CPU is part of this process's (which also holds the
  // threads of earlier tests that ended), to a clock tick per thread.
  Result<double> process = ProcessCpuSeconds(::getpid());
  ASSERT_TRUE(process.ok());
  EXPECT_GT(total, 0);
  EXPECT_LE(total, *process + 0.01 * double(threads->size() + 1));
  EXPECT_FALSE(ThreadCpuSeconds(-1).ok());
}

TEST(FiguresTest, ThroughputCountsOverlappingCallsOnce) {
  RouteRunResult run;
  run.route = Route::kDram;
  run.engines.resize(2);
  // Two engines restore 1 GB each over [0, 1] and [0.5, 1.5]: 2 GB in 1.5 s busy.
  run.engines[0].restores.push_back({Tier::kDram, 1, 1'000'000'000, 0.0, 1.0, 0.1});
  run.engines[1].restores.push_back({Tier::kDram, 1, 1'000'000'000, 0.5, 1.5, 0.1});
  // A call from the other tier is kept apart.
  run.engines[1].restores.push_back({Tier::kSsd, 1, 500, 2.0, 3.0, 0.1});
  RequestSample r;
  r.queried_cache = true;
  r.queried = 10;
  r.hit_dram = 4;
  r.restored_blocks = 4;
  r.prompt_tokens = 160;
  r.restore_s = 0.001;
  run.engines[0].requests.push_back(r);
  RouteFigures f = ComputeFigures(run, 1'000'000'000, 16, 1000);
  EXPECT_EQ(f.restore.bytes, 2'000'000'000u);
  EXPECT_DOUBLE_EQ(f.restore.busy_s, 1.5);
  EXPECT_NEAR(f.restore.bytes_per_s, 2e9 / 1.5, 1);
  EXPECT_NEAR(f.restore.overlap, 2.0 / 1.5, 1e-9);
  EXPECT_EQ(f.restore_other.bytes, 500u);
  EXPECT_EQ(f.request_ms.n, 2u);
  // TTFT: 1 ms restore + (160 - 64 tokens) / 1000 tokens/s.
  EXPECT_NEAR(f.ttft_ms.p50, 1 + 96, 1e-6);
  EXPECT_NEAR(f.recompute_ms.p50, 160, 1e-6);
  EXPECT_NEAR(f.restore_vs_prefill, 0.064 / 0.001, 1e-6);
}

TEST(NaiveStoreTest, RoundTripsAndDropsWhenFull) {
  orbitkv::testing::TempDir dir;
  const uint64_t block = 5000;  // rounds up to 8 KiB slots
  Result<std::unique_ptr<NaiveStore>> s =
      NaiveStore::Create(dir.path() + "/n.bin", 16 * kKiB, block);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  NaiveStore& store = **s;
  EXPECT_EQ(store.slot_bytes(), 8 * kKiB);
  void* mem = nullptr;
  ASSERT_EQ(::posix_memalign(&mem, 4096, store.slot_bytes()), 0);
  uint8_t* buf = static_cast<uint8_t*>(mem);
  BlockKey a{}, b{}, c{};
  a[0] = 1, b[0] = 2, c[0] = 3;
  std::memset(buf, 0x11, store.slot_bytes());
  ASSERT_TRUE(store.Write(a, buf).ok());
  std::memset(buf, 0x22, store.slot_bytes());
  ASSERT_TRUE(store.Write(b, buf).ok());
  EXPECT_EQ(store.Write(c, buf).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store.dropped(), 1u);
  EXPECT_EQ(store.Write(a, buf).code(), StatusCode::kAlreadyExists);
  std::vector<BlockKey> chain = {a, b, c};
  EXPECT_EQ(store.Prefix(chain), 2u);
  ASSERT_TRUE(store.Read(a, buf).ok());
  EXPECT_EQ(buf[0], 0x11);
  EXPECT_EQ(buf[block - 1], 0x11);
  EXPECT_TRUE(store.Read(c, buf).IsNotFound());
  std::free(mem);
}

}  // namespace
}  // namespace orbitkv::bench
