// orbitkv-bench: OrbitKV's benchmark, in the style of db_bench. One named
// workload (--workload) runs on every route asked for (--routes), each from a
// clean start with the same pool and SSD capacities, seed and requests, next
// to ceilings measured in the same run (fio, memcpy; CUDA copies with the GPU
// tier). Every restored block is checked byte for byte unless --no-verify.
// Prints a live line on a terminal, then a summary table; --json and --png
// write the report for machines and people. Targets are reported, never
// asserted. Exit status: 0 ok, 1 a restored block had wrong bytes, 2 bad flags
// or a device this build cannot drive, 3 another failure, 130 interrupted.
#include <signal.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench/ceilings.h"
#include "bench/cuda_pages.h"
#include "bench/disk_probe.h"
#include "bench/figures.h"
#include "bench/model.h"
#include "bench/query_scale.h"
#include "bench/report.h"
#include "bench/route.h"
#include "bench/route_run.h"
#include "bench/scale.h"
#include "bench/workloads.h"
#include "codec/codec.h"
#include "orbitkv/device.h"
#include "orbitkv/logging.h"
#include "orbitkv/options.h"
#include "orbitkv/units.h"
#include "recovery/model_description.h"
#include "store/object_format.h"
#include "workload/format.h"
#include "workload/live_line.h"
#include "workload/machine.h"
#include "workload/process.h"

#ifndef ORBITKV_SOURCE_DIR
#define ORBITKV_SOURCE_DIR "."
#endif

namespace orbitkv::bench {
namespace {

constexpr int kExitMismatch = 1;
constexpr int kExitFlags = 2;
constexpr int kExitFailure = 3;
constexpr int kExitInterrupted = 130;

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted.store(true); }

struct Flags {
  std::string workload = "multi-round-qa";
  std::string model = "llama-3.1-8b";
  uint32_t block_tokens = 0;  // 0: the model's default
  std::string sweep_block_tokens = "16,32,64,128,256";
  std::string routes;  // empty: the workload's default
  std::string device = "host";
  std::string layout = "split";  // split | page-first
  WorkloadParams w;
  std::string working_set, pool_size, ssd_capacity;
  std::string dir;
  uint32_t ssd_shards = 4, ssd_queue_depth = 64, ssd_io_workers = 2;
  std::string ssd_read_staging = "auto";
  std::vector<std::string> manager_flags;
  std::string manager;
  double prefill_tokens_per_s = 10000;
  uint32_t latency_probes = 64;
  double ceiling_seconds = 2;
  std::string fio = "fio";
  std::string disk_ceiling = "auto";  // auto | fio | probe
  std::string fio_file_size;          // empty: the working set, within 1 GiB..8 GiB
  bool no_verify = false, no_progress = false, list_models = false, list_workloads = false;
  std::string storage_codec = "none";  // the Manager routes' namespace codec
  uint32_t inject_corruption = 0;      // tests only (hidden flag)
  std::string json, png;
  std::vector<std::string> argv;  // as given, for the report
  // --workload scale.
  uint32_t scale_chain_tokens = 131072;
  uint32_t scale_engines = 0;  // 0: --engines
  uint64_t scale_objects = 100000;
};

int FlagError(const std::string& msg) {
  std::fprintf(stderr, "orbitkv-bench: %s\n", msg.c_str());
  return kExitFlags;
}

// Under --storage-codec: the compression ratio on the KV the route moved
// (what the writeback encoded over the run, what the measured restores
// decoded), the KV delivered per second (effective, uncompressed) and the
// stored bytes per second it took (figures.h CodecFigures).
void PrintCodecLine(const CodecFigures& c, const Ceiling* ceil) {
  auto ratio = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.3f}x", *v) : std::string("n/a");
  };
  std::string fallbacks;
  for (const auto& [reason, n] : c.gpu_encode_fallbacks) {
    fallbacks +=
        fmt::format("{} {} {:.0f}", fallbacks.empty() ? "; GPU encode fell back:" : ",", reason, n);
  }
  const bool eff = c.effective_gbps > 0;
  std::printf(
      "  %-10s codec %s: ratio %s written (%s -> %s), %s read back; effective KV %s GB/s, "
      "stored bytes %s GB/s%s%s%s\n",
      "", c.codec.c_str(), ratio(c.ratio_written).c_str(),
      FormatByteSize(static_cast<uint64_t>(c.encode_raw_bytes)).c_str(),
      FormatByteSize(static_cast<uint64_t>(c.encode_frame_bytes)).c_str(),
      ratio(c.ratio_read).c_str(), eff ? fmt::format("{:.2f}", c.effective_gbps).c_str() : "n/a",
      eff ? fmt::format("{:.2f}", c.stored_gbps).c_str() : "n/a",
      ceil && ceil->ok && eff ? fmt::format(" ({:.0f}% of the ceiling, effective)",
                                            100 * c.effective_gbps * 1e9 / ceil->bytes_per_s)
                                    .c_str()
                              : "",
      c.dram_gpu_decodes + c.dram_cpu_decodes > 0
          ? fmt::format("; encoded DRAM blocks decoded on the GPU {:.0f}, CPU {:.0f}",
                        c.dram_gpu_decodes, c.dram_cpu_decodes)
                .c_str()
          : "",
      fallbacks.c_str());
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "orbitkv-bench: FAILED: %s\n", msg.c_str());
  return kExitFailure;
}

// --workload query-scale (query_scale.h): an in-process Manager; also the
// first part of --workload scale. Null on failure (printed).
std::optional<QueryScaleReport> QueryScale(const Flags& f, const std::string& dir,
                                           uint32_t tokens) {
  // The in-process Manager logs through this process: only what is wrong.
  InitLogging("warn").IgnoreError("orbitkv-bench: the in-process Manager logs at info");
  QueryScaleParams qp;
  qp.dir = dir;
  qp.block_tokens = tokens;
  qp.max_chain_tokens = f.scale_chain_tokens;
  qp.seed = f.w.seed;
  Result<QueryScaleReport> r = RunQueryScale(qp);
  if (!r.ok()) {
    Fail(r.status().ToString());
    return std::nullopt;
  }
  PrintQueryScale(stdout, *r);
  std::fflush(stdout);
  return std::move(r).value();
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) return Status::Internal("cannot write " + path);
  std::printf("  json         written to %s\n", path.c_str());
  return Status::OK();
}

