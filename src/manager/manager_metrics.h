// ManagerMetrics: the Manager's own series on /metrics (the store, the cuFile
// workers and the protocol register theirs), registered once at Create and
// shared by the parts as plain pointers (series are thread-safe).
#pragma once

#include "orbitkv/metrics.h"

namespace orbitkv {

struct ManagerMetrics {
  Counter *hits_dram, *hits_ssd, *misses;
  Counter *bytes_publish, *bytes_restore_dram, *bytes_restore_ssd, *bytes_writeback, *bytes_prepare;
  Counter *bytes_restore_cufile, *bytes_writeback_cufile;
  Counter *publish_objects, *publish_skipped, *publish_pool_full, *writeback_queue_full,
      *read_queue_full;
  Counter *restore_blocks_ok, *restore_blocks_failed, *restore_cancelled, *queries_expired;
  Counter *budget_cuts_manager, *budget_cuts_session, *assemblies_aborted;
  Counter *gpu_write_fallbacks, *backend_fallbacks;
  Counter *publish_crc_gpu_bytes, *publish_crc_cpu_bytes;
  Counter *uring_crc_gpu_bytes, *uring_crc_cpu_bytes, *uring_gpu_declined;
  Gauge* uring_gpu_staging_bytes;
  Histogram *publish_seconds, *restore_seconds, *query_seconds;
  Histogram* writeback_yield_seconds = nullptr;  // null without SSD
  // Opt-in (ManagerOptions::cost_observations); null otherwise.
  Histogram *cost_uring = nullptr, *cost_cufile = nullptr;
  // Children of a DRAM restore or a publish into CUDA pages (issue 18: where
  // a call's copy stage goes): the DRAM restore's per-block work before its
  // copies (header checks, copy lists), and each host<->device copy job's
  // enqueue (CopyAsync + Record) and wait, per direction (0 H2D, 1 D2H).
  Histogram* cost_dram_plan = nullptr;
  Histogram* cost_publish_assemble = nullptr;    // per object: pool entry, header, its copies
  Histogram* cost_publish_pool_begin = nullptr;  // its pool entry alone (BeginAssembly)
  Histogram* cost_publish_seal = nullptr;        // per batch: after its D2H wait, the seals
  Histogram* cost_gpu_decode_enqueue = nullptr;  // the DRAM GPU decode lanes' batches
  Histogram* cost_gpu_decode_wait = nullptr;
  Histogram* cost_copy_enqueue[2] = {nullptr, nullptr};
  Histogram* cost_copy_wait[2] = {nullptr, nullptr};
  Histogram* cost_copy_call[2] = {nullptr, nullptr};  // the CopyAsync call inside an enqueue
  Histogram* cost_crc_launch = nullptr;               // a D2H job's CRC32C launch
  Histogram* cost_publish_call = nullptr;             // Manager::Publish, whole
  Histogram* cost_uring_verify =
      nullptr;  // io_uring copy lane, per block: checks, CRC32C, copy list
  Histogram* cost_uring_promote = nullptr;    // io_uring copy lane, per block: promotion into DRAM
  Histogram* cost_uring_gpu_check = nullptr;  // io_uring copy lane, per run: the GPU check + copy

  // `ssd`: SSD caching is on (else its series are still put on /metrics).
  static ManagerMetrics Register(MetricsRegistry& m, bool ssd, bool cost_observations);
};

}  // namespace orbitkv
