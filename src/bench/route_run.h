// RouteRun: runs one plan on one route from a clean start and collects what
// was measured: a fresh Manager (its flags from the route registry, the run's
// pool and SSD capacities) or a fresh NaiveStore in the same directory, one
// engine thread per engine, the phases in step, /metrics scraped for peaks and
// counter deltas over the measured phases, the Manager's CPU time from /proc,
// the lease and writeback drain times after the last phase, then the latency
// probes, and a clean SIGTERM shutdown. Draws the live line while it runs.
// Call from the main thread; it owns the threads and the child it starts.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/proc_stat.h"
#include "bench/route.h"
#include "bench/samples.h"
#include "bench/workloads.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"
#include "workload/live_line.h"

namespace orbitkv::bench {

struct RouteRunConfig {
  Route route = Route::kDram;
  const Plan* plan = nullptr;
  std::string label;  // for the live line, e.g. "multi-round-qa"
  std::string device = "host";
  std::vector<uint64_t> slot_bytes;
  bool page_first = false;  // --layout page-first
  // A hybrid model: its description (registered by every engine) and each
  // group's slots. Manager routes only.
  std::optional<ModelDescription> model;
  std::vector<std::vector<uint64_t>> group_slot_bytes;
  uint32_t block_tokens = 16;
  std::string ns;  // Manager namespace of the blocks
  // The namespace's storage codec (--storage-codec); its counters are kept
  // in ManagerView::delta and ::end as codec_{encode,decode}_{in,out}.
  StorageCodecRequest storage;
  uint64_t pool_bytes = 0;
  uint64_t ssd_bytes = 0;
  uint32_t ssd_shards = 4;
  uint32_t ssd_queue_depth = 64;
  uint32_t ssd_io_workers = 2;
  std::string ssd_read_staging = "auto";  // --ssd-read-staging
  std::vector<std::string>
      manager_flags;           // --manager-flag: appended to every Manager route's flags
  std::string dir;             // this route's files: SSD shards or the naive file, socket, log
  std::string manager_binary;  // Manager routes
  bool verify = true;
  uint32_t probes_per_engine = 0;
  uint32_t corrupt_every = 0;  // tests: see EngineOptions
  uint64_t seed = 1;
  demo::LiveLine* live = nullptr;
  const std::atomic<bool>* interrupted = nullptr;
};

// The Manager's opt-in cost observations (ORBITKV_COST_OBSERVATIONS=1 in the
// bench's environment, which its Managers inherit): orbitkv_cost_seconds by
// path. ManagerView::delta holds "cost_<path>_sum" and "cost_<path>_count"
// over the measured phases.
inline constexpr const char* kCostPaths[] = {
    "dram_restore_plan",  "h2d_copy_enqueue",    "h2d_copy_wait",      "d2h_copy_enqueue",
    "d2h_copy_wait",      "gpu_decode_enqueue",  "gpu_decode_wait",    "ssd_uring_restore",
    "ssd_cufile_restore", "publish_assemble",    "publish_seal",       "h2d_copy_call",
    "d2h_copy_call",      "d2h_crc_launch",      "publish_call",       "ssd_uring_verify",
    "ssd_uring_promote",  "ssd_uring_gpu_check", "publish_pool_begin",
};

// Gauges' peaks and counters' deltas from the Manager's /metrics.
struct ManagerView {
  double cpu_seconds = 0;                      // during measured phases
  std::map<std::string, RoleCpu> cpu_by_role;  // the same, by thread role (proc_stat.h)
  std::map<std::string, double> delta;         // counters: sum over measured phases
  std::map<std::string, double> peak;          // gauges: maximum seen during the run
  std::map<std::string, double> end;           // counters and gauges after the last phase
  // The cost observations ("cost_<path>_sum"/"_count") of the one-block
  // latency probes alone (they run after the phases, on an idle Manager).
  std::map<std::string, double> probe_cost;
  std::string log_path;
  std::string exit;  // how it stopped
};

struct RouteRunResult {
  Route route = Route::kDram;
  std::string storage_codec;  // RouteRunConfig::storage.codec (empty: none)
  std::vector<EngineSamples> engines;
  double measured_wall_s = 0;
  bool manager = false;
  ManagerView view;
  double lease_drain_s = -1;      // last phase done -> no lease, query or restore held
  double writeback_drain_s = -1;  // last phase done -> no object waiting for SSD writeback
  uint64_t naive_dropped = 0;
};

// Failures (the Manager did not start or died, an engine failed) are errors;
// wrong bytes are not: they are counted in the samples.
Result<RouteRunResult> RunRoute(const RouteRunConfig& config);

}  // namespace orbitkv::bench