int RunQueryScaleWorkload(const Flags& f, const std::string& dir, uint32_t tokens) {
  std::printf("orbitkv-bench: workload query-scale, chain up to %u tokens of %u-token blocks\n",
              f.scale_chain_tokens, tokens);
  std::optional<QueryScaleReport> q = QueryScale(f, dir, tokens);
  if (!q) return kExitFailure;
  if (f.json.empty()) return 0;
  nlohmann::json j = QueryScaleJson(*q);
  j["workload"] = "query-scale";
  j["flags"] = f.argv;
  if (Status st = WriteJson(f.json, j); !st.ok()) return Fail(st.ToString());
  return 0;
}

std::string ScaleDir(const Flags& f) {
  return (f.dir.empty() ? "/var/tmp/orbitkv-bench-" + std::to_string(::getuid()) : f.dir) +
         "/scale";
}

// --workload scale: its own driver (scale.h), one DRAM-only Manager, after query-scale.
int RunScaleWorkload(const Flags& f, const ModelPreset& model, uint32_t tokens) {
  ScaleParams sp;
  sp.dir = ScaleDir(f);
  if (Status st = demo::MakeDirs(sp.dir); !st.ok()) return Fail(st.ToString());
  sp.manager_binary = f.manager;
  sp.device = f.device;
  sp.page_first = f.layout == "page-first";
  sp.slot_bytes = model.SlotBytes(tokens);
  sp.block_tokens = tokens;
  sp.max_chain_tokens = f.scale_chain_tokens;
  sp.max_engines = f.scale_engines ? f.scale_engines : f.w.engines;
  sp.objects = f.scale_objects;
  sp.probes = std::max<uint32_t>(f.latency_probes, 16);
  sp.seconds_per_point = f.ceiling_seconds / 2;
  sp.verify = !f.no_verify;
  sp.seed = f.w.seed;
  sp.interrupted = &g_interrupted;
  std::printf(
      "orbitkv-bench: workload scale, model %s (%s per %u-token block), %s pages, chain up to %u "
      "tokens, 1..%u engines, %llu objects\n",
      model.name.c_str(), FormatByteSize(model.BlockBytes(tokens)).c_str(), tokens,
      f.device.c_str(), sp.max_chain_tokens, sp.max_engines,
      static_cast<unsigned long long>(sp.objects));
  std::fflush(stdout);
  std::optional<QueryScaleReport> q = QueryScale(f, sp.dir, tokens);
  if (!q) return kExitFailure;
  Result<ScaleReport> r = RunScale(sp);
  if (!r.ok()) {
    if (g_interrupted.load()) return kExitInterrupted;
    return Fail(r.status().ToString());
  }
  PrintScale(stdout, *r);
  if (!f.json.empty()) {
    nlohmann::json j = ScaleJson(*r);
    j["model"] = model.name;
    j["flags"] = f.argv;
    j["query_in_process"] = QueryScaleJson(*q);
    if (Status st = WriteJson(f.json, j); !st.ok()) return Fail(st.ToString());
  }
  return r->mismatched ? kExitMismatch : 0;
}

std::string FsType(const std::string& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53:
      return "ext2/3/4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    default:
      return fmt::format("f_type 0x{:x}", static_cast<unsigned long>(s.f_type));
  }
}

Result<std::vector<uint32_t>> ParseTokenList(const std::string& text) {
  std::vector<uint32_t> out;
  for (const std::string& item : demo::SplitList(text)) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(item.c_str(), &end, 10);
    if (*end != '\0' || v == 0 || v > 4096)
      return Status::InvalidArgument("--sweep-block-tokens: '" + item + "' is not 1..4096");
    out.push_back(static_cast<uint32_t>(v));
  }
  if (out.empty()) return Status::InvalidArgument("--sweep-block-tokens: empty");
  return out;
}

Result<uint64_t> SizeFlag(const std::string& flag, const std::string& text) {
  Result<uint64_t> v = ParseByteSize(text);
  if (!v.ok()) return Status::InvalidArgument(flag + ": " + std::string(v.status().message()));
  return v;
}

void PrintModels() {
  std::printf("%-20s %14s %14s %16s  %s\n", "model", "KV/token", "checkpoint", "block", "shape");
  for (const ModelPreset& m : ModelPresets()) {
    std::printf("%-20s %14s %14s %16s  %s\n", m.name.c_str(),
                FormatByteSize(m.KvBytesPerToken()).c_str(),
                m.CheckpointBytes() ? FormatByteSize(m.CheckpointBytes()).c_str() : "-",
                fmt::format("{} tok = {}", m.default_block_tokens,
                            FormatByteSize(m.BlockBytes(m.default_block_tokens)))
                    .c_str(),
                m.description.c_str());
  }
}

void PrintWorkloads() {
  for (const WorkloadInfo& w : Workloads()) {
    std::printf("%-24s %s (routes: %s)\n", std::string(w.name).c_str(),
                std::string(w.description).c_str(), std::string(w.default_routes).c_str());
  }
}

