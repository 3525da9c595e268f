#include "bench/figures.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "manager/cufile_route.h"
#include "orbitkv/units.h"
#include "workload/format.h"

namespace orbitkv::bench {
namespace {

Throughput Sum(const std::vector<const CallSample*>& calls) {
  Throughput t;
  std::vector<std::pair<double, double>> spans;
  for (const CallSample* c : calls) {
    t.bytes += c->bytes;
    ++t.calls;
    t.call_s += c->end - c->start;
    spans.push_back({c->start, c->end});
  }
  std::sort(spans.begin(), spans.end());
  double lo = 0, hi = -1;
  for (auto [s, e] : spans) {
    if (s > hi) {
      if (hi > lo) t.busy_s += hi - lo;
      lo = s;
      hi = e;
    } else {
      hi = std::max(hi, e);
    }
  }
  if (hi > lo) t.busy_s += hi - lo;
  if (t.busy_s > 0) {
    t.bytes_per_s = double(t.bytes) / t.busy_s;
    t.overlap = t.call_s / t.busy_s;
  }
  return t;
}

double Value(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

}  // namespace

Quantiles QuantilesMs(std::vector<double> seconds) {
  Quantiles q;
  q.n = seconds.size();
  if (seconds.empty()) return q;
  for (double& s : seconds) s *= 1e3;
  q.p50 = demo::Quantile(seconds, 0.50);
  q.p99 = demo::Quantile(seconds, 0.99);
  q.max = demo::Quantile(seconds, 1.0);
  for (double s : seconds) q.mean += s;
  q.mean /= double(seconds.size());
  return q;
}

namespace {

StageFigures Stages(const std::vector<const CallSample*>& calls) {
  std::vector<double> take, wait, io, copy, finish, client;
  StageFigures f;
  auto s = [](int64_t ns) { return double(ns) * 1e-9; };
  for (const CallSample* c : calls) {
    if (!c->timeline) continue;
    const RestoreTimeline& t = *c->timeline;
    ++f.calls;
    take.push_back(s(t.source_ready_ns));
    const bool did_io = t.io_submitted_ns >= 0 && t.io_complete_ns >= 0;
    if (did_io) {
      wait.push_back(s(t.io_submitted_ns - t.source_ready_ns));
      io.push_back(s(t.io_complete_ns - t.io_submitted_ns));
    }
    if (t.copy_complete_ns >= 0) {
      copy.push_back(s(t.copy_complete_ns - (did_io ? t.io_complete_ns : t.source_ready_ns)));
      finish.push_back(s(t.done_ns - t.copy_complete_ns));
    }
    client.push_back(std::max(0.0, c->end - c->start - s(t.done_ns)));
  }
  f.take = QuantilesMs(take);
  f.wait = QuantilesMs(wait);
  f.io = QuantilesMs(io);
  f.copy = QuantilesMs(copy);
  f.finish = QuantilesMs(finish);
  f.client = QuantilesMs(client);
  return f;
}

}  // namespace

namespace {

CodecFigures CodecOf(const RouteRunResult& run, const Throughput& restore) {
  const ManagerView& v = run.view;
  CodecFigures c;
  c.codec = run.storage_codec;
  c.encode_raw_bytes = Value(v.end, "codec_encode_in");
  c.encode_frame_bytes = Value(v.end, "codec_encode_out");
  c.encode_s = Value(v.end, "codec_encode_s");
  c.decode_frame_bytes = Value(v.delta, "codec_decode_in");
  c.decode_raw_bytes = Value(v.delta, "codec_decode_out");
  c.decode_s = Value(v.delta, "codec_decode_s");
  c.dram_gpu_decodes = Value(v.delta, "codec_dram_gpu");
  c.dram_cpu_decodes = Value(v.delta, "codec_dram_cpu");
  c.dram_encoded_copies = Value(v.end, "codec_dram_copies");
  c.dram_saved_bytes = Value(v.end, "codec_dram_saved_bytes");
  for (std::string_view reason : CufileSeries::kEncodeFallbacks) {
    const double n = Value(v.end, "codec_gpu_encode_fallback_" + std::string(reason));
    if (n > 0) c.gpu_encode_fallbacks[std::string(reason)] = n;
  }
  if (c.encode_frame_bytes > 0) c.ratio_written = c.encode_raw_bytes / c.encode_frame_bytes;
  if (c.decode_frame_bytes > 0) c.ratio_read = c.decode_raw_bytes / c.decode_frame_bytes;
  if (c.encode_s > 0) c.encode_gbps = c.encode_raw_bytes / c.encode_s / 1e9;
  if (c.decode_s > 0) c.decode_gbps = c.decode_raw_bytes / c.decode_s / 1e9;
  if (restore.bytes > 0) {
    c.effective_gbps = restore.bytes_per_s / 1e9;
    // Of the restored KV, the part the codec decoded moved at its stored size.
    const double kv = double(restore.bytes);
    const double decoded = std::min(kv, c.decode_raw_bytes);
    const double stored =
        kv - decoded +
        (c.decode_raw_bytes > 0 ? decoded * c.decode_frame_bytes / c.decode_raw_bytes : 0);
    c.stored_gbps = c.effective_gbps * stored / kv;
  }
  return c;
}

}  // namespace

RouteFigures ComputeFigures(const RouteRunResult& run, uint64_t block_bytes, uint32_t block_tokens,
                            double rate) {
  RouteFigures f;
  f.route = run.route;
  const Tier tier = Info(run.route).tier;
  std::vector<const CallSample*> mine, other, pubs, probes;
  std::vector<double> request_s, probe_s, ttft_s, recompute_s;
  double restored_prefill_s = 0, restored_restore_s = 0, mover_cpu = 0;
  uint64_t ssd_kv_bytes = 0;
  for (const EngineSamples& e : run.engines) {
    for (const CallSample& c : e.restores) {
      (c.tier == tier ? mine : other).push_back(&c);
      if (c.tier == tier) request_s.push_back(c.end - c.start);
      if (c.tier == Tier::kSsd) ssd_kv_bytes += c.bytes;
      mover_cpu += c.cpu;
    }
    for (const CallSample& c : e.publishes) {
      pubs.push_back(&c);
      mover_cpu += c.cpu;
    }
    for (const CallSample& p : e.probes) {
      if (p.tier != tier) continue;
      probe_s.push_back(p.end - p.start);
      probes.push_back(&p);
    }
    for (const RequestSample& r : e.requests) {
      ++f.requests;
      f.queried += r.queried;
      f.hit_dram += r.hit_dram;
      f.hit_ssd += r.hit_ssd;
      f.failed += r.failed;
      f.missed += r.missed;
      f.prefix_tokens += r.prefix_tokens;
      f.pieces += r.pieces;
      f.restored_bytes += r.restored_bytes;
      f.checkpoint_bytes += r.checkpoint_bytes;
      f.not_needed_bytes += r.not_needed_bytes;
      if (!r.queried_cache || rate <= 0) continue;
      const double restored_tokens = double(r.restored_blocks) * block_tokens;
      ttft_s.push_back(r.query_s + r.restore_s +
                       std::max(0.0, double(r.prompt_tokens) - restored_tokens) / rate);
      recompute_s.push_back(double(r.prompt_tokens) / rate);
      if (r.restored_blocks) {
        restored_prefill_s += restored_tokens / rate;
        restored_restore_s += r.restore_s;
      }
    }
    f.verified += e.verified_blocks;
    f.mismatched += e.mismatched;
    f.restored_blocks += e.restored_blocks;
    f.dropped += e.dropped;
    if (f.first_error.empty()) f.first_error = e.first_restore_error;
  }
  f.restore = Sum(mine);
  f.restore_other = Sum(other);
  f.publish = Sum(pubs);
  f.request_ms = QuantilesMs(request_s);
  f.stages = Stages(mine);
  f.probe_stages = Stages(probes);
  f.block_ms = QuantilesMs(probe_s);
  f.prefill_tokens_per_s = rate;
  f.ttft_ms = QuantilesMs(ttft_s);
  f.recompute_ms = QuantilesMs(recompute_s);
  if (restored_restore_s > 0) f.restore_vs_prefill = restored_prefill_s / restored_restore_s;
  f.measured_wall_s = run.measured_wall_s;
  f.moved_bytes = double(f.restore.bytes + f.restore_other.bytes + f.publish.bytes);
  const ManagerView& v = run.view;
  if (run.manager) {
    f.cpu_who = "Manager process (/proc/<pid>/stat utime+stime)";
    f.cpu_s = v.cpu_seconds;
    f.cpu_by_role = v.cpu_by_role;
    // Bytes read from the SSD by either engine: io_uring into staging, cuFile into GPU staging.
    const double ssd_read =
        Value(v.delta, "ssd_read_bytes") + Value(v.delta, "ssd_cufile_read_bytes");
    f.ssd_read_bytes = ssd_read;
    f.ssd_read_ops = Value(v.delta, "ssd_read_ops");
    if (ssd_kv_bytes > 0) f.read_amplification = ssd_read / double(ssd_kv_bytes);
    const double written = Value(v.end, "ssd_objects_written") * double(block_bytes);
    if (written > 0) f.physical_amplification = Value(v.end, "ssd_write_bytes") / written;
    f.amplification_measured = true;
    f.pool_capacity = Value(v.peak, "pool_capacity_bytes");
    f.pool_pinned_peak = Value(v.peak, "pool_pinned_bytes");
    f.staging_capacity = Value(v.peak, "staging_capacity_bytes");
    f.staging_used_peak = Value(v.peak, "staging_used_bytes");
    f.ssd_read_pinned_peak = Value(v.peak, "ssd_read_pinned_bytes");
    f.gpu_staging_peak = Value(v.peak, "gpu_staging_bytes");
    f.lease_drain_ms = run.lease_drain_s < 0 ? -1 : run.lease_drain_s * 1e3;
    f.writeback_drain_ms = run.writeback_drain_s < 0 ? -1 : run.writeback_drain_s * 1e3;
    f.manager_exit = v.exit;
    for (const char* path : kCostPaths) {
      const std::string key = std::string("cost_") + path;
      const double n = Value(v.delta, key + "_count");
      if (n > 0) f.cost[path] = {n, Value(v.delta, key + "_sum") / n};
      const double probes = Value(v.probe_cost, key + "_count");
      if (probes > 0) f.probe_cost[path] = {probes, Value(v.probe_cost, key + "_sum") / probes};
    }
  } else {
    f.cpu_who = "engine threads in pread/pwrite + memcpy (CLOCK_THREAD_CPUTIME_ID)";
    f.cpu_s = mover_cpu;
    const double slot = double(AlignUp(block_bytes, 4096)) / double(block_bytes);
    f.read_amplification = slot;
    f.physical_amplification = slot;
    f.ssd_read_ops = double(f.restore.calls ? f.restore.bytes / block_bytes : 0);
    f.ssd_read_bytes = f.ssd_read_ops * double(AlignUp(block_bytes, 4096));
    f.staging_capacity = double(run.engines.size() * AlignUp(block_bytes, 4096));
    f.staging_used_peak = f.staging_capacity;
  }
  if (f.moved_bytes > 0) f.cpu_s_per_gb = f.cpu_s / (f.moved_bytes / 1e9);
  if (f.measured_wall_s > 0) f.cpu_cores = f.cpu_s / f.measured_wall_s;
  if (run.manager && !run.storage_codec.empty()) f.codec = CodecOf(run, f.restore);
  return f;
}

}  // namespace orbitkv::bench
