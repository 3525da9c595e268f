// Figures: one route run's samples and Manager view turned into the numbers
// the report prints: restore and publish throughput, latency quantiles per
// block and per request, the TTFT model, hit rates by tier, CPU seconds per GB
// moved, read and physical amplification, pinned and staging bytes, drain
// times and verification counts. Fractions of ceilings are the report's
// business (report.h). Pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/route.h"
#include "bench/route_run.h"

namespace orbitkv::bench {

struct Throughput {
  uint64_t bytes = 0;
  uint64_t calls = 0;
  double busy_s = 0;       // union of the calls' intervals over all engines
  double call_s = 0;       // sum of the calls' durations
  double bytes_per_s = 0;  // bytes / busy_s: what the route delivered while it worked
  double overlap = 0;      // call_s / busy_s: calls in flight on average
};

struct Quantiles {  // milliseconds
  uint64_t n = 0;
  double p50 = 0, p99 = 0, max = 0, mean = 0;
};
// p50, p99 and max of samples given in seconds (all zero when empty).
Quantiles QuantilesMs(std::vector<double> seconds);

// Where a route's restore calls spent their time, from the Manager's
// RestoreTimeline of each call (cache_api.h), stage by stage: take (queued to
// source_ready: the blocks taken from the query), wait (source_ready to the
// first SSD read submitted: the read queue and staging), io (first read
// submitted to last read complete), copy (the last read, or source_ready
// without I/O, to the last copy into pages), finish (to the last block done)
// and client (the call's wall time as the engine saw it less the Manager's
// done: the socket, encoding and scheduling). Stages a call did not have are
// left out of their quantiles.
struct StageFigures {
  uint64_t calls = 0;
  Quantiles take, wait, io, copy, finish, client;
};

// A Manager route's storage codec (--storage-codec) figures: what its
// writeback encoded over the run, what the measured restores decoded, the
// codec time of each, and the effective KV GB/s (uncompressed bytes
// delivered per second: the route's restore GB/s) next to the stored bytes
// per second that took. Decode GB/s counts the CPU decoder's seconds per
// segment and the GPU decode lane's check-and-decode time per batch.
struct CodecFigures {
  std::string codec;  // empty: the route stores raw objects
  double encode_raw_bytes = 0, encode_frame_bytes = 0, encode_s = 0;  // over the run
  double decode_frame_bytes = 0, decode_raw_bytes = 0, decode_s = 0;  // measured phases
  // Encoded DRAM entries restored into CUDA pages (measured phases): decoded
  // on the GPU, or on the CPU for want of a lane; raw DRAM entries the
  // writeback replaced by their encoded objects (over the run).
  double dram_gpu_decodes = 0, dram_cpu_decodes = 0, dram_encoded_copies = 0, dram_saved_bytes = 0;
  // Complete groups the GPU encode path did not take, by reason (over the
  // run; non-zero ones only): they were encoded on the CPU at writeback.
  std::map<std::string, double> gpu_encode_fallbacks;
  std::optional<double> ratio_written;  // raw / frame bytes the writeback encoded
  std::optional<double> ratio_read;     // raw / frame bytes the restores decoded
  std::optional<double> encode_gbps;    // raw bytes per codec second
  std::optional<double> decode_gbps;    // raw bytes per codec second
  double effective_gbps = 0;            // KV restored per second (the route's restore GB/s)
  double stored_gbps = 0;               // the stored bytes those restores moved per second
};

struct RouteFigures {
  Route route = Route::kDram;
  Throughput restore;        // restores through this route's tier
  Throughput restore_other;  // restores the run served from the other tier
  Throughput publish;
  Quantiles block_ms;         // single-block restores (probes) through the route's tier
  Quantiles request_ms;       // the workload's Restore calls through the route's tier
  StageFigures stages;        // of those calls
  StageFigures probe_stages;  // of the single-block probes
  uint64_t requests = 0;
  uint64_t queried = 0, hit_dram = 0, hit_ssd = 0, failed = 0, missed = 0;
  // TTFT model: query + restore + prefill of the rest, against prefilling it all.
  double prefill_tokens_per_s = 0;
  Quantiles ttft_ms, recompute_ms;
  double restore_vs_prefill = 0;  // prefill time of the restored tokens / their restore time
  // CPU of whoever moves the bytes: the Manager process, or the naive route's engine threads.
  std::string cpu_who;
  double cpu_s = 0, moved_bytes = 0, cpu_s_per_gb = 0, cpu_cores = 0;
  // The Manager's CPU of the measured phases by thread role (proc_stat.h); empty for naive.
  std::map<std::string, RoleCpu> cpu_by_role;
  std::optional<double> read_amplification;      // SSD bytes read / KV bytes restored from SSD
  std::optional<double> physical_amplification;  // SSD bytes written / KV bytes written
  bool amplification_measured = false;           // false: naive, by construction
  double ssd_read_ops = 0, ssd_read_bytes = 0;   // SSD reads during measured phases
  double pool_capacity = 0, pool_pinned_peak = 0, staging_capacity = 0, staging_used_peak = 0,
         ssd_read_pinned_peak = 0, gpu_staging_peak = 0;
  double lease_drain_ms = -1, writeback_drain_ms = -1;  // -1: n/a
  uint64_t verified = 0, mismatched = 0, restored_blocks = 0, dropped = 0;
  // Over the measured requests' queries (a hybrid model's recovery plans):
  // the plans' prefix tokens P and pieces, bytes restored (every route
  // and tier), of them recurrent checkpoint bytes, and the bytes of [0, P)
  // recovery did not read (QueryResult.not_needed_bytes: window blocks before
  // P - W, older checkpoints). Dense runs: P and bytes only.
  uint64_t prefix_tokens = 0, pieces = 0, restored_bytes = 0, checkpoint_bytes = 0,
           not_needed_bytes = 0;
  // The Manager's opt-in cost observations over the measured phases, by
  // path (route_run.h kCostPaths): observations and their mean seconds.
  struct Cost {
    double count = 0, mean_s = 0;
  };
  std::map<std::string, Cost> cost;
  std::map<std::string, Cost> probe_cost;  // of the one-block latency probes alone
  CodecFigures codec;
  double measured_wall_s = 0;
  std::string first_error;
  std::string manager_exit;
};

// object_bytes: the mean bytes of one stored object (a dense model's block;
// a hybrid model's pieces per block position, averaged).
RouteFigures ComputeFigures(const RouteRunResult& run, uint64_t object_bytes, uint32_t block_tokens,
                            double prefill_tokens_per_s);

}  // namespace orbitkv::bench
