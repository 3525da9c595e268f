// Query scale: Manager::Query latency against chain length on an in-process
// Manager (orbitkv-bench --workload query-scale, and the first part of
// --workload scale). No socket: what is timed is the Manager's own work for
// one Query (sessions, the query table, DRAM pins, SSD catalog lookups and
// leases, the budget), the part that grows with the chain; the scale
// workload's end-to-end query figure adds the wire.
//
// A chain of up to max_chain_tokens / block_tokens blocks of one small slot
// (the size does not enter a query's cost) is published twice:
//  * "dram": every block in the pinned pool;
//  * "half-ssd": every odd block written back to the SSD cache (in `dir`,
//    disk-backed: O_DIRECT) and evicted from DRAM, so a query walks DRAM pins
//    and SSD leases alternately at every length.
// Each length (64 blocks, doubling, up to the chain) is queried `repeats`
// times whole (wall time, and the thread's CPU time, which a shared machine
// does not inflate); each query is released (timed apart) before the next. The
// report says how many of the queried blocks each tier served. Call from one
// thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/figures.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

struct QueryScaleParams {
  std::string dir;  // the SSD cache file (disk-backed)
  uint32_t block_tokens = 16;
  uint32_t max_chain_tokens = 131072;
  uint32_t repeats = 50;
  uint64_t seed = 1;
};

struct QueryScaleReport {
  struct Point {
    std::string tier;  // "dram" or "half-ssd"
    uint32_t tokens = 0, blocks = 0;
    uint64_t dram_blocks = 0, ssd_blocks = 0;  // of one query's prefix
    Quantiles query_ms, release_ms;
    Quantiles query_cpu_ms;  // the calling thread's CPU time in Query
  };
  std::vector<Point> points;
  uint32_t block_tokens = 0;
};

Result<QueryScaleReport> RunQueryScale(const QueryScaleParams& params);
void PrintQueryScale(std::FILE* out, const QueryScaleReport& report);
nlohmann::json QueryScaleJson(const QueryScaleReport& report);

}  // namespace orbitkv::bench
