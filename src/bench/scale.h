// Scale: how OrbitKV's costs grow with its work (orbitkv-bench --workload
// scale). One Manager (DRAM pool only, --admission all, no SSD) and engine
// threads of the bench, each its own session with its own pages, measure:
//  * query latency against chain length: a chain of up to max_chain_tokens
//    published once, then queried whole at 1k..max tokens (metadata only);
//  * restore and publish GB/s against the number of engines (1..max_engines),
//    each engine its own blocks, every restored byte checked on the first pass;
//  * directory memory per cached object and Manager RSS after `objects`
//    single-slot 512-byte objects (/proc/<pid>/status VmRSS, less the pool
//    pages those objects touched: orbitkv_pool_used_bytes, unless the pool
//    was locked resident from the start);
//  * single-block restore latency alone, then under a publish storm of the
//    other engines (at least one).
// Call from one thread; it starts and stops the Manager.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/figures.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

struct ScaleParams {
  std::string manager_binary;  // empty: FindManagerBinary's default
  std::string dir;             // socket and log
  std::string device = "host";
  bool page_first = false;
  std::vector<uint64_t> slot_bytes;  // of one block
  uint32_t block_tokens = 16;
  uint32_t max_chain_tokens = 131072;
  uint32_t max_engines = 4;
  uint64_t objects = 100000;
  uint32_t probes = 200;  // single-block restores, alone and under the storm
  double seconds_per_point = 1.0;
  bool verify = true;
  uint64_t seed = 1;
  const std::atomic<bool>* interrupted = nullptr;
};

struct ScaleReport {
  struct ChainPoint {
    uint32_t tokens = 0, blocks = 0;
    Quantiles query_ms;  // the engine's Query call, as it sees it
    // Means over the same calls from the Manager's own histograms: a
    // request's last byte read to its reply sent (orbitkv_request_seconds),
    // of which waiting for a request thread (orbitkv_request_wait_seconds)
    // and Manager::Query itself (orbitkv_query_seconds). 0: not scraped.
    double mean_ms = 0, manager_request_ms = 0, manager_wait_ms = 0, manager_query_ms = 0;
  };
  struct EnginePoint {
    uint32_t engines = 0;
    double restore_gbps = 0, publish_gbps = 0;
    uint64_t restored_bytes = 0, published_bytes = 0;
  };
  std::vector<ChainPoint> chain;
  std::vector<EnginePoint> engines;
  uint64_t objects = 0, object_bytes = 0;
  uint64_t rss_before = 0, rss_after = 0, pool_used_delta = 0;
  bool pool_locked = false;
  double directory_bytes_per_object = 0;
  Quantiles idle_ms, storm_ms;  // single-block restores
  double storm_publish_gbps = 0;
  uint32_t storm_publishers = 0;
  uint64_t blocks_checked = 0, mismatched = 0;
  uint64_t block_bytes = 0, pool_bytes = 0;
  std::string device;
};

// A distinct key per (seed, phase, a, b), spread over all 32 bytes like a
// real block hash: the Manager treats keys as opaque names.
BlockKey ScaleKey(uint64_t seed, uint32_t phase, uint64_t a, uint64_t b);

Result<ScaleReport> RunScale(const ScaleParams& params);
void PrintScale(std::FILE* out, const ScaleReport& report);
nlohmann::json ScaleJson(const ScaleReport& report);

}  // namespace orbitkv::bench