// Runs scripts/bench_plot.py on the JSON; returns what to say about the PNG.
std::string Plot(const std::string& json_path, const std::string& png) {
  const std::string python = "/usr/bin/python3";
  if (::access(python.c_str(), X_OK) != 0)
    return "skipped: no /usr/bin/python3 (scripts/setup.sh installs python3-matplotlib)";
  const char* env = std::getenv("ORBITKV_BENCH_PLOT");
  const std::string script =
      env && *env ? env : std::string(ORBITKV_SOURCE_DIR) + "/scripts/bench_plot.py";
  if (::access(script.c_str(), R_OK) != 0)
    return "skipped: no plot script at " + script + " (set ORBITKV_BENCH_PLOT)";
  auto run = [&](const std::vector<std::string>& argv) -> int {
    Result<demo::Child> c = demo::Child::Spawn(argv, {});
    if (!c.ok()) return -1;
    const int st = c->Wait(std::chrono::seconds(120));
    return demo::ExitedZero(st) ? 0 : (WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  };
  if (run({python, "-c", "import matplotlib"}) != 0)
    return "skipped: python3-matplotlib is not installed (scripts/setup.sh installs it)";
  const int rc = run({python, script, json_path, png});
  if (rc != 0) return fmt::format("FAILED: {} exited with status {}", script, rc);
  return "written to " + png;
}

// "attn: full attention, 6 MiB per block; gdn: recurrent, 37.7 MiB at every 256 tokens".
std::string RecoveryGroups(const ModelPreset& model, uint32_t tokens) {
  std::string out;
  for (const GroupDescription& g : model.Description(tokens).groups) {
    out +=
        fmt::format("{}{}: {}", out.empty() ? "" : "; ", g.name, recovery::GroupKindName(g.kind));
    if (g.kind == GroupKind::kRecurrent) {
      out += fmt::format(", {} per checkpoint, one every {} tokens", FormatByteSize(g.bytes),
                         g.checkpoint_interval_tokens);
    } else {
      out += fmt::format(", {} per {}-token block", FormatByteSize(g.bytes), g.block_tokens);
      if (g.kind == GroupKind::kSlidingWindow)
        out += fmt::format(", {}-token window", g.window_tokens);
    }
  }
  return out;
}

nlohmann::json DescriptionJson(const ModelDescription& d) {
  nlohmann::json groups = nlohmann::json::array();
  for (const GroupDescription& g : d.groups) {
    groups.push_back({{"name", g.name},
                      {"kind", recovery::GroupKindName(g.kind)},
                      {"storage_group", g.storage_group},
                      {"block_tokens", g.block_tokens},
                      {"bytes", g.bytes},
                      {"window_tokens", g.window_tokens},
                      {"checkpoint_interval_tokens", g.checkpoint_interval_tokens}});
  }
  return {{"key_block_tokens", d.key_block_tokens}, {"groups", groups}};
}

struct Sizes {
  uint64_t pool = 0, ssd = 0, working_set = 0;
  std::string pool_why, ssd_why;
};

int Run(const Flags& f, const std::vector<Route>& routes, const ModelPreset& model,
        const std::vector<uint32_t>& tokens_list) {
  const WorkloadInfo& info = *FindWorkload(f.workload);
  const std::string dir =
      f.dir.empty() ? "/var/tmp/orbitkv-bench-" + std::to_string(::getuid()) : f.dir;
  if (Status st = demo::MakeDirs(dir); !st.ok()) return Fail(st.ToString());
  Result<uint64_t> free_bytes = demo::FreeBytes(dir);
  if (!free_bytes.ok()) return Fail(free_bytes.status().ToString());
  const uint64_t ram = demo::TotalRamBytes();
  const uint32_t cpus = std::max(1u, std::thread::hardware_concurrency());

  // ---- capacities, matched over every route --------------------------------
  const bool sized_workload = f.workload == "publish-only" || f.workload == "restore-only" ||
                              f.workload == "block-size-sweep";
  Sizes sz;
  WorkloadParams w = f.w;
  w.seed = f.w.seed;
  uint64_t explicit_pool = 0, explicit_ssd = 0, explicit_ws = 0;
  if (!f.pool_size.empty()) {
    Result<uint64_t> v = SizeFlag("--pool-size", f.pool_size);
    if (!v.ok()) return FlagError(std::string(v.status().message()));
    explicit_pool = AlignUp(*v, kMiB);
  }
  if (!f.ssd_capacity.empty()) {
    Result<uint64_t> v = SizeFlag("--ssd-capacity", f.ssd_capacity);
    if (!v.ok()) return FlagError(std::string(v.status().message()));
    explicit_ssd = *v;
  }
  if (!f.working_set.empty()) {
    Result<uint64_t> v = SizeFlag("--working-set", f.working_set);
    if (!v.ok()) return FlagError(std::string(v.status().message()));
    explicit_ws = *v;
  }
  uint64_t fio_file = 0;
  if (!f.fio_file_size.empty()) {
    Result<uint64_t> v = SizeFlag("--fio-file-size", f.fio_file_size);
    if (!v.ok()) return FlagError(std::string(v.status().message()));
    fio_file = *v;
  }
  const uint64_t ram_cap = std::max<uint64_t>(ram / 4 / kMiB * kMiB, 64 * kMiB);
  ManagerOptions staging_of;  // the Manager's read staging, for sizes and ceilings
  staging_of.ssd_queue_depth = f.ssd_queue_depth;
  staging_of.ssd_io_workers = f.ssd_io_workers;
  if (f.ssd_read_staging != "auto") {
    Result<uint64_t> v = SizeFlag("--ssd-read-staging", f.ssd_read_staging);
    if (!v.ok()) return FlagError(std::string(v.status().message()));
    staging_of.ssd_read_staging = *v;
  }
  staging_of.pool_size = ram;  // an upper bound here; the pool's own below
  const uint64_t staging = staging_of.ReadStagingBytes();
  if (f.workload == "restore-only") {
    // The working set is twice the pool, so the SSD serves.
    sz.pool = explicit_pool ? explicit_pool
                            : std::clamp<uint64_t>(ram / 16 / kMiB * kMiB, 256 * kMiB, 2 * kGiB);
    sz.pool_why = explicit_pool ? "--pool-size" : "default: RAM/16 within 256 MiB..2 GiB";
    sz.working_set = explicit_ws ? explicit_ws : 2 * sz.pool;
  } else if (sized_workload) {
    sz.working_set = explicit_ws ? explicit_ws : std::min<uint64_t>(kGiB, ram / 16);
  }
  if (sized_workload) w.working_set_bytes = sz.working_set;

  std::vector<Point> points;
  std::vector<Plan> plans;
  for (uint32_t tokens : tokens_list) {
    Point p;
    p.block_tokens = tokens;
    const std::vector<uint64_t> slots = model.SlotBytes(tokens);
    p.block_bytes = model.BlockBytes(tokens);
    p.slots = static_cast<uint32_t>(slots.size());
    // A hybrid model's SSD I/O size: its first group's objects (attention blocks).
    p.extent_bytes =
        AlignUp(ObjectSize(model.hybrid() ? model.GroupSlotBytes(tokens).front() : slots), 4096);
    if (model.hybrid()) {
      if (Status st = recovery::ValidateModelDescription(model.Description(tokens)); !st.ok())
        return FlagError("--model " + model.name + " at " + std::to_string(tokens) +
                         "-token blocks: " + std::string(st.message()));
    }
    w.block_tokens = tokens;
    w.block_bytes = p.block_bytes;
    if (f.workload == "block-size-sweep") {
      // The same bytes per request at every block size: --blocks-per-request
      // counts blocks of the first size.
      w.blocks_per_request = static_cast<uint32_t>(
          std::max<uint64_t>(1, uint64_t{f.w.blocks_per_request} * tokens_list.front() / tokens));
    }
    Result<Plan> plan = MakePlan(f.workload, w);
    if (!plan.ok()) return FlagError(std::string(plan.status().message()));
    p.working_set_blocks = plan->working_set_blocks;
    p.measured_requests = plan->measured_requests;
    p.shape = plan->shape;
    points.push_back(std::move(p));
    plans.push_back(std::move(plan).value());
  }
  uint64_t ws_bytes = 0, request_bytes = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    ws_bytes = std::max(ws_bytes, points[i].working_set_blocks * points[i].block_bytes);
    request_bytes = std::max(request_bytes, plans[i].max_request_blocks * points[i].block_bytes);
  }
  if (f.workload != "restore-only") {
    // Room for the whole working set, so the dram route serves every hit.
    const uint64_t want =
        AlignUp(ws_bytes + ws_bytes / 8 + staging + uint64_t{w.engines} * request_bytes, kMiB);
    sz.pool = explicit_pool ? explicit_pool : std::min(want, ram_cap);
    sz.pool_why =
        explicit_pool ? "--pool-size"
        : sz.pool == want
            ? "default: working set + 1/8 + staging + a request per engine, so DRAM holds it"
            : "default: capped at RAM/4 (below the working set)";
  }
  const uint64_t shard_unit = uint64_t{f.ssd_shards} * kMiB;
  if (explicit_ssd) {
    sz.ssd = explicit_ssd;
    sz.ssd_why = "--ssd-capacity";
  } else {
    sz.ssd = std::max<uint64_t>(2 * ws_bytes, 256 * kMiB);
    sz.ssd = std::min<uint64_t>(sz.ssd, *free_bytes / 2);
    sz.ssd = sz.ssd / shard_unit * shard_unit;
    sz.ssd_why = "default: twice the working set, at most half the free space";
    if (sz.ssd < shard_unit)
      return Fail("only " + demo::Bytes(double(*free_bytes)) + " free under " + dir +
                  "; pass --ssd-dir on a file system with room");
  }
  if (sz.ssd < ws_bytes) {
    std::fprintf(stderr,
                 "orbitkv-bench: note: the SSD capacity %s is below the %s working set; blocks "
                 "will be overwritten or dropped and miss\n",
                 demo::Bytes(double(sz.ssd)).c_str(), demo::Bytes(double(ws_bytes)).c_str());
  }

  std::vector<SkippedRoute> skipped;
  std::vector<Route> runnable;
  for (Route r : routes) {
    Status st = RouteSupported(r, f.device);
    if (st.ok() && (r == Route::kDramEncoded || r == Route::kGpuEncoded) &&
        f.storage_codec == "none") {
      st = Status::Unavailable(
          "needs --storage-codec (without a codec DRAM holds raw copies: the dram route)");
    }
    if (st.ok() && Info(r).naive && model.hybrid()) {
      st = Status::Unavailable(
          "the naive baseline keeps dense chains (one object per block); a hybrid model's "
          "recovery plans run on the Manager routes");
    }
    if (st.ok()) {
      runnable.push_back(r);
    } else {
      skipped.push_back({r, std::string(st.message())});
    }
  }

  // ---- header ----------------------------------------------------------------
  std::printf("orbitkv-bench: workload %s (%s)\n", f.workload.c_str(),
              std::string(info.description).c_str());
  std::printf("  model      %s: %s\n", model.name.c_str(), model.description.c_str());
  for (const Point& p : points) {
    std::printf(
        "             %s KV/token%s; block %u tokens = %s (%s) in %u slots, SSD extent %s\n",
        FormatByteSize(model.KvBytesPerToken()).c_str(),
        model.CheckpointBytes()
            ? (" + " + FormatByteSize(model.CheckpointBytes()) + " checkpoint").c_str()
            : "",
        p.block_tokens, FormatByteSize(p.block_bytes).c_str(),
        demo::Bytes(double(p.block_bytes)).c_str(), p.slots,
        FormatByteSize(p.extent_bytes).c_str());
  }
  if (model.hybrid()) {
    std::printf("  recovery   registered with its model description: %s\n",
                RecoveryGroups(model, points.front().block_tokens).c_str());
  }
  std::printf("  requests   %s\n", points.front().shape.c_str());
  std::printf("  engines    %u engine thread(s), each its own Manager session and %s pages (%s)\n",
              w.engines, f.device.c_str(), f.layout.c_str());
  std::printf("  data       working set %s blocks = %s; %s measured requests per route\n",
              demo::Count(points.front().working_set_blocks).c_str(),
              demo::Bytes(double(ws_bytes)).c_str(),
              demo::Count(points.front().measured_requests).c_str());
  std::printf("  pool       %s (%s)\n", FormatByteSize(sz.pool).c_str(), sz.pool_why.c_str());
  std::printf("  SSD        %s in %s (%s; %s), %u shards, queue depth %u x %u io workers\n",
              FormatByteSize(sz.ssd).c_str(), dir.c_str(), FsType(dir).c_str(), sz.ssd_why.c_str(),
              f.ssd_shards, f.ssd_queue_depth, f.ssd_io_workers);
  std::string route_names;
  for (Route r : routes)
    route_names += (route_names.empty() ? "" : ", ") + std::string(Info(r).name);
  std::printf("  routes     %s; verification %s; seed %llu\n", route_names.c_str(),
              f.no_verify ? "OFF"
              : codec::CodecIsLossless(*codec::ParseCodecName(f.storage_codec))
                  ? "every restored byte"
                  : "OFF (lossy storage codec)",
              static_cast<unsigned long long>(f.w.seed));
  std::fflush(stdout);

  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  BenchReport report;
  report.workload = f.workload;
  report.model = model.name;
  report.model_description = model.description;
  report.device = f.device;
  report.dir = dir;
  report.fs_type = FsType(dir);
  report.seed = f.w.seed;
  report.engines = w.engines;
  report.cpus = cpus;
  report.kv_bytes_per_token = model.KvBytesPerToken();
  report.checkpoint_bytes = model.CheckpointBytes();
  report.hybrid = model.hybrid();
  if (model.hybrid()) {
    report.recovery_groups = RecoveryGroups(model, points.front().block_tokens);
    report.description = DescriptionJson(model.Description(points.front().block_tokens));
  }
  report.pool_bytes = sz.pool;
  report.ssd_bytes = sz.ssd;
  report.ssd_shards = f.ssd_shards;
  report.ssd_queue_depth = f.ssd_queue_depth;
  report.ssd_io_workers = f.ssd_io_workers;
  report.prefill_tokens_per_s = f.prefill_tokens_per_s;
  report.storage_codec = f.storage_codec;
  report.verify = !f.no_verify;
  report.flags = f.argv;

  demo::LiveLine live(!f.no_progress && ::isatty(STDOUT_FILENO),
                      std::chrono::milliseconds(::isatty(STDOUT_FILENO) ? 200 : 5000));
  const bool need_fio = std::any_of(runnable.begin(), runnable.end(),
                                    [](Route r) { return Info(r).tier == Tier::kSsd; });
  for (size_t i = 0; i < points.size(); ++i) {
    Point& p = points[i];
    const Plan& plan = plans[i];
    // ---- ceilings ----------------------------------------------------------
    std::printf("\n== block %u tokens: ceilings\n", p.block_tokens);
    std::fflush(stdout);
    PointCeilings& c = p.ceilings;
    c.memcpy_threads = w.engines;
    const std::vector<uint64_t> slots = model.SlotBytes(p.block_tokens);
    c.memcpy_multi = MeasureMemcpy(slots, w.engines, f.ceiling_seconds / 2);
    c.memcpy_single =
        w.engines == 1 ? c.memcpy_multi : MeasureMemcpy(slots, 1, f.ceiling_seconds / 2);
    if (need_fio || f.workload == "publish-only") {
      FioParams fp;
      fp.fio = f.fio;
      fp.dir = dir;
      fp.block_bytes = p.extent_bytes;
      fp.iodepth = f.ssd_queue_depth;
      fp.jobs = f.ssd_io_workers;
      fp.file_bytes =
          fio_file ? fio_file
                   : std::min(std::clamp<uint64_t>(ws_bytes, kGiB, 8 * kGiB), *free_bytes / 4);
      fp.seconds = f.ceiling_seconds;
      // The Manager's read staging (ManagerOptions::ReadStagingBytes).
      ManagerOptions mo = staging_of;
      mo.pool_size = sz.pool;
      const uint64_t read_staging = mo.ReadStagingBytes();
      // Without fio (the H200 host has none) the bench's own io_uring probe.
      const bool use_fio =
          f.disk_ceiling == "fio" || (f.disk_ceiling == "auto" && FioAvailable(f.fio));
      if (use_fio) {
        c.fio_read = MeasureFioRead(fp, read_staging);
        fp.mode = FioMode::kWrite;
        fp.huge_buffers = HugeBuffersFit(fp);
        c.fio_write = MeasureFio(fp);
      } else {
        c.fio_read = MeasureUringProbeRead(fp, read_staging);
        fp.mode = FioMode::kWrite;
        c.fio_write = MeasureUringProbe(fp);
      }
      c.disk_tool = use_fio ? "fio" : "probe";
    } else {
      c.fio_read.reason = c.fio_write.reason = "not needed: no SSD route in this run";
    }
    if (f.device == "host") {
      c.cuda_h2d.reason = c.cuda_d2h.reason = c.cuda_d2d.reason = "host pages (--device host)";
    } else {
      Result<CudaCopyCeilings> cc =
          MeasureCudaCopyCeilings(f.device, p.block_bytes, f.ceiling_seconds);
      if (cc.ok()) {
        c.cuda_h2d = {true, cc->h2d, "pinned cudaMemcpy H2D", ""};
        c.cuda_d2h = {true, cc->d2h, "pinned cudaMemcpy D2H", ""};
        c.cuda_d2d = {true, cc->d2d, "cudaMemcpy D2D", ""};
      } else {
        c.cuda_h2d.reason = c.cuda_d2h.reason = c.cuda_d2d.reason =
            std::string(cc.status().message());
      }
    }
    for (auto [name, ceil] :
         {std::pair{"memcpy x" + std::to_string(w.engines), &c.memcpy_multi},
          std::pair{std::string(w.engines == 1 ? "" : "memcpy x1"), &c.memcpy_single},
          std::pair{c.disk_tool + " read", &c.fio_read},
          std::pair{c.disk_tool + " write", &c.fio_write}}) {
      if (name.empty()) continue;
      std::printf("  %-12s %s\n", name.c_str(),
                  ceil->ok
                      ? fmt::format("{:.2f} GB/s  {}", ceil->bytes_per_s / 1e9, ceil->what).c_str()
                      : ("n/a: " + ceil->reason).c_str());
    }
    std::fflush(stdout);
    if (g_interrupted.load()) return kExitInterrupted;

    // ---- routes --------------------------------------------------------------
    for (Route r : runnable) {
      RouteRunConfig rc;
      rc.route = r;
      rc.plan = &plan;
      rc.label = f.workload + (points.size() > 1 ? fmt::format(" b{}", p.block_tokens) : "");
      rc.device = f.device;
      rc.slot_bytes = model.SlotBytes(p.block_tokens);
      rc.page_first = f.layout == "page-first";
      if (model.hybrid()) {
        rc.model = model.Description(p.block_tokens);
        rc.group_slot_bytes = model.GroupSlotBytes(p.block_tokens);
      }
      rc.block_tokens = p.block_tokens;
      rc.ns = fmt::format("orbitkv-bench/{}/b{}/seed{}", model.name, p.block_tokens, f.w.seed);
      rc.pool_bytes = sz.pool;
      rc.ssd_bytes = sz.ssd;
      rc.ssd_shards = f.ssd_shards;
      rc.ssd_queue_depth = f.ssd_queue_depth;
      rc.ssd_io_workers = f.ssd_io_workers;
      rc.ssd_read_staging = f.ssd_read_staging;
      rc.manager_flags = f.manager_flags;
      rc.dir = dir + "/" + std::string(Info(r).name);
      rc.manager_binary = f.manager;
      const codec::CodecId storage = *codec::ParseCodecName(f.storage_codec);
      rc.verify = !f.no_verify && codec::CodecIsLossless(storage);
      if (storage != codec::CodecId::kNone) {
        rc.storage = {f.storage_codec, model.dtype_bytes == 1 ? "fp8_e4m3fn" : "bf16",
                      model.head_dim};
      }
      rc.probes_per_engine = (f.latency_probes + w.engines - 1) / w.engines;
      rc.corrupt_every = f.inject_corruption;
      rc.seed = f.w.seed;
      rc.live = &live;
      rc.interrupted = &g_interrupted;
      Result<RouteRunResult> run = RunRoute(rc);
      live.Finish();
      std::error_code ec;
      if (run.ok() || !g_interrupted.load()) {
        for (const char* name : {"cache.bin", "cache.bin.1", "cache.bin.2", "cache.bin.3"})
          std::filesystem::remove(rc.dir + "/" + name, ec);
        for (const auto& e : std::filesystem::directory_iterator(rc.dir, ec))
          if (e.path().filename().string().rfind("cache.bin", 0) == 0)
            std::filesystem::remove(e.path(), ec);
      }
      if (!run.ok()) {
        if (g_interrupted.load()) return kExitInterrupted;
        return Fail(fmt::format("route {}: {}", Info(r).name, run.status().ToString()));
      }
      // Every block position holds one piece of each group (checkpoints at every block).
      const uint64_t object_bytes = p.block_bytes / (rc.model ? rc.model->groups.size() : 1);
      RouteFigures fig = ComputeFigures(*run, object_bytes, p.block_tokens, f.prefill_tokens_per_s);
      const Ceiling* ceil = RestoreCeilingOf(p, r, f.device);
      std::printf(
          "  %-10s restore %s GB/s (%s of %s), publish %s GB/s, hit %.1f%% (DRAM %.1f%%, "
          "SSD %.1f%%), %.1f s%s%s\n",
          std::string(Info(r).name).c_str(),
          fig.restore.bytes ? fmt::format("{:.2f}", fig.restore.bytes_per_s / 1e9).c_str() : "n/a",
          ceil && ceil->ok && fig.restore.bytes
              ? fmt::format("{:.0f}%", 100 * fig.restore.bytes_per_s / ceil->bytes_per_s).c_str()
              : "n/a",
          RestoreCeiling(r, f.device) == CeilingKind::kFioRead ? (c.disk_tool + " read").c_str()
          : f.device == "host" ? fmt::format("memcpy x{}", w.engines).c_str()
                               : "cuda H2D",
          fig.publish.bytes ? fmt::format("{:.2f}", fig.publish.bytes_per_s / 1e9).c_str() : "n/a",
          demo::Percent(fig.hit_dram + fig.hit_ssd, fig.queried),
          demo::Percent(fig.hit_dram, fig.queried), demo::Percent(fig.hit_ssd, fig.queried),
          fig.measured_wall_s,
          model.hybrid() ? fmt::format("; restored {} (checkpoints {}), not needed {}",
                                       demo::Bytes(double(fig.restored_bytes)),
                                       demo::Bytes(double(fig.checkpoint_bytes)),
                                       demo::Bytes(double(fig.not_needed_bytes)))
                               .c_str()
                         : "",
          fig.mismatched ? fmt::format(", {} MISMATCHED blocks", fig.mismatched).c_str() : "");
      if (!fig.codec.codec.empty()) PrintCodecLine(fig.codec, ceil);
      // ORBITKV_COST_OBSERVATIONS=1: where the Manager's calls went (children
      // overlap their parents: never add them up), then the probes' alone.
      auto cost_line = [](const std::map<std::string, RouteFigures::Cost>& cost) {
        std::string line;
        for (const auto& [path, c] : cost) {
          line += fmt::format("{}{} {:.3f} ms x{:.0f}", line.empty() ? "" : ", ", path,
                              c.mean_s * 1e3, c.count);
        }
        return line;
      };
      if (!fig.cost.empty()) {
        std::printf("  %-10s cost (mean per observation): %s\n", "", cost_line(fig.cost).c_str());
      }
      if (!fig.probe_cost.empty()) {
        std::printf("  %-10s one-block probes' cost: %s\n", "", cost_line(fig.probe_cost).c_str());
      }
      std::fflush(stdout);
      p.routes.push_back(std::move(fig));
    }
    p.skipped = skipped;
  }

  report.points = std::move(points);
  report.targets = EvaluateTargets(report);
  if (!f.png.empty()) {
    const std::string json_path = f.json.empty() ? dir + "/report-for-plot.json" : f.json;
    std::ofstream(json_path) << ToJson(report).dump(2) << "\n";
    report.png_note = Plot(json_path, f.png);
    if (f.json.empty()) std::filesystem::remove(json_path);
  }
  if (!f.json.empty()) {
    std::ofstream out(f.json);
    out << ToJson(report).dump(2) << "\n";
    if (!out) return Fail("cannot write " + f.json);
  }
  PrintSummary(stdout, report);
  if (!f.json.empty()) std::printf("  json               written to %s\n", f.json.c_str());
  std::fflush(stdout);
  return Mismatches(report) ? kExitMismatch : 0;
}

