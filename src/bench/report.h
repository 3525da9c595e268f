// Report: what an orbitkv-bench run found, as one structure, printed as a
// summary table for people and written as JSON for machines (and the plot).
// A report holds one point per block size (one for every workload but the
// sweep); a point holds its ceilings and each route's figures, or why a route
// did not run. Targets from the issue are evaluated here and reported, never
// asserted. Pure functions.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/ceilings.h"
#include "bench/figures.h"
#include "bench/route.h"

namespace orbitkv::bench {

struct PointCeilings {
  uint32_t memcpy_threads = 1;  // = the Manager's copy threads for DRAM restores
  Ceiling memcpy_multi, memcpy_single;
  Ceiling fio_read, fio_write;    // the disk: fio, or the bench's io_uring probe (disk_tool)
  std::string disk_tool = "fio";  // "fio" or "probe" (disk_probe.h)
  Ceiling cuda_h2d, cuda_d2h, cuda_d2d;
};

struct SkippedRoute {
  Route route;
  std::string reason;
};

struct Point {
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  uint64_t extent_bytes = 0;  // the stored object rounded up to 4 KiB: the SSD I/O size
  uint32_t slots = 0;
  uint64_t working_set_blocks = 0;
  uint64_t measured_requests = 0;
  std::string shape;
  PointCeilings ceilings;
  std::vector<RouteFigures> routes;
  std::vector<SkippedRoute> skipped;
};

struct Target {
  std::string name;
  std::optional<bool> met;  // nullopt: n/a
  double value = 0;         // the measured ratio
  double goal = 0;
  std::string note;  // what it compares, or why n/a, or what limits it
};

struct BenchReport {
  std::string workload, model, model_description, device, dir, fs_type;
  uint64_t seed = 0;
  uint32_t engines = 0, cpus = 0;
  uint64_t kv_bytes_per_token = 0, checkpoint_bytes = 0;
  // A hybrid model: registered with its description, summarised here
  // ("attn: full attention, 6 MiB/block; gdn: recurrent, ...").
  bool hybrid = false;
  std::string recovery_groups;
  nlohmann::json description;  // the groups, for the JSON
  uint64_t pool_bytes = 0, ssd_bytes = 0;
  uint32_t ssd_shards = 0, ssd_queue_depth = 0, ssd_io_workers = 0;
  double prefill_tokens_per_s = 0;
  std::string storage_codec = "none";  // --storage-codec of the Manager routes
  bool verify = true;
  std::vector<Point> points;
  std::vector<Target> targets;
  std::string png_note;  // what became of --png
  nlohmann::json flags;  // the command line as given
};

// The ceiling a route's restores (or publishes) are compared with; null if n/a.
const Ceiling* RestoreCeilingOf(const Point& p, Route route, const std::string& device);
const Ceiling* PublishCeilingOf(const Point& p, Route route, const std::string& device);

std::vector<Target> EvaluateTargets(const BenchReport& report);
// Mismatches over all points and routes.
uint64_t Mismatches(const BenchReport& report);

void PrintSummary(std::FILE* out, const BenchReport& report);
nlohmann::json ToJson(const BenchReport& report);

}  // namespace orbitkv::bench
