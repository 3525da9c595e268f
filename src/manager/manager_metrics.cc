#include "manager/manager_metrics.h"

namespace orbitkv {

ManagerMetrics ManagerMetrics::Register(MetricsRegistry& m, bool ssd, bool cost_observations) {
  ManagerMetrics x;
  const char* hits = "Queried blocks found, by tier.";
  x.hits_dram = m.GetCounter("orbitkv_cache_hits_total", hits, {{"tier", "dram"}});
  x.hits_ssd = m.GetCounter("orbitkv_cache_hits_total", hits, {{"tier", "ssd"}});
  x.misses = m.GetCounter("orbitkv_cache_misses_total", "Queried blocks not found (chain ends).");
  const char* bytes = "Object bytes moved, by route.";
  auto route = [&](const char* r) {
    return m.GetCounter("orbitkv_bytes_total", bytes, {{"route", r}});
  };
  x.bytes_publish = route("publish_dram");
  x.bytes_restore_dram = route("restore_dram");
  x.bytes_restore_ssd = route("restore_ssd_uring");
  x.bytes_writeback = route("writeback_ssd");
  x.bytes_prepare = route("prepare_ssd");
  const char* crc =
      "Published bytes whose segment CRC32C was computed, by where: the GPU (CUDA pages) or the "
      "CPU (host pages, or a CUDA batch without pinned scratch or redone after a copy error).";
  x.publish_crc_gpu_bytes =
      m.GetCounter("orbitkv_publish_crc_bytes_total", crc, {{"where", "gpu"}});
  x.publish_crc_cpu_bytes =
      m.GetCounter("orbitkv_publish_crc_bytes_total", crc, {{"where", "cpu"}});
  const char* uring_crc =
      "Object bytes of io_uring restores into CUDA pages whose payload CRC32C was checked, by "
      "where: the GPU (in --ssd-uring-gpu-staging, before the scatter) or the CPU (declined by "
      "the GPU path, or no GPU staging).";
  x.uring_crc_gpu_bytes =
      m.GetCounter("orbitkv_ssd_uring_crc_bytes_total", uring_crc, {{"where", "gpu"}});
  x.uring_crc_cpu_bytes =
      m.GetCounter("orbitkv_ssd_uring_crc_bytes_total", uring_crc, {{"where", "cpu"}});
  x.uring_gpu_declined = m.GetCounter(
      "orbitkv_ssd_uring_gpu_declined_total",
      "io_uring restore blocks into CUDA pages the GPU check declined (encoded, larger than a "
      "staging buffer, or no buffer free): checked on the CPU instead.");
  x.uring_gpu_staging_bytes = m.GetGauge(
      "orbitkv_ssd_uring_gpu_staging_bytes",
      "GPU memory held for io_uring restores' GPU CRC32C check (--ssd-uring-gpu-staging, all "
      "devices; outside --pool-size).");
  x.publish_objects = m.GetCounter("orbitkv_publish_objects_total", "Objects sealed in DRAM.");
  x.publish_skipped = m.GetCounter("orbitkv_publish_skipped_total",
                                   "Published blocks already cached (DRAM or SSD).");
  x.publish_pool_full = m.GetCounter("orbitkv_publish_dropped_total",
                                     "Published blocks dropped: the DRAM pool had no room.");
  x.writeback_queue_full = m.GetCounter("orbitkv_writeback_queue_full_total",
                                        "Sealed objects not written to SSD: writeback queue full.");
  x.read_queue_full = m.GetCounter("orbitkv_read_queue_full_total",
                                   "SSD reads refused: the host-reader queue was full.");
  x.restore_blocks_ok = m.GetCounter("orbitkv_restore_blocks_total", "Restored blocks by outcome.",
                                     {{"outcome", "ok"}});
  x.restore_blocks_failed = m.GetCounter("orbitkv_restore_blocks_total",
                                         "Restored blocks by outcome.", {{"outcome", "error"}});
  x.restore_cancelled = m.GetCounter("orbitkv_restore_cancelled_blocks_total",
                                     "Blocks released by cancellation before submission.");
  x.queries_expired = m.GetCounter("orbitkv_queries_expired_total", "Queries whose TTL passed.");
  const char* cuts =
      "Queries whose prefix was cut by the query byte budget (not a miss), by the limit hit: "
      "the Manager-wide budget or the session's share of it.";
  x.budget_cuts_manager =
      m.GetCounter("orbitkv_query_budget_cuts_total", cuts, {{"limit", "manager"}});
  x.budget_cuts_session =
      m.GetCounter("orbitkv_query_budget_cuts_total", cuts, {{"limit", "session"}});
  x.assemblies_aborted =
      m.GetCounter("orbitkv_assemblies_aborted_total",
                   "Unsealed fragment assemblies aborted because a writer unregistered or its "
                   "session closed.");
  x.publish_seconds = m.GetHistogram("orbitkv_publish_seconds", "Latency of one Publish call.");
  x.restore_seconds =
      m.GetHistogram("orbitkv_restore_seconds", "Latency of one restore, start to last block.");
  x.query_seconds = m.GetHistogram("orbitkv_query_seconds", "Latency of one Query call.");
  x.writeback_yield_seconds =
      ssd ? m.GetHistogram("orbitkv_writeback_yield_seconds",
                           "Each wait of an io_uring writeback lane for restores' SSD reads "
                           "before its next write (--writeback-yield-ms).")
          : nullptr;
  // The GPU storage tier's series exist from the start (zero while idle); the
  // per-device ones are CufileSeries'.
  x.gpu_write_fallbacks = m.GetCounter(
      "orbitkv_ssd_gpu_write_fallbacks_total",
      "GPU write jobs sent through D2H publication and io_uring: eight were already admitted.");
  x.backend_fallbacks =
      m.GetCounter("orbitkv_ssd_backend_fallbacks_total",
                   "Transitions from automatic cuFile admission to io_uring (until restart).");
  x.bytes_restore_cufile = route("restore_ssd_cufile");
  x.bytes_writeback_cufile = route("writeback_ssd_cufile");
  if (cost_observations) {
    const char* help =
        "Opt-in cost observations: SSD restore enqueue to terminal (GPU completion), per route.";
    x.cost_uring = m.GetHistogram("orbitkv_cost_seconds", help, LatencyBuckets(),
                                  {{"path", "ssd_uring_restore"}});
    x.cost_cufile = m.GetHistogram("orbitkv_cost_seconds", help, LatencyBuckets(),
                                   {{"path", "ssd_cufile_restore"}});
    // Child observations: they overlap the totals above and each other's
    // parents (a DRAM restore's plan and its H2D job); never add them up.
    auto child = [&](const char* path) {
      return m.GetHistogram("orbitkv_cost_seconds", help, LatencyBuckets(), {{"path", path}});
    };
    x.cost_dram_plan = child("dram_restore_plan");
    x.cost_publish_assemble = child("publish_assemble");
    x.cost_publish_pool_begin = child("publish_pool_begin");
    x.cost_publish_seal = child("publish_seal");
    x.cost_gpu_decode_enqueue = child("gpu_decode_enqueue");
    x.cost_gpu_decode_wait = child("gpu_decode_wait");
    x.cost_copy_enqueue[0] = child("h2d_copy_enqueue");
    x.cost_copy_wait[0] = child("h2d_copy_wait");
    x.cost_copy_enqueue[1] = child("d2h_copy_enqueue");
    x.cost_copy_wait[1] = child("d2h_copy_wait");
    x.cost_copy_call[0] = child("h2d_copy_call");
    x.cost_copy_call[1] = child("d2h_copy_call");
    x.cost_crc_launch = child("d2h_crc_launch");
    x.cost_publish_call = child("publish_call");
    x.cost_uring_verify = child("ssd_uring_verify");
    x.cost_uring_promote = child("ssd_uring_promote");
    x.cost_uring_gpu_check = child("ssd_uring_gpu_check");
  }
  if (!ssd) {
    // Keep the SSD series on /metrics even with SSD caching off.
    m.GetGauge("orbitkv_ssd_read_pinned_bytes", "SSD bytes held by restore leases.");
    m.GetCounter("orbitkv_ssd_pinned_write_skips_total",
                 "Reservations rejected to protect reads or in-flight writes.");
  }
  return x;
}

}  // namespace orbitkv
