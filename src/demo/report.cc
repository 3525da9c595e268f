#include "demo/report.h"

#include <fmt/format.h>

namespace orbitkv::demo {

void Tally::Add(const RequestRecord& r) {
  ++requests;
  queried += r.queried;
  hit_dram += r.hit_dram;
  hit_ssd += r.hit_ssd;
  failed += r.failed;
  missed += r.missed;
  mismatched += r.mismatched;
  restore_bytes += r.restore_bytes;
  restore_ns += r.restore_ns;
  published += r.published;
  computed_tokens += r.computed_tokens;
  stored += r.stored;
  skipped += r.skipped;
  prefix_tokens += r.prefix_tokens;
  pieces += r.pieces;
  checkpoint_bytes += r.checkpoint_bytes;
  not_needed_bytes += r.not_needed_bytes;
  if (r.restore_ns) restore_ms.push_back(double(r.restore_ns) / 1e6);
  if (first_error.empty() && !r.first_error.empty()) first_error = r.first_error;
}

Progress::Progress(uint64_t total, bool live, std::chrono::milliseconds period)
    : total_(total), line_(live, period) {}

std::string Progress::Line(const Tally& t, const Tally& h) const {
  const double secs = line_.Elapsed();
  return fmt::format(
      "[{:5.1f} s] requests {}/{} | hit {:.1f}% (DRAM {:.1f}%, SSD {:.1f}%) | restored {}{}{}",
      secs, t.requests + h.requests, total_, 100 * t.HitRate(), Percent(t.hit_dram, t.queried),
      Percent(t.hit_ssd, t.queried), Bytes(double(t.restore_bytes + h.restore_bytes)),
      h.requests ? fmt::format(" | hybrid: {} not read", Bytes(double(h.not_needed_bytes))) : "",
      t.mismatched + h.mismatched ? fmt::format(" | MISMATCHES {}", t.mismatched + h.mismatched)
                                  : "");
}

void Progress::Update(const Tally& t, const Tally& h, bool force) {
  if (force || line_.Due()) line_.Show(Line(t, h));
}

void Progress::Finish(const Tally& t, const Tally& h) {
  Update(t, h, /*force=*/true);
  line_.Finish();
}

void PrintSummary(std::FILE* out, const SummaryInput& in) {
  const Tally& t = *in.tally;
  auto line = [&](const std::string& s) { std::fprintf(out, "%s\n", s.c_str()); };
  line("");
  line("OrbitKV demo summary");
  line(fmt::format("  requests           {} ({}) in {:.1f} s", t.requests, in.shape,
                   in.wall_seconds));
  line(fmt::format("  blocks queried     {:>9}  ({} KV each)", Count(t.queried),
                   Bytes(double(in.block_bytes))));
  line(fmt::format("    hit in DRAM      {:>9}  {:5.1f} %", Count(t.hit_dram),
                   Percent(t.hit_dram, t.queried)));
  line(fmt::format("    hit on SSD       {:>9}  {:5.1f} %", Count(t.hit_ssd),
                   Percent(t.hit_ssd, t.queried)));
  line(fmt::format("    restore failed   {:>9}  {:5.1f} %  (recomputed){}", Count(t.failed),
                   Percent(t.failed, t.queried),
                   t.first_error.empty() ? "" : "  first: " + t.first_error));
  line(fmt::format("    missed           {:>9}  {:5.1f} %  (prefilled)", Count(t.missed),
                   Percent(t.missed, t.queried)));
  line(fmt::format("  hit rate           {:.1f} %  (DRAM {:.1f} %, SSD {:.1f} %)",
                   100 * t.HitRate(), Percent(t.hit_dram, t.queried),
                   Percent(t.hit_ssd, t.queried)));
  line(fmt::format("  blocks published   {:>9}  (stored {}, already cached or refused {})",
                   Count(t.published), Count(t.stored), Count(t.skipped)));

  const uint64_t restored_tokens = t.hits() * in.block_tokens;
  if (in.compute_tokens_per_s > 0) {
    line(fmt::format(
        "  compute            {} tokens computed at {:.0f} tokens/s per engine; {} restored "
        "instead ({:.1f} s of compute saved)",
        Count(t.computed_tokens), in.compute_tokens_per_s, Count(restored_tokens),
        double(restored_tokens) / in.compute_tokens_per_s));
  } else {
    line(fmt::format("  compute            {} tokens computed; {} restored instead",
                     Count(t.computed_tokens), Count(restored_tokens)));
  }
  const double secs = double(t.restore_ns) / 1e9;
  line(fmt::format("  restore            {} in {:.2f} s of Restore calls = {:.2f} GB/s",
                   Bytes(double(t.restore_bytes)), secs,
                   secs > 0 ? double(t.restore_bytes) / secs / 1e9 : 0.0));
  line(
      fmt::format("    per request      p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms  ({} restores)",
                  Quantile(t.restore_ms, 0.50), Quantile(t.restore_ms, 0.99),
                  Quantile(t.restore_ms, 1.0), t.restore_ms.size()));

  if (in.hybrid) {
    const Tally& h = *in.hybrid;
    const double read = double(h.restore_bytes), skipped = double(h.not_needed_bytes);
    line(fmt::format("  hybrid engines     {} requests ({}), each query a recovery plan",
                     h.requests, in.hybrid_shape));
    line(fmt::format(
        "    prefix restored  {} of {} queried blocks ({:.1f} %), {} tokens as {} pieces",
        Count(h.hits()), Count(h.queried), 100 * h.HitRate(), Count(h.prefix_tokens),
        Count(h.pieces)));
    line(fmt::format("    read             {} (of it recurrent checkpoints {})", Bytes(read),
                     Bytes(double(h.checkpoint_bytes))));
    line(fmt::format(
        "    not needed       {} of [0, P) recovery did not read: window blocks before P - W, "
        "older checkpoints ({:.1f} % of what a dense chain would read)",
        Bytes(skipped), read + skipped > 0 ? 100 * skipped / (read + skipped) : 0.0));
  }

  if (in.metrics) {
    const MetricsSnapshot& m = *in.metrics;
    line("  Manager /metrics");
    line(fmt::format("    hits             DRAM {}, SSD {}; misses {}",
                     Count(uint64_t(m.Value("orbitkv_cache_hits_total", {{"tier", "dram"}}))),
                     Count(uint64_t(m.Value("orbitkv_cache_hits_total", {{"tier", "ssd"}}))),
                     Count(uint64_t(m.Value("orbitkv_cache_misses_total")))));
    line("    bytes by route   (orbitkv_bytes_total)");
    for (const std::string& route : m.LabelValues("orbitkv_bytes_total", "route")) {
      line(fmt::format("      {:<18} {:>10}", route,
                       Bytes(m.Value("orbitkv_bytes_total", {{"route", route}}))));
    }
    line(fmt::format("    SSD io_uring     read {}, written {}",
                     Bytes(m.Value("orbitkv_ssd_uring_read_bytes_total")),
                     Bytes(m.Value("orbitkv_ssd_uring_write_bytes_total"))));
    line(fmt::format("    DRAM pool        {} capacity, {} evictions ({}), {} publishes dropped",
                     Bytes(m.Value("orbitkv_pool_capacity_bytes")),
                     Count(uint64_t(m.Value("orbitkv_pool_evictions_total"))),
                     Bytes(m.Value("orbitkv_pool_evicted_bytes_total")),
                     Count(uint64_t(m.Value("orbitkv_publish_dropped_total")))));
    line(fmt::format(
        "    SSD writes lost  {} (writeback queue full), {} (pinned), {} (no space)",
        Count(uint64_t(m.Value("orbitkv_writeback_queue_full_total"))),
        Count(uint64_t(m.Value("orbitkv_ssd_write_drops_total", {{"reason", "pinned"}}))),
        Count(uint64_t(m.Value("orbitkv_ssd_write_drops_total", {{"reason", "nospace"}})))));
  } else {
    line("  Manager /metrics   unavailable: " + in.metrics_error);
  }
  const uint64_t restored = t.hits() + t.mismatched;
  const uint64_t pieces = in.hybrid ? in.hybrid->pieces : 0;
  const uint64_t bad = t.mismatched + (in.hybrid ? in.hybrid->mismatched : 0);
  const std::string what = in.hybrid ? fmt::format("{} restored blocks and {} hybrid pieces",
                                                   Count(restored), Count(pieces))
                                     : fmt::format("{} restored blocks", Count(restored));
  if (bad == 0) {
    line(fmt::format("  verification       OK: {} byte-exact", what));
  } else {
    line(fmt::format("  verification       FAILED: {} of {} had wrong bytes", Count(bad), what));
  }
}

}  // namespace orbitkv::demo