int Main(int argc, char** argv) {
  Flags f;
  f.argv.assign(argv, argv + argc);
  WorkloadParams& w = f.w;
  w.engines = 0;  // auto
  CLI::App app{
      "orbitkv-bench: runs a named workload on each route (DRAM, SSD io_uring, a naive "
      "pread+memcpy baseline; cuFile with the GPU tier) with matched capacities, next to fio "
      "and memcpy ceilings measured in the same run; checks every restored byte. Exit status: 0 "
      "ok, 1 wrong bytes restored, 2 bad flags or unsupported device, 3 another failure."};
  app.add_option("--workload", f.workload, "Workload (--list-workloads)")->capture_default_str();
  app.add_flag("--list-workloads", f.list_workloads, "Print the workloads and exit");
  app.add_option("--model", f.model, "Model preset (--list-models)")->capture_default_str();
  app.add_flag("--list-models", f.list_models, "Print the model presets with block bytes and exit");
  app.add_option("--block-tokens", f.block_tokens, "Tokens per block (default: the model's)");
  app.add_option("--sweep-block-tokens", f.sweep_block_tokens,
                 "block-size-sweep: block sizes in tokens")
      ->capture_default_str();
  app.add_option("--routes", f.routes,
                 "Comma-separated routes: dram, ssd-uring, ssd-auto (GPU tier), naive, "
                 "dram-engines, dram-kernel (CUDA pages), dram-encoded (--storage-codec's encoded "
                 "DRAM copies) (default: the workload's)");
  app.add_option("--device", f.device, "Engine pages: host or cuda:N")->capture_default_str();
  app.add_option("--layout", f.layout,
                 "Engine page layout: split (a region per slot) or page-first (a page holds all "
                 "its slots)")
      ->capture_default_str()
      ->check(CLI::IsMember({"split", "page-first"}));
  app.add_option("--engines", w.engines,
                 "Engine threads, one Manager session each (default: half the CPUs, 1..4: the "
                 "other half copies in the Manager)");
  app.add_option("--seed", w.seed, "Seed of tokens, keys, orders and bytes")->capture_default_str();
  auto* g = "multi-round-qa";
  app.add_option("--users", w.users, "Users in total")->capture_default_str()->group(g);
  app.add_option("--rounds", w.rounds, "Rounds per user")->capture_default_str()->group(g);
  app.add_option("--system-prompt-tokens", w.system_prompt_tokens, "Shared system prompt")
      ->capture_default_str()
      ->group(g);
  app.add_option("--history-tokens", w.history_tokens, "Each user's history before round 0")
      ->capture_default_str()
      ->group(g);
  app.add_option("--question-tokens", w.question_tokens, "Question tokens (also long-doc-qa)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--answer-tokens", w.answer_tokens, "Answer tokens (also long-doc-qa, mixed)")
      ->capture_default_str()
      ->group(g);
  g = "long-doc-qa";
  app.add_option("--documents", w.documents, "Documents")->capture_default_str()->group(g);
  app.add_option("--document-tokens", w.document_tokens, "Tokens per document")
      ->capture_default_str()
      ->group(g);
  app.add_option("--repeats", w.repeats, "Passes over the documents after the cold one")
      ->capture_default_str()
      ->group(g);
  g = "serial-prefix";
  app.add_option("--steps", w.steps, "Requests per engine")->capture_default_str()->group(g);
  app.add_option("--step-tokens", w.step_tokens, "Tokens each request adds")
      ->capture_default_str()
      ->group(g);
  g = "sustained-mixed-prefix";
  app.add_option("--requests", w.requests, "Requests in total")->capture_default_str()->group(g);
  app.add_option("--families", w.families, "Shared prefixes")->capture_default_str()->group(g);
  app.add_option("--prefix-tokens", w.prefix_tokens, "Tokens per shared prefix")
      ->capture_default_str()
      ->group(g);
  app.add_option("--tail-tokens", w.tail_tokens, "Fresh tokens per request: 0..this")
      ->capture_default_str()
      ->group(g);
  app.add_option("--zipf", w.zipf, "Zipf exponent of prefix popularity")
      ->capture_default_str()
      ->group(g);
  g = "publish-only, restore-only, block-size-sweep";
  app.add_option("--working-set", f.working_set,
                 "Bytes of distinct blocks (default: restore-only 2 x pool; others min(1gib, "
                 "RAM/16))")
      ->group(g);
  app.add_option("--blocks-per-request", w.blocks_per_request,
                 "Blocks per request (block-size-sweep: of the first size; the bytes per request "
                 "stay the same)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--passes", w.passes, "restore-only: passes over the working set")
      ->capture_default_str()
      ->group(g);
  g = "capacities (the same for every route)";
  app.add_option("--pool-size", f.pool_size,
                 "Manager DRAM pool (default: working set + 1/8 + staging + a request per engine, "
                 "at most RAM/4; "
                 "restore-only: RAM/16 within 256mib..2gib)")
      ->group(g);
  app.add_option("--ssd-capacity", f.ssd_capacity,
                 "SSD capacity of the Manager and of the naive store (default: twice the "
                 "working set, at most half the free space)")
      ->group(g);
  app.add_option("--ssd-dir", f.dir,
                 "Directory for SSD files, sockets and logs (default: /var/tmp/orbitkv-bench-UID; "
                 "use a disk-backed file system: O_DIRECT)")
      ->group(g);
  app.add_option("--ssd-shards", f.ssd_shards, "Manager SSD shards")
      ->capture_default_str()
      ->group(g);
  app.add_option("--ssd-queue-depth", f.ssd_queue_depth,
                 "Manager io_uring queue depth per worker (and fio's iodepth)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--ssd-io-workers", f.ssd_io_workers,
                 "Manager io_uring workers (and fio's numjobs)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--ssd-read-staging", f.ssd_read_staging,
                 "Manager --ssd-read-staging: a size or auto (ManagerOptions::ReadStagingBytes)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--manager-flag", f.manager_flags,
                 "One more orbitkv-cache-manager flag for every Manager route, after the route's "
                 "own (repeat it; e.g. --manager-flag=--publish-batch-bytes=4mib)")
      ->group(g);
  app.add_option("--manager", f.manager,
                 "orbitkv-cache-manager binary (default: $ORBITKV_MANAGER_BINARY or "
                 "../server/orbitkv-cache-manager next to this binary)")
      ->group(g);
  g = "measurement and output";
  app.add_option("--prefill-tokens-per-s", f.prefill_tokens_per_s, "Prefill rate of the TTFT model")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(g);
  app.add_option("--latency-probes", f.latency_probes,
                 "Single-block restores after the workload, for per-block latency")
      ->capture_default_str()
      ->group(g);
  app.add_option("--ceiling-seconds", f.ceiling_seconds, "Seconds per fio run (memcpy: half)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(g);
  app.add_option("--fio", f.fio, "fio binary")->capture_default_str()->group(g);
  app.add_option("--disk-ceiling", f.disk_ceiling,
                 "Disk ceiling: fio, probe (orbitkv-bench's own io_uring O_DIRECT probe at the "
                 "same I/O size, depth and threads) or auto (fio when found, else probe)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fio", "probe"}))
      ->group(g);
  app.add_option("--fio-file-size", f.fio_file_size,
                 "Size of fio's file (default: the working set, within 1gib..8gib)")
      ->group(g);
  app.add_flag("--no-verify", f.no_verify, "Do not check restored bytes")->group(g);
  app.add_option("--storage-codec", f.storage_codec,
                 "none|ans|fp8|turboquant-4|turboquant-3: the Manager routes' SSD storage codec "
                 "(asked for at register with the model's bf16 head_dim; lossy ones skip the "
                 "byte check)")
      ->capture_default_str()
      ->group(g);
  app.add_flag("--no-progress", f.no_progress, "No live line")->group(g);
  app.add_option("--json", f.json, "Write the report as JSON")->group(g);
  app.add_option("--png", f.png,
                 "Plot throughput against block size per route, with ceilings "
                 "(scripts/bench_plot.py, /usr/bin/python3 + python3-matplotlib)")
      ->group(g);
  g = "scale";
  app.add_option("--scale-chain-tokens", f.scale_chain_tokens,
                 "Longest chain queried (tokens; query latency at 1k, 2k, ... up to it)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24))
      ->group(g);
  app.add_option("--scale-engines", f.scale_engines,
                 "Engines up to which restore/publish GB/s is measured (default: --engines)")
      ->group(g);
  app.add_option("--scale-objects", f.scale_objects,
                 "Objects published for directory bytes per object and Manager RSS")
      ->capture_default_str()
      ->group(g);
  app.add_option("--inject-corruption", f.inject_corruption)->group("");  // tests: every Nth block
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitFlags;
  }
  if (f.list_models) {
    PrintModels();
    return 0;
  }
  if (f.list_workloads) {
    PrintWorkloads();
    return 0;
  }
  if (w.engines == 0)
    w.engines = std::clamp<uint32_t>(std::thread::hardware_concurrency() / 2, 1, 4);
  const WorkloadInfo* info = FindWorkload(f.workload);
  if (!info)
    return FlagError("--workload: unknown workload '" + f.workload + "' (--list-workloads)");
  const ModelPreset* model = FindModel(f.model);
  if (!model) return FlagError("--model: unknown model '" + f.model + "' (--list-models)");
  if (Result<codec::CodecId> c = codec::ParseCodecName(f.storage_codec); !c.ok()) {
    return FlagError("--storage-codec: " + std::string(c.status().message()));
  }
  if (Result<DeviceSpec> d = ParseDevice(f.device, "--device"); !d.ok()) {
    return FlagError(std::string(d.status().message()));
  }
  if (f.device != "host" && !CudaPagesBuilt()) {
    return FlagError("--device " + f.device +
                     ": this orbitkv-bench was built without CUDA pages (a build with the CUDA "
                     "toolkit has them); run with --device host");
  }
  if (f.device != "host") {
    if (Status st = CheckCudaPagesDevice(f.device); !st.ok()) {
      return FlagError(std::string(st.message()));
    }
  }
  if (f.ssd_shards == 0 || f.ssd_queue_depth == 0 || f.ssd_io_workers == 0)
    return FlagError("--ssd-shards, --ssd-queue-depth and --ssd-io-workers must be positive");
  Result<std::vector<Route>> routes =
      ParseRoutes(f.routes.empty() ? std::string(info->default_routes) : f.routes);
  if (!routes.ok()) return FlagError(std::string(routes.status().message()));
  std::vector<uint32_t> tokens = {f.block_tokens ? f.block_tokens : model->default_block_tokens};
  if ((f.workload == "scale" || f.workload == "query-scale") && model->hybrid()) {
    return FlagError("--workload " + f.workload + " measures dense chains; --model " + f.model +
                     " is a hybrid model (use a dense one, e.g. tiny)");
  }
  if (f.workload == "scale") {
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    return RunScaleWorkload(f, *model, tokens.front());
  }
  if (f.workload == "query-scale") {
    const std::string dir = ScaleDir(f);
    if (Status st = demo::MakeDirs(dir); !st.ok()) return Fail(st.ToString());
    return RunQueryScaleWorkload(f, dir, tokens.front());
  }
  if (f.workload == "block-size-sweep") {
    Result<std::vector<uint32_t>> list = ParseTokenList(f.sweep_block_tokens);
    if (!list.ok()) return FlagError(std::string(list.status().message()));
    tokens = *list;
  }
  return Run(f, *routes, *model, tokens);
}

}  // namespace
}  // namespace orbitkv::bench

int main(int argc, char** argv) { return orbitkv::bench::Main(argc, argv); }
