#include "bench/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "orbitkv/units.h"
#include "workload/format.h"

namespace orbitkv::bench {
namespace {

using nlohmann::json;

std::string Gbps(double bytes_per_s) { return fmt::format("{:.2f}", bytes_per_s / 1e9); }

std::string Frac(double value, const Ceiling* c) {
  if (!c || !c->ok || c->bytes_per_s <= 0) return "n/a";
  return fmt::format("{:.0f}%", 100 * value / c->bytes_per_s);
}

std::string CeilingName(const Point& p, const Ceiling* c) {
  if (c == &p.ceilings.memcpy_multi) return fmt::format("memcpy x{}", p.ceilings.memcpy_threads);
  if (c == &p.ceilings.memcpy_single) return "memcpy x1";
  if (c == &p.ceilings.fio_read) return p.ceilings.disk_tool + " read";
  if (c == &p.ceilings.fio_write) return p.ceilings.disk_tool + " write";
  if (c == &p.ceilings.cuda_h2d) return "cuda H2D";
  if (c == &p.ceilings.cuda_d2h) return "cuda D2H";
  return "-";
}

std::string Ms(const Quantiles& q) {
  if (q.n == 0) return "n/a";
  return fmt::format("{:.2f}/{:.2f}", q.p50, q.p99);
}

std::string OrNa(const std::optional<double>& v, const char* fmt_spec = "{:.3f}") {
  return v ? fmt::format(fmt::runtime(fmt_spec), *v) : "n/a";
}

std::string DrainMs(double ms) { return ms < 0 ? "n/a" : fmt::format("{:.1f}", ms); }

const RouteFigures* Find(const Point& p, Route r) {
  for (const RouteFigures& f : p.routes)
    if (f.route == r) return &f;
  return nullptr;
}

// The point the targets are judged at: the model's default block size, else the first.
const Point* Reference(const BenchReport& r, uint32_t tokens) {
  for (const Point& p : r.points)
    if (p.block_tokens == tokens) return &p;
  return r.points.empty() ? nullptr : &r.points.front();
}

json CeilingJson(const Ceiling& c) {
  if (!c.ok) return {{"status", "n/a"}, {"reason", c.reason}, {"what", c.what}};
  return {{"status", "ok"}, {"gbps", c.bytes_per_s / 1e9}, {"what", c.what}};
}

json ThroughputJson(const Throughput& t, const Ceiling* c) {
  json j = {{"bytes", t.bytes},
            {"calls", t.calls},
            {"busy_s", t.busy_s},
            {"call_s", t.call_s},
            {"gbps", t.bytes_per_s / 1e9},
            {"overlap", t.overlap}};
  if (c && c->ok && c->bytes_per_s > 0 && t.bytes > 0) {
    j["fraction_of_ceiling"] = t.bytes_per_s / c->bytes_per_s;
  } else {
    j["fraction_of_ceiling"] = nullptr;
  }
  return j;
}

json QuantilesJson(const Quantiles& q) {
  return {{"n", q.n}, {"p50", q.p50}, {"p99", q.p99}, {"max", q.max}, {"mean", q.mean}};
}

json StagesJson(const StageFigures& t) {
  return {{"calls", t.calls},
          {"take", QuantilesJson(t.take)},
          {"wait_for_io", QuantilesJson(t.wait)},
          {"io", QuantilesJson(t.io)},
          {"copy", QuantilesJson(t.copy)},
          {"finish", QuantilesJson(t.finish)},
          {"client_and_wire", QuantilesJson(t.client)}};
}

json OrNull(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json CodecJson(const CodecFigures& c, const Ceiling* ceiling) {
  return {
      {"codec", c.codec},
      {"ratio_written", OrNull(c.ratio_written)},
      {"ratio_read", OrNull(c.ratio_read)},
      {"encode_raw_bytes", c.encode_raw_bytes},
      {"encode_frame_bytes", c.encode_frame_bytes},
      {"encode_gbps", OrNull(c.encode_gbps)},
      {"decode_frame_bytes", c.decode_frame_bytes},
      {"decode_raw_bytes", c.decode_raw_bytes},
      {"decode_gbps", OrNull(c.decode_gbps)},
      {"effective_kv_gbps", c.effective_gbps},
      {"stored_gbps", c.stored_gbps},
      {"ceiling_gbps", ceiling && ceiling->ok ? json(ceiling->bytes_per_s / 1e9) : json(nullptr)},
      {"effective_fraction_of_ceiling", ceiling && ceiling->ok && c.effective_gbps > 0
                                            ? json(c.effective_gbps * 1e9 / ceiling->bytes_per_s)
                                            : json(nullptr)},
      {"dram_gpu_decodes", c.dram_gpu_decodes},
      {"dram_cpu_decodes", c.dram_cpu_decodes},
      {"dram_encoded_copies", c.dram_encoded_copies},
      {"dram_saved_bytes", c.dram_saved_bytes},
      {"gpu_encode_fallbacks", c.gpu_encode_fallbacks}};
}

std::string OptGbps(const std::optional<double>& v) {
  return v ? fmt::format("{:.2f}", *v) : std::string("n/a");
}

std::string OptRatio(const std::optional<double>& v) {
  return v ? fmt::format("{:.3f}x", *v) : std::string("n/a");
}

// mean p50/p99 of one stage, ms.
std::string Stage(const Quantiles& q) {
  if (q.n == 0) return "-";
  return fmt::format("{:.3f} {:.3f}/{:.3f}", q.mean, q.p50, q.p99);
}

std::string Limits(const BenchReport& r, const Point& p, const RouteFigures& f) {
  std::string s = fmt::format(
      "measured: {} moved with {:.2f} CPU cores of {} busy ({}), {:.2f} CPU s/GB; restore calls "
      "overlapped {:.2f}x (memcpy ceiling uses {} threads); per-request restore p50/p99 {} ms",
      f.route == Route::kNaive ? "the engine threads" : "the Manager", f.cpu_cores, r.cpus,
      f.route == Route::kNaive ? "in I/O and copies" : "whole process", f.cpu_s_per_gb,
      f.restore.overlap, p.ceilings.memcpy_threads, Ms(f.request_ms));
  if (f.read_amplification && Info(f.route).tier == Tier::kSsd)
    s += fmt::format("; SSD read amplification {:.3f}", *f.read_amplification);
  if (f.ssd_read_ops > 0 && Info(f.route).tier == Tier::kSsd)
    s += fmt::format("; {:.0f} SSD reads of {} on average", f.ssd_read_ops,
                     FormatByteSize(uint64_t(f.ssd_read_bytes / f.ssd_read_ops)));
  if (f.staging_capacity > 0 && f.staging_used_peak >= 0.9 * f.staging_capacity &&
      f.route != Route::kNaive)
    s += fmt::format("; read staging full at its peak ({} of {})", demo::Bytes(f.staging_used_peak),
                     demo::Bytes(f.staging_capacity));
  if (f.restore_other.bytes)
    s += fmt::format("; {} of this run's restores came from the other tier",
                     demo::Bytes(double(f.restore_other.bytes)));
  return s;
}

// "okv-req x4 1.200 s 52%, okv-ssd-copy 0.400 s 17%, ...": the Manager's CPU
// by thread role, largest first, each with its share of the roles' sum (the
// process total counts 10 ms clock ticks; the roles, nanoseconds where the
// kernel keeps them).
std::string CpuByRoleText(const RouteFigures& f) {
  std::vector<std::pair<std::string, RoleCpu>> roles(f.cpu_by_role.begin(), f.cpu_by_role.end());
  std::sort(roles.begin(), roles.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double sum = 0;
  for (const auto& [role, c] : roles) sum += c.seconds;
  std::string s;
  for (const auto& [role, c] : roles) {
    if (!s.empty()) s += ", ";
    s += role.empty() ? std::string("(unnamed)") : role;
    if (c.threads > 1) s += fmt::format(" x{}", c.threads);
    s += fmt::format(" {:.3f} s", c.seconds);
    if (c.ticks) s += " (10 ms ticks)";
    if (sum > 0) s += fmt::format(" {:.0f}%", 100 * c.seconds / sum);
  }
  return s;
}

// Issue 17: fp8-encoded DRAM copies restored into HBM (the dram-encoded route:
// encoded bytes over PCIe, decoded on the GPU) against the uncompressed route
// (dram: raw DRAM copies, one H2D) in the same run, effective KV GB/s.
Target EncodedDramTarget(const BenchReport& r, const Point* p) {
  Target t{"fp8 effective DRAM -> HBM restore >= 1.7x the uncompressed route", {}, 0, 1.7, ""};
  const RouteFigures* enc = p ? Find(*p, Route::kDramEncoded) : nullptr;
  const RouteFigures* raw = p ? Find(*p, Route::kDram) : nullptr;
  if (r.device == "host") {
    t.note =
        "n/a: host pages (--device host): encoded DRAM entries decode on the CPU; needs "
        "--device cuda:N";
  } else if (r.storage_codec != "fp8") {
    t.note = "n/a: --storage-codec " + r.storage_codec + " (the target is fp8's)";
  } else if (!enc || enc->restore.bytes == 0) {
    t.note = "n/a: no restore served by route dram-encoded (--routes dram,dram-encoded)";
  } else if (!raw || raw->restore.bytes == 0) {
    t.note =
        "n/a: no restore served by route dram, the uncompressed route (--routes "
        "dram,dram-encoded)";
  } else {
    const CodecFigures& c = enc->codec;
    t.value = enc->restore.bytes_per_s / raw->restore.bytes_per_s;
    t.met = t.value >= t.goal;
    t.note = fmt::format(
        "dram-encoded {} GB/s effective ({} GB/s stored, ratio {}; {:.0f} blocks decoded on the "
        "GPU, {:.0f} on the CPU) vs dram {} GB/s raw, H2D ceiling {} GB/s, at {}-token blocks",
        Gbps(enc->restore.bytes_per_s), fmt::format("{:.2f}", c.stored_gbps),
        OptRatio(c.ratio_read), c.dram_gpu_decodes, c.dram_cpu_decodes,
        Gbps(raw->restore.bytes_per_s),
        p->ceilings.cuda_h2d.ok ? Gbps(p->ceilings.cuda_h2d.bytes_per_s) : "n/a", p->block_tokens);
    if (!*t.met) {
      t.note += fmt::format("; decode {} GB/s of codec time; ", OptGbps(c.decode_gbps)) +
                Limits(r, *p, *enc);
    }
  }
  return t;
}

}  // namespace

const Ceiling* RestoreCeilingOf(const Point& p, Route route, const std::string& device) {
  switch (RestoreCeiling(route, device)) {
    case CeilingKind::kMemcpy:
      return &p.ceilings.memcpy_multi;
    case CeilingKind::kCudaH2D:
      return &p.ceilings.cuda_h2d;
    case CeilingKind::kFioRead:
      return &p.ceilings.fio_read;
  }
  return nullptr;
}

const Ceiling* PublishCeilingOf(const Point& p, Route route, const std::string& device) {
  if (route == Route::kNaive) return &p.ceilings.fio_write;
  return device == "host" ? &p.ceilings.memcpy_multi : &p.ceilings.cuda_d2h;
}

uint64_t Mismatches(const BenchReport& r) {
  uint64_t n = 0;
  for (const Point& p : r.points)
    for (const RouteFigures& f : p.routes) n += f.mismatched;
  return n;
}

std::vector<Target> EvaluateTargets(const BenchReport& r) {
  std::vector<Target> out;
  const uint32_t default_tokens = r.model == "qwen3-next-hybrid" ? 256 : 16;
  const Point* p = Reference(r, default_tokens);
  auto fraction = [&](Target t, Route route, const Ceiling* c) {
    const RouteFigures* f = p ? Find(*p, route) : nullptr;
    if (!f) {
      t.note = "n/a: route " + std::string(Info(route).name) + " did not run in this workload";
    } else if (f->restore.bytes == 0) {
      t.note = "n/a: no restore was served by route " + std::string(Info(route).name);
    } else if (!c || !c->ok) {
      t.note = "n/a: ceiling not measured (" + (c ? c->reason : std::string("none")) + ")";
    } else {
      t.value = f->restore.bytes_per_s / c->bytes_per_s;
      t.met = t.value >= t.goal;
      t.note =
          fmt::format("{} GB/s of {} GB/s ({}) at {}-token blocks", Gbps(f->restore.bytes_per_s),
                      Gbps(c->bytes_per_s), c->what, p->block_tokens);
      if (!*t.met) t.note += "; " + Limits(r, *p, *f);
    }
    out.push_back(t);
  };
  fraction({"SSD io_uring restore >= 90% of fio at the same block size and depth", {}, 0, 0.9, ""},
           Route::kSsdUring, p ? &p->ceilings.fio_read : nullptr);
  if (r.device == "host") {
    fraction({"DRAM restore into host pages >= 80% of memcpy", {}, 0, 0.8, ""}, Route::kDram,
             p ? &p->ceilings.memcpy_multi : nullptr);
    out.push_back({"DRAM -> HBM restore >= 90% of pinned cudaMemcpy H2D",
                   {},
                   0,
                   0.9,
                   "n/a: host pages (--device host); needs --device cuda:N and the GPU tier"});
  } else {
    out.push_back({"DRAM restore into host pages >= 80% of memcpy",
                   {},
                   0,
                   0.8,
                   "n/a: CUDA pages (--device " + r.device + ")"});
    fraction({"DRAM -> HBM restore >= 90% of pinned cudaMemcpy H2D", {}, 0, 0.9, ""}, Route::kDram,
             p ? &p->ceilings.cuda_h2d : nullptr);
    // Publish from HBM, against pinned D2H of the same block size.
    Target pub{"HBM -> DRAM publish >= 85% of pinned cudaMemcpy D2H", {}, 0, 0.85, ""};
    const RouteFigures* f = p ? Find(*p, Route::kDram) : nullptr;
    if (!f || f->publish.bytes == 0) {
      pub.note = "n/a: the dram route published nothing";
    } else if (!p->ceilings.cuda_d2h.ok) {
      pub.note = "n/a: ceiling not measured (" + p->ceilings.cuda_d2h.reason + ")";
    } else {
      pub.value = f->publish.bytes_per_s / p->ceilings.cuda_d2h.bytes_per_s;
      pub.met = pub.value >= pub.goal;
      pub.note = fmt::format("{} GB/s of {} GB/s at {}-token blocks, {} publish calls",
                             Gbps(f->publish.bytes_per_s), Gbps(p->ceilings.cuda_d2h.bytes_per_s),
                             p->block_tokens, f->publish.calls);
    }
    out.push_back(pub);
    // One block from DRAM into HBM, as the engine sees the Restore call.
    Target lat{"one 16-token block DRAM -> HBM: p50 <= 100 us and p99 <= 250 us", {}, 0, 1, ""};
    if (!f || f->block_ms.n == 0) {
      lat.note = "n/a: no single-block probe on the dram route";
    } else if (p->block_tokens != 16) {
      lat.note = fmt::format("n/a: {}-token blocks", p->block_tokens);
    } else {
      lat.value = std::max(f->block_ms.p50 / 0.1, f->block_ms.p99 / 0.25);
      lat.met = f->block_ms.p50 <= 0.1 && f->block_ms.p99 <= 0.25;
      lat.note = fmt::format("p50 {:.0f} us, p99 {:.0f} us over {} probes", 1000 * f->block_ms.p50,
                             1000 * f->block_ms.p99, f->block_ms.n);
    }
    out.push_back(lat);
  }
  out.push_back(EncodedDramTarget(r, p));
  Target naive{"Every OrbitKV SSD route >= 2x the naive baseline (16-token blocks, 8B model)",
               {},
               0,
               2.0,
               ""};
  const Point* p16 = nullptr;
  for (const Point& q : r.points)
    if (q.block_tokens == 16) p16 = &q;
  const RouteFigures* base = p16 ? Find(*p16, Route::kNaive) : nullptr;
  if (r.model != "llama-3.1-8b" && r.model != "qwen3-8b") {
    naive.note = "n/a: model " + r.model + " is not an 8B preset";
  } else if (!p16) {
    naive.note = "n/a: no 16-token point in this run";
  } else if (!base || base->restore.bytes == 0) {
    naive.note = "n/a: the naive route served no restore";
  } else {
    bool any = false;
    double worst = 0;
    std::string parts;
    for (const RouteFigures& f : p16->routes) {
      if (f.route == Route::kNaive || Info(f.route).tier != Tier::kSsd || f.restore.bytes == 0)
        continue;
      const double x = f.restore.bytes_per_s / base->restore.bytes_per_s;
      worst = any ? std::min(worst, x) : x;
      any = true;
      parts +=
          fmt::format("{}{} {:.2f}x ({} vs {} GB/s)", parts.empty() ? "" : ", ", Info(f.route).name,
                      x, Gbps(f.restore.bytes_per_s), Gbps(base->restore.bytes_per_s));
    }
    if (!any) {
      naive.note = "n/a: no OrbitKV SSD route served a restore";
    } else {
      naive.value = worst;
      naive.met = worst >= naive.goal;
      naive.note = parts;
    }
  }
  out.push_back(naive);
  return out;
}

void PrintSummary(std::FILE* out, const BenchReport& r) {
  auto line = [&](const std::string& s) { std::fprintf(out, "%s\n", s.c_str()); };
  line("");
  line(fmt::format("orbitkv-bench summary: {}, model {}, device {}, seed {}", r.workload, r.model,
                   r.device, r.seed));
  line(fmt::format("  model        {}", r.model_description));
  line(fmt::format("               {} KV/token{}", FormatByteSize(r.kv_bytes_per_token),
                   r.checkpoint_bytes ? fmt::format(" + {} state checkpoint per block",
                                                    FormatByteSize(r.checkpoint_bytes))
                                      : ""));
  line(fmt::format(
      "  capacities   pool {} and SSD {} for every route; {} engine(s); SSD files in {} ({}), {} "
      "shards, queue depth {} x {} io workers",
      FormatByteSize(r.pool_bytes), FormatByteSize(r.ssd_bytes), r.engines, r.dir, r.fs_type,
      r.ssd_shards, r.ssd_queue_depth, r.ssd_io_workers));
  line(fmt::format("  TTFT model   prefill at {:.0f} tokens/s (--prefill-tokens-per-s)",
                   r.prefill_tokens_per_s));
  for (const Point& p : r.points) {
    line("");
    line(
        fmt::format("== block {} tokens = {} in {} slots (SSD extent {}); working set {} blocks "
                    "= {}; {} measured requests",
                    p.block_tokens, FormatByteSize(p.block_bytes), p.slots,
                    FormatByteSize(p.extent_bytes), demo::Count(p.working_set_blocks),
                    demo::Bytes(double(p.working_set_blocks * p.block_bytes)),
                    demo::Count(p.measured_requests)));
    line("   " + p.shape);
    line("  ceilings (measured in this run)");
    auto ceil = [&](const char* name, const Ceiling& c) {
      line(fmt::format("    {:<13} {:>8}  {}", name, c.ok ? Gbps(c.bytes_per_s) + " GB/s" : "n/a",
                       c.ok ? c.what : c.reason));
    };
    ceil(fmt::format("memcpy x{}", p.ceilings.memcpy_threads).c_str(), p.ceilings.memcpy_multi);
    if (p.ceilings.memcpy_threads != 1) ceil("memcpy x1", p.ceilings.memcpy_single);
    ceil((p.ceilings.disk_tool + " read").c_str(), p.ceilings.fio_read);
    ceil((p.ceilings.disk_tool + " write").c_str(), p.ceilings.fio_write);
    ceil("cuda H2D", p.ceilings.cuda_h2d);
    ceil("cuda D2H", p.ceilings.cuda_d2h);
    ceil("cuda D2D", p.ceilings.cuda_d2d);
    line(
        fmt::format("    (memcpy x{}: the Manager copies DRAM restores and publishes on one "
                    "session thread per engine; SSD restores on one host-restore lane)",
                    p.ceilings.memcpy_threads));

    line("  restore      route tier only; GB/s = bytes / time any call of the route was in flight");
    line(fmt::format("    {:<12} {:>7} {:>12} {:>6} {:>10} {:>6} {:>7} {:>15} {:>15}", "route",
                     "GB/s", "ceiling", "frac", "bytes", "calls", "overlap", "req p50/p99 ms",
                     "blk p50/p99 ms"));
    for (const RouteFigures& f : p.routes) {
      const Ceiling* c = RestoreCeilingOf(p, f.route, r.device);
      const bool any = f.restore.bytes > 0;
      line(fmt::format("    {:<12} {:>7} {:>12} {:>6} {:>10} {:>6} {:>7} {:>15} {:>15}",
                       Info(f.route).name, any ? Gbps(f.restore.bytes_per_s) : "n/a",
                       CeilingName(p, c), any ? Frac(f.restore.bytes_per_s, c) : "n/a",
                       demo::Bytes(double(f.restore.bytes)), f.restore.calls,
                       any ? fmt::format("{:.2f}x", f.restore.overlap) : "-", Ms(f.request_ms),
                       Ms(f.block_ms)));
    }
    for (const SkippedRoute& s : p.skipped)
      line(fmt::format("    {:<10} n/a: {}", Info(s.route).name, s.reason));
    if (std::any_of(p.routes.begin(), p.routes.end(),
                    [](const RouteFigures& f) { return !f.codec.codec.empty(); })) {
      line(fmt::format(
          "  codec        --storage-codec {}: ratio = raw / stored bytes; effective = KV "
          "delivered per second (uncompressed), stored = the bytes that took",
          r.storage_codec));
      line(fmt::format("    {:<12} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>7} {:>11} {:>9}",
                       "route", "ratio wr", "ratio rd", "enc GB/s", "dec GB/s", "effective",
                       "stored", "of ceil", "DRAM gpu/cpu", "DRAM enc"));
      for (const RouteFigures& f : p.routes) {
        if (f.codec.codec.empty()) continue;
        const CodecFigures& c = f.codec;
        const Ceiling* ceil = RestoreCeilingOf(p, f.route, r.device);
        line(fmt::format("    {:<12} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>7} {:>11} {:>9}",
                         Info(f.route).name, OptRatio(c.ratio_written), OptRatio(c.ratio_read),
                         OptGbps(c.encode_gbps), OptGbps(c.decode_gbps),
                         c.effective_gbps > 0 ? fmt::format("{:.2f}", c.effective_gbps) : "n/a",
                         c.effective_gbps > 0 ? fmt::format("{:.2f}", c.stored_gbps) : "n/a",
                         c.effective_gbps > 0 ? Frac(c.effective_gbps * 1e9, ceil) : "n/a",
                         fmt::format("{:.0f}/{:.0f}", c.dram_gpu_decodes, c.dram_cpu_decodes),
                         fmt::format("{:.0f}", c.dram_encoded_copies)));
      }
    }
    if (r.device == "host" && p.ceilings.memcpy_threads != 1) {
      for (const RouteFigures& f : p.routes) {
        if (f.route == Route::kDram && f.restore.bytes)
          line(fmt::format("    dram vs memcpy x1 (single-threaded): {}",
                           Frac(f.restore.bytes_per_s, &p.ceilings.memcpy_single)));
      }
    }

    if (r.hybrid) {
      line(fmt::format(
          "  recovery     the model description's plans ({}): what measured queries restored and "
          "what recovery did not read",
          r.recovery_groups));
      line(fmt::format("    {:<12} {:>11} {:>8} {:>10} {:>12} {:>11} {:>8}", "route", "P tokens",
                       "pieces", "restored", "checkpoints", "not needed", "skipped"));
      for (const RouteFigures& f : p.routes) {
        const double all = double(f.restored_bytes + f.not_needed_bytes);
        line(fmt::format("    {:<12} {:>11} {:>8} {:>10} {:>12} {:>11} {:>7.1f}%",
                         Info(f.route).name, demo::Count(f.prefix_tokens), demo::Count(f.pieces),
                         demo::Bytes(double(f.restored_bytes)),
                         demo::Bytes(double(f.checkpoint_bytes)),
                         demo::Bytes(double(f.not_needed_bytes)),
                         all > 0 ? 100 * double(f.not_needed_bytes) / all : 0.0));
      }
      line(
          "    (not needed: bytes of [0, P) a dense chain would have read: window blocks before P "
          "- "
          "W, older checkpoints)");
    }

    line(
        "  timeline     where restore calls spent their time (Manager's RestoreTimeline), ms: "
        "mean p50/p99");
    line(fmt::format("    {:<12} {:>6} {:>21} {:>21} {:>21} {:>21} {:>21} {:>21}", "route", "calls",
                     "take", "wait for I/O", "I/O", "copy", "finish", "client+wire"));
    for (const RouteFigures& f : p.routes) {
      // The workload's calls, then the one-block probes (the per-block latency target).
      for (const auto& [t, suffix] :
           {std::pair{&f.stages, ""}, std::pair{&f.probe_stages, " 1blk"}}) {
        if (t->calls == 0) continue;
        line(fmt::format("    {:<12} {:>6} {:>21} {:>21} {:>21} {:>21} {:>21} {:>21}",
                         std::string(Info(f.route).name) + suffix, t->calls, Stage(t->take),
                         Stage(t->wait), Stage(t->io), Stage(t->copy), Stage(t->finish),
                         Stage(t->client)));
      }
    }

    line("  publish");
    line(fmt::format("    {:<12} {:>7} {:>12} {:>6} {:>10} {:>6} {:>8}", "route", "GB/s", "ceiling",
                     "frac", "bytes", "calls", "dropped"));
    for (const RouteFigures& f : p.routes) {
      const Ceiling* c = PublishCeilingOf(p, f.route, r.device);
      const bool any = f.publish.bytes > 0;
      line(fmt::format("    {:<12} {:>7} {:>12} {:>6} {:>10} {:>6} {:>8}", Info(f.route).name,
                       any ? Gbps(f.publish.bytes_per_s) : "n/a", CeilingName(p, c),
                       any ? Frac(f.publish.bytes_per_s, c) : "n/a",
                       demo::Bytes(double(f.publish.bytes)), f.publish.calls, f.dropped));
    }

    line(
        "  requests     hit rates of queried prompt blocks; TTFT = query + restore + prefill of "
        "the rest");
    line(fmt::format("    {:<10} {:>6} {:>6} {:>6} {:>6} {:>7} {:>17} {:>16} {:>12}", "route",
                     "reqs", "DRAM%", "SSD%", "miss%", "failed", "TTFT p50/p99 ms",
                     "recompute p50 ms", "restore vs"));
    line(fmt::format("    {:<10} {:>6} {:>6} {:>6} {:>6} {:>7} {:>17} {:>16} {:>12}", "", "", "",
                     "", "", "", "", "", "prefill"));
    for (const RouteFigures& f : p.routes) {
      line(fmt::format(
          "    {:<10} {:>6} {:>6.1f} {:>6.1f} {:>6.1f} {:>7} {:>17} {:>16} {:>12}",
          Info(f.route).name, f.requests, demo::Percent(f.hit_dram, f.queried),
          demo::Percent(f.hit_ssd, f.queried), demo::Percent(f.missed, f.queried), f.failed,
          Ms(f.ttft_ms), f.recompute_ms.n ? fmt::format("{:.2f}", f.recompute_ms.p50) : "n/a",
          f.restore_vs_prefill > 0 ? fmt::format("{:.1f}x faster", f.restore_vs_prefill) : "n/a"));
    }

    line("  mover        CPU of whoever moves the bytes; amplification = SSD bytes / KV bytes");
    line(fmt::format("    {:<10} {:>8} {:>6} {:>9} {:>9} {:>11} {:>19} {:>11} {:>9} {:>10}",
                     "route", "CPU s/GB", "cores", "read amp", "phys amp", "pinned peak",
                     "staging cap/peak", "SSD pinned", "lease ms", "wb drain"));
    for (const RouteFigures& f : p.routes) {
      line(fmt::format("    {:<10} {:>8} {:>6.2f} {:>9} {:>9} {:>11} {:>19} {:>11} {:>9} {:>10}",
                       Info(f.route).name,
                       f.moved_bytes > 0 ? fmt::format("{:.3f}", f.cpu_s_per_gb) : "n/a",
                       f.cpu_cores, OrNa(f.read_amplification), OrNa(f.physical_amplification),
                       f.route == Route::kNaive ? "-" : demo::Bytes(f.pool_pinned_peak),
                       demo::Bytes(f.staging_capacity) + "/" + demo::Bytes(f.staging_used_peak),
                       f.route == Route::kNaive ? "-" : demo::Bytes(f.ssd_read_pinned_peak),
                       DrainMs(f.lease_drain_ms), DrainMs(f.writeback_drain_ms)));
    }
    for (const RouteFigures& f : p.routes) {
      if (!f.cpu_by_role.empty())
        line(fmt::format("    {} CPU by thread: {}", Info(f.route).name, CpuByRoleText(f)));
    }
    for (const RouteFigures& f : p.routes) {
      if (!f.first_error.empty())
        line(fmt::format("    {}: first failed restore: {}", Info(f.route).name, f.first_error));
    }
  }

  if (r.points.size() > 1) {
    line("");
    line("== restore GB/s by block size (fraction of the route's ceiling)");
    std::string head = fmt::format("    {:>7} {:>11}", "tokens", "block");
    for (const RouteFigures& f : r.points.front().routes)
      head += fmt::format(" {:>16}", Info(f.route).name);
    head += fmt::format(" {:>9} {:>9}", "fio read", "memcpy");
    line(head);
    for (const Point& p : r.points) {
      std::string row =
          fmt::format("    {:>7} {:>11}", p.block_tokens, FormatByteSize(p.block_bytes));
      for (const RouteFigures& f : p.routes) {
        const Ceiling* c = RestoreCeilingOf(p, f.route, r.device);
        row += fmt::format(" {:>16}", f.restore.bytes
                                          ? fmt::format("{} ({})", Gbps(f.restore.bytes_per_s),
                                                        Frac(f.restore.bytes_per_s, c))
                                          : "n/a");
      }
      row += fmt::format(
          " {:>9} {:>9}", p.ceilings.fio_read.ok ? Gbps(p.ceilings.fio_read.bytes_per_s) : "n/a",
          p.ceilings.memcpy_multi.ok ? Gbps(p.ceilings.memcpy_multi.bytes_per_s) : "n/a");
      line(row);
    }
  }

  line("");
  line("  targets (reported, not asserted)");
  for (const Target& t : r.targets) {
    line(fmt::format("    [{}] {}", !t.met ? "n/a " : *t.met ? "met " : "MISS", t.name));
    line(fmt::format("           {}{}",
                     t.met ? fmt::format("{:.2f} (goal {:.2f}): ", t.value, t.goal) : "", t.note));
  }
  uint64_t verified = 0, bad = 0;
  for (const Point& p : r.points) {
    for (const RouteFigures& f : p.routes) {
      verified += f.verified;
      bad += f.mismatched;
    }
  }
  line("");
  const char* what = r.hybrid ? "pieces of the plans" : "blocks";
  if (!r.verify) {
    line("  verification       OFF (--no-verify): restored bytes were not checked");
  } else if (bad == 0) {
    line(fmt::format("  verification       OK: {} restored {} byte-exact", demo::Count(verified),
                     what));
  } else {
    line(fmt::format("  verification       FAILED: {} of {} restored {} had wrong bytes",
                     demo::Count(bad), demo::Count(verified), what));
  }
  if (!r.png_note.empty()) line("  plot               " + r.png_note);
}

json ToJson(const BenchReport& r) {
  json j;
  j["bench"] = "orbitkv-bench";
  j["workload"] = r.workload;
  j["seed"] = r.seed;
  j["device"] = r.device;
  j["flags"] = r.flags;
  j["host"] = {{"cpus", r.cpus}, {"dir", r.dir}, {"fs_type", r.fs_type}};
  j["model"] = {{"name", r.model},
                {"description", r.model_description},
                {"kv_bytes_per_token", r.kv_bytes_per_token},
                {"checkpoint_bytes_per_block", r.checkpoint_bytes},
                {"hybrid", r.hybrid}};
  if (r.hybrid) j["model"]["recovery_groups"] = r.description;
  j["capacities"] = {{"engines", r.engines},
                     {"pool_bytes", r.pool_bytes},
                     {"ssd_bytes", r.ssd_bytes},
                     {"ssd_shards", r.ssd_shards},
                     {"ssd_queue_depth", r.ssd_queue_depth},
                     {"ssd_io_workers", r.ssd_io_workers}};
  j["prefill_tokens_per_s"] = r.prefill_tokens_per_s;
  j["storage_codec"] = r.storage_codec;
  j["points"] = json::array();
  for (const Point& p : r.points) {
    json jp = {{"block_tokens", p.block_tokens},
               {"block_bytes", p.block_bytes},
               {"extent_bytes", p.extent_bytes},
               {"slots", p.slots},
               {"working_set_blocks", p.working_set_blocks},
               {"measured_requests", p.measured_requests},
               {"shape", p.shape}};
    jp["ceilings"] = {{"memcpy_threads", p.ceilings.memcpy_threads},
                      {"memcpy_multi", CeilingJson(p.ceilings.memcpy_multi)},
                      {"memcpy_single", CeilingJson(p.ceilings.memcpy_single)},
                      {"fio_read", CeilingJson(p.ceilings.fio_read)},
                      {"fio_write", CeilingJson(p.ceilings.fio_write)},
                      {"disk_tool", p.ceilings.disk_tool},
                      {"cuda_h2d", CeilingJson(p.ceilings.cuda_h2d)},
                      {"cuda_d2h", CeilingJson(p.ceilings.cuda_d2h)},
                      {"cuda_d2d", CeilingJson(p.ceilings.cuda_d2d)}};
    jp["routes"] = json::array();
    for (const RouteFigures& f : p.routes) {
      const Ceiling* rc = RestoreCeilingOf(p, f.route, r.device);
      const Ceiling* pc = PublishCeilingOf(p, f.route, r.device);
      json jr;
      jr["route"] = Info(f.route).name;
      jr["status"] = "ok";
      jr["tier"] = Info(f.route).tier == Tier::kSsd ? "ssd" : "dram";
      jr["restore"] = ThroughputJson(f.restore, rc);
      jr["restore"]["ceiling"] = CeilingName(p, rc);
      jr["restore_other_tier"] = ThroughputJson(f.restore_other, nullptr);
      jr["publish"] = ThroughputJson(f.publish, pc);
      jr["publish"]["ceiling"] = CeilingName(p, pc);
      jr["latency_ms"] = {{"per_block", QuantilesJson(f.block_ms)},
                          {"per_request", QuantilesJson(f.request_ms)}};
      jr["timeline_ms"] = StagesJson(f.stages);
      auto cost_json = [](const std::map<std::string, RouteFigures::Cost>& costs) {
        json cost = json::object();
        for (const auto& [path, c] : costs) {
          cost[path] = {{"count", c.count}, {"mean_ms", c.mean_s * 1e3}};
        }
        return cost;
      };
      if (!f.cost.empty()) jr["cost_observations"] = cost_json(f.cost);
      if (!f.probe_cost.empty()) jr["probe_cost_observations"] = cost_json(f.probe_cost);
      jr["probe_timeline_ms"] = StagesJson(f.probe_stages);
      jr["hits"] = {{"requests", f.requests}, {"queried", f.queried}, {"dram", f.hit_dram},
                    {"ssd", f.hit_ssd},       {"failed", f.failed},   {"missed", f.missed}};
      jr["ttft"] = {{"prefill_tokens_per_s", f.prefill_tokens_per_s},
                    {"cached_ms", QuantilesJson(f.ttft_ms)},
                    {"recompute_ms", QuantilesJson(f.recompute_ms)},
                    {"restore_vs_prefill", f.restore_vs_prefill}};
      jr["cpu"] = {{"who", f.cpu_who},
                   {"seconds", f.cpu_s},
                   {"moved_bytes", f.moved_bytes},
                   {"seconds_per_gb", f.moved_bytes > 0 ? json(f.cpu_s_per_gb) : json(nullptr)},
                   {"cores", f.cpu_cores}};
      for (const auto& [role, c] : f.cpu_by_role)
        jr["cpu"]["by_thread"][role] = {
            {"seconds", c.seconds}, {"threads", c.threads}, {"clock_ticks_only", c.ticks}};
      jr["amplification"] = {
          {"measured", f.amplification_measured},
          {"ssd_read_ops", f.ssd_read_ops},
          {"ssd_read_bytes", f.ssd_read_bytes},
          {"read", f.read_amplification ? json(*f.read_amplification) : json(nullptr)},
          {"physical", f.physical_amplification ? json(*f.physical_amplification) : json(nullptr)}};
      jr["memory_bytes"] = {{"pool_capacity", f.pool_capacity},
                            {"pool_pinned_peak", f.pool_pinned_peak},
                            {"staging_capacity", f.staging_capacity},
                            {"staging_used_peak", f.staging_used_peak},
                            {"ssd_read_pinned_peak", f.ssd_read_pinned_peak},
                            {"gpu_staging_peak", f.gpu_staging_peak}};
      jr["drain_ms"] = {
          {"lease", f.lease_drain_ms < 0 ? json(nullptr) : json(f.lease_drain_ms)},
          {"writeback", f.writeback_drain_ms < 0 ? json(nullptr) : json(f.writeback_drain_ms)}};
      jr["recovery"] = {{"prefix_tokens", f.prefix_tokens},
                        {"pieces", f.pieces},
                        {"restored_bytes", f.restored_bytes},
                        {"checkpoint_bytes", f.checkpoint_bytes},
                        {"not_needed_bytes", f.not_needed_bytes}};
      jr["verification"] = {{"enabled", r.verify},
                            {"verified_blocks", f.verified},
                            {"mismatched_blocks", f.mismatched},
                            {"ok", f.mismatched == 0}};
      if (!f.codec.codec.empty()) jr["codec"] = CodecJson(f.codec, rc);
      jr["measured_wall_s"] = f.measured_wall_s;
      jr["dropped_publishes"] = f.dropped;
      if (!f.first_error.empty()) jr["first_restore_error"] = f.first_error;
      if (!f.manager_exit.empty()) jr["manager_exit"] = f.manager_exit;
      jp["routes"].push_back(jr);
    }
    for (const SkippedRoute& s : p.skipped)
      jp["routes"].push_back(
          {{"route", Info(s.route).name}, {"status", "n/a"}, {"reason", s.reason}});
    j["points"].push_back(jp);
  }
  j["targets"] = json::array();
  for (const Target& t : r.targets) {
    j["targets"].push_back({{"name", t.name},
                            {"status", !t.met   ? "n/a"
                                       : *t.met ? "met"
                                                : "missed"},
                            {"value", t.met ? json(t.value) : json(nullptr)},
                            {"goal", t.goal},
                            {"note", t.note}});
  }
  uint64_t verified = 0;
  for (const Point& p : r.points)
    for (const RouteFigures& f : p.routes) verified += f.verified;
  const uint64_t bad = Mismatches(r);
  j["verification"] = {{"enabled", r.verify},
                       {"verified_blocks", verified},
                       {"mismatched_blocks", bad},
                       {"passed", r.verify && bad == 0}};
  return j;
}

}  // namespace orbitkv::bench
