#include "bench/scale.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "bench/backend.h"
#include "bench/page_target.h"
#include "orbitkv/units.h"
#include "store/object_format.h"
#include "workload/format.h"
#include "workload/manager_process.h"
#include "workload/scrape.h"

namespace orbitkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr uint32_t kRequestBlocks = 32;        // blocks per Publish / Restore of the engines phase
constexpr uint32_t kEngineBlocks = 128;        // pages (and distinct blocks) per engine and point
constexpr uint32_t kChainPublish = 256;        // blocks per Publish of the chain
constexpr uint32_t kQueryRepeats = 200;        // queries per chain length
constexpr uint64_t kSmallSlot = 512;           // the objects phase: one 512-byte slot
constexpr uint32_t kSmallPages = 1024;         // ... published from this many pages
constexpr uint64_t kStormBudget = 256 * kMiB;  // pool room the storm may fill before evicting

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// VmRSS and VmLck of `pid`, in bytes.
std::pair<uint64_t, uint64_t> Memory(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  uint64_t rss = 0, lck = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    if (line.rfind("VmLck:", 0) == 0) lck = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return {rss, lck};
}

struct Engine {
  std::unique_ptr<PageTarget> pages;
  std::unique_ptr<Backend> backend;
};

class ScaleRun {
 public:
  explicit ScaleRun(const ScaleParams& p) : p_(p) {}

  Result<ScaleReport> Run() {
    r_.device = p_.device;
    for (uint64_t b : p_.slot_bytes) r_.block_bytes += b;
    const uint64_t object = ObjectSize(p_.slot_bytes);
    chain_blocks_ = std::max<uint32_t>(1, p_.max_chain_tokens / std::max(1u, p_.block_tokens));
    const uint64_t small_object = AlignUp(ObjectSize({kSmallSlot}), 512);
    r_.pool_bytes =
        AlignUp(uint64_t{chain_blocks_} * object + p_.objects * small_object * 5 / 4 +
                    2ull * p_.max_engines * kEngineBlocks * object + kStormBudget + 64 * kMiB,
                kMiB);
    ORBITKV_RETURN_IF_ERROR(Start());
    Status st = Chain();
    if (st.ok()) st = Engines();
    if (st.ok()) st = Objects();
    if (st.ok()) st = Storm();
    const int ws = manager_->child.Stop(SIGTERM, std::chrono::seconds(30));
    if (st.ok() && !demo::ExitedZero(ws))
      st = Status::Internal("the Manager " + demo::DescribeWaitStatus(ws) + " on SIGTERM");
    if (!st.ok()) return st.WithContext("scale (Manager log: " + log_ + ")");
    return r_;
  }

 private:
  Status Start() {
    ORBITKV_ASSIGN_OR_RETURN(const std::string binary, demo::FindManagerBinary(p_.manager_binary));
    demo::ManagerLaunch l;
    l.binary = binary;
    l.args = {"--pool-size", std::to_string(r_.pool_bytes), "--admission", "all", "--log-level",
              "warn"};
    socket_ = p_.dir + "/orbitkv.sock";
    log_ = p_.dir + "/manager.log";
    l.socket = socket_;
    l.log_path = log_;
    l.interrupted = p_.interrupted;
    ORBITKV_ASSIGN_OR_RETURN(demo::RunningManager m, demo::StartManager(l));
    manager_.emplace(std::move(m));
    return Status::OK();
  }

  Result<Engine> Connect(const std::string& ns, uint64_t pages, const std::vector<uint64_t>& slots,
                         const std::string& name) {
    Engine e;
    ORBITKV_ASSIGN_OR_RETURN(e.pages, CreatePageTarget(p_.device, pages, slots, p_.page_first));
    ORBITKV_ASSIGN_OR_RETURN(e.backend, ConnectManagerBackend(socket_, ns, *e.pages, name));
    return e;
  }

  std::string Ns(const char* what) const {
    return fmt::format("orbitkv-bench/scale/{}/seed{}", what, p_.seed);
  }

  // Publishes keys[i] from page pages[i] in calls of `per_call`.
  static Status PublishAll(Backend& b, const std::vector<BlockKey>& keys,
                           const std::vector<uint64_t>& pages, size_t per_call) {
    for (size_t i = 0; i < keys.size(); i += per_call) {
      const size_t n = std::min(per_call, keys.size() - i);
      ORBITKV_ASSIGN_OR_RETURN(PublishResult r, b.Publish(0, std::span(keys).subspan(i, n),
                                                          std::span(pages).subspan(i, n)));
      (void)r;
    }
    return Status::OK();
  }

  Status Chain() {
    ORBITKV_ASSIGN_OR_RETURN(Engine e,
                             Connect(Ns("chain"), kChainPublish, p_.slot_bytes, "scale-chain"));
    std::vector<BlockKey> keys(chain_blocks_);
    for (uint32_t i = 0; i < chain_blocks_; ++i) keys[i] = ScaleKey(p_.seed, 1, 0, i);
    std::vector<uint64_t> pages(chain_blocks_);
    for (uint32_t i = 0; i < chain_blocks_; ++i) pages[i] = i % kChainPublish;
    for (uint32_t i = 0; i < kChainPublish && i < chain_blocks_; ++i) e.pages->Fill(0, keys[i], i);
    ORBITKV_RETURN_IF_ERROR(PublishAll(*e.backend, keys, pages, kChainPublish));
    std::vector<uint32_t> lengths;
    for (uint32_t t = 1024; t < p_.max_chain_tokens; t *= 2) lengths.push_back(t);
    lengths.push_back(p_.max_chain_tokens);
    for (uint32_t tokens : lengths) {
      const uint32_t n = std::min(chain_blocks_, std::max(1u, tokens / p_.block_tokens));
      std::vector<double> s;
      // Each Release is a request too: the Query series are counted apart.
      ORBITKV_ASSIGN_OR_RETURN(demo::MetricsSnapshot m0,
                               demo::ScrapeMetrics(manager_->metrics_port));
      for (uint32_t k = 0; k < kQueryRepeats; ++k) {
        const auto t0 = Clock::now();
        ORBITKV_ASSIGN_OR_RETURN(Backend::Lookup l, e.backend->Query(std::span(keys).first(n)));
        s.push_back(Since(t0));
        ORBITKV_RETURN_IF_ERROR(e.backend->Release(l));
        if (l.prefix != n) {
          return Status::Internal(
              fmt::format("a query of {} published blocks found {}", n, l.prefix));
        }
      }
      ORBITKV_ASSIGN_OR_RETURN(demo::MetricsSnapshot m1,
                               demo::ScrapeMetrics(manager_->metrics_port));
      ScaleReport::ChainPoint pt{tokens, n, {}};
      pt.mean_ms = 1e3 * std::accumulate(s.begin(), s.end(), 0.0) / s.size();
      pt.query_ms = QuantilesMs(std::move(s));
      // Mean milliseconds per call of a histogram between the two scrapes.
      auto mean = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
        const double count = m1.Value(name + "_count", labels) - m0.Value(name + "_count", labels);
        const double sum = m1.Value(name + "_sum", labels) - m0.Value(name + "_sum", labels);
        return count > 0 ? 1e3 * sum / count : 0.0;
      };
      pt.manager_request_ms = mean("orbitkv_request_seconds", {{"op", "Query"}});
      pt.manager_query_ms = mean("orbitkv_query_seconds", {});
      pt.manager_wait_ms = mean("orbitkv_request_wait_seconds", {{"op", "Query"}});
      r_.chain.push_back(pt);
    }
    return e.backend->Close();
  }

  Status Engines() {
    for (uint32_t n = 1; n <= p_.max_engines; ++n) {
      std::vector<Engine> engines;
      for (uint32_t e = 0; e < n; ++e) {
        ORBITKV_ASSIGN_OR_RETURN(Engine x, Connect(Ns("engines"), kEngineBlocks, p_.slot_bytes,
                                                   fmt::format("scale-engine-{}", e)));
        engines.push_back(std::move(x));
      }
      std::vector<Status> st(n);
      std::vector<uint64_t> restored(n, 0), checked(n, 0), bad(n, 0);
      std::vector<double> pub_s(n, 0), res_s(n, 0);
      std::latch publish_go(n + 1), restore_go(n + 1);
      std::vector<std::thread> threads;
      for (uint32_t e = 0; e < n; ++e) {
        threads.emplace_back([&, e] {
          Engine& x = engines[e];
          std::vector<BlockKey> keys(kEngineBlocks);
          std::vector<uint64_t> pages(kEngineBlocks);
          for (uint32_t i = 0; i < kEngineBlocks; ++i) {
            keys[i] = ScaleKey(p_.seed, 2, (uint64_t{n} << 16) | e, i);
            pages[i] = i;
            x.pages->Fill(0, keys[i], i);
          }
          publish_go.arrive_and_wait();
          auto t0 = Clock::now();
          st[e] = PublishAll(*x.backend, keys, pages, kRequestBlocks);
          pub_s[e] = Since(t0);
          restore_go.arrive_and_wait();
          if (!st[e].ok()) return;
          t0 = Clock::now();
          for (uint32_t pass = 0; st[e].ok() && (pass == 0 || Since(t0) < p_.seconds_per_point);
               ++pass) {
            const bool verify = p_.verify && pass == 0;
            for (uint32_t i = 0; i < kEngineBlocks && st[e].ok(); i += kRequestBlocks) {
              const auto k = std::span(keys).subspan(i, kRequestBlocks);
              if (verify) {
                std::vector<PageRef> request_pages;
                for (uint32_t j = 0; j < kRequestBlocks; ++j) request_pages.push_back({0, i + j});
                x.pages->PoisonMany(request_pages);
              }
              Result<Backend::Lookup> l = x.backend->Query(k);
              if (!l.ok()) {
                st[e] = l.status();
                break;
              }
              std::vector<uint32_t> blocks(l->prefix);
              std::iota(blocks.begin(), blocks.end(), 0);
              std::vector<uint64_t> dst(pages.begin() + i, pages.begin() + i + l->prefix);
              Result<std::vector<BlockResult>> res = x.backend->Restore(*l, k, blocks, dst);
              if (!res.ok()) {
                st[e] = res.status();
                break;
              }
              std::vector<PageRef> done;
              std::vector<BlockKey> done_keys;
              for (const BlockResult& b : *res) {
                if (!b.status.ok()) {
                  st[e] = b.status;
                  break;
                }
                restored[e] += r_.block_bytes;
                if (!verify) continue;
                done.push_back({0, i + b.block});
                done_keys.push_back(k[b.block]);
              }
              if (!done.empty()) {  // the call's pages at once, as in engine.cc
                checked[e] += done.size();
                for (bool right : x.pages->CheckMany(done, done_keys)) bad[e] += right ? 0 : 1;
              }
              if (l->prefix < kRequestBlocks)
                st[e] = Status::Internal("engines phase: published blocks missed");
            }
          }
          res_s[e] = Since(t0);
        });
      }
      publish_go.arrive_and_wait();
      const auto pub0 = Clock::now();
      restore_go.arrive_and_wait();
      const double pub_wall = Since(pub0);
      const auto res0 = Clock::now();
      for (std::thread& t : threads) t.join();
      const double res_wall = Since(res0);
      for (Engine& x : engines) x.backend->Close().IgnoreError("scale: unregistering an engine");
      for (uint32_t e = 0; e < n; ++e) {
        ORBITKV_RETURN_IF_ERROR(st[e]);
        r_.blocks_checked += checked[e];
        r_.mismatched += bad[e];
      }
      ScaleReport::EnginePoint pt;
      pt.engines = n;
      pt.published_bytes = uint64_t{n} * kEngineBlocks * r_.block_bytes;
      pt.restored_bytes = std::accumulate(restored.begin(), restored.end(), uint64_t{0});
      pt.publish_gbps = double(pt.published_bytes) / std::max(pub_wall, 1e-9) / 1e9;
      pt.restore_gbps = double(pt.restored_bytes) / std::max(res_wall, 1e-9) / 1e9;
      r_.engines.push_back(pt);
      if (p_.interrupted && p_.interrupted->load()) return Status::Cancelled("interrupted");
    }
    return Status::OK();
  }

  Status Objects() {
    ORBITKV_ASSIGN_OR_RETURN(Engine e,
                             Connect(Ns("objects"), kSmallPages, {kSmallSlot}, "scale-objects"));
    for (uint32_t i = 0; i < kSmallPages; ++i) e.pages->Fill(0, ScaleKey(p_.seed, 3, 0, i), i);
    ORBITKV_ASSIGN_OR_RETURN(demo::MetricsSnapshot m0, demo::ScrapeMetrics(manager_->metrics_port));
    const auto [rss0, lck0] = Memory(manager_->child.pid());
    std::vector<BlockKey> keys(kSmallPages);
    std::vector<uint64_t> pages(kSmallPages);
    std::iota(pages.begin(), pages.end(), 0);
    for (uint64_t i = 0; i < p_.objects; i += kSmallPages) {
      const size_t n = std::min<uint64_t>(kSmallPages, p_.objects - i);
      for (size_t j = 0; j < n; ++j) keys[j] = ScaleKey(p_.seed, 3, 1, i + j);
      ORBITKV_ASSIGN_OR_RETURN(PublishResult r, e.backend->Publish(0, std::span(keys).first(n),
                                                                   std::span(pages).first(n)));
      r_.objects += r.stored;
    }
    ORBITKV_ASSIGN_OR_RETURN(demo::MetricsSnapshot m1, demo::ScrapeMetrics(manager_->metrics_port));
    const auto [rss1, lck1] = Memory(manager_->child.pid());
    r_.object_bytes = ObjectSize({kSmallSlot});
    r_.rss_before = rss0;
    r_.rss_after = rss1;
    const double used0 = m0.Value("orbitkv_pool_used_bytes");
    const double used1 = m1.Value("orbitkv_pool_used_bytes");
    r_.pool_used_delta = used1 > used0 ? uint64_t(used1 - used0) : 0;
    // A pool locked resident from the start adds nothing to RSS as it fills.
    r_.pool_locked = lck0 >= r_.pool_bytes;
    const uint64_t pool_growth = r_.pool_locked ? 0 : r_.pool_used_delta;
    const uint64_t grew = rss1 > rss0 ? rss1 - rss0 : 0;
    if (r_.objects > 0)
      r_.directory_bytes_per_object =
          double(grew > pool_growth ? grew - pool_growth : 0) / double(r_.objects);
    return e.backend->Close();
  }

  Status Storm() {
    ORBITKV_ASSIGN_OR_RETURN(
        Engine probe, Connect(Ns("storm"), kRequestBlocks, p_.slot_bytes, "scale-storm-probe"));
    std::vector<BlockKey> keys(kRequestBlocks);
    std::vector<uint64_t> pages(kRequestBlocks);
    for (uint32_t i = 0; i < kRequestBlocks; ++i) {
      keys[i] = ScaleKey(p_.seed, 4, 0, i);
      pages[i] = i;
      probe.pages->Fill(0, keys[i], i);
    }
    ORBITKV_RETURN_IF_ERROR(PublishAll(*probe.backend, keys, pages, kRequestBlocks));
    auto probes = [&](std::vector<double>* out) -> Status {
      for (uint32_t k = 0; k < p_.probes; ++k) {
        const uint32_t i = k % kRequestBlocks;
        ORBITKV_ASSIGN_OR_RETURN(Backend::Lookup l,
                                 probe.backend->Query(std::span(keys).subspan(i, 1)));
        if (l.prefix == 0) {  // evicted by the storm: publish it again, untimed
          ORBITKV_RETURN_IF_ERROR(probe.backend->Release(l));
          probe.pages->Fill(0, keys[i], i);
          ORBITKV_RETURN_IF_ERROR(PublishAll(*probe.backend, {keys[i]}, {pages[i]}, 1));
          --k;
          continue;
        }
        const uint32_t block = 0;
        const uint64_t page = i;
        const auto t0 = Clock::now();
        ORBITKV_ASSIGN_OR_RETURN(std::vector<BlockResult> res,
                                 probe.backend->Restore(l, std::span(keys).subspan(i, 1),
                                                        std::span(&block, 1), std::span(&page, 1)));
        out->push_back(Since(t0));
        for (const BlockResult& b : res) ORBITKV_RETURN_IF_ERROR(b.status);
      }
      return Status::OK();
    };
    std::vector<double> idle, storm;
    ORBITKV_RETURN_IF_ERROR(probes(&idle));
    r_.storm_publishers = std::max<uint32_t>(1, p_.max_engines - 1);
    std::vector<Engine> pubs;
    for (uint32_t e = 0; e < r_.storm_publishers; ++e) {
      ORBITKV_ASSIGN_OR_RETURN(Engine x, Connect(Ns("storm"), kRequestBlocks, p_.slot_bytes,
                                                 fmt::format("scale-storm-{}", e)));
      pubs.push_back(std::move(x));
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> published{0};
    std::vector<Status> st(pubs.size());
    std::vector<std::thread> threads;
    const auto s0 = Clock::now();
    for (uint32_t e = 0; e < pubs.size(); ++e) {
      threads.emplace_back([&, e] {
        std::vector<BlockKey> k(kRequestBlocks);
        std::vector<uint64_t> pg(kRequestBlocks);
        std::iota(pg.begin(), pg.end(), 0);
        for (uint64_t round = 0; !stop.load(std::memory_order_relaxed); ++round) {
          for (uint32_t i = 0; i < kRequestBlocks; ++i)
            k[i] = ScaleKey(p_.seed, 5, e, round * kRequestBlocks + i);  // always fresh keys
          Result<PublishResult> r = pubs[e].backend->Publish(0, k, pg);
          if (!r.ok()) {
            st[e] = r.status();
            return;
          }
          published.fetch_add(r->stored * r_.block_bytes);
        }
      });
    }
    Status probed = probes(&storm);
    stop.store(true);
    for (std::thread& t : threads) t.join();
    r_.storm_publish_gbps = double(published.load()) / std::max(Since(s0), 1e-9) / 1e9;
    for (Engine& x : pubs) x.backend->Close().IgnoreError("scale: unregistering a publisher");
    ORBITKV_RETURN_IF_ERROR(probed);
    for (const Status& s : st) ORBITKV_RETURN_IF_ERROR(s);
    r_.idle_ms = QuantilesMs(std::move(idle));
    r_.storm_ms = QuantilesMs(std::move(storm));
    return probe.backend->Close();
  }

  const ScaleParams& p_;
  ScaleReport r_;
  uint32_t chain_blocks_ = 0;
  std::string socket_, log_;
  std::optional<demo::RunningManager> manager_;
};

}  // namespace

BlockKey ScaleKey(uint64_t seed, uint32_t phase, uint64_t a, uint64_t b) {
  BlockKey k{};
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t{phase} << 56) ^ (a << 32) ^ b;
  for (size_t i = 0; i < k.size(); i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(k.data() + i, &z, 8);
  }
  return k;
}

Result<ScaleReport> RunScale(const ScaleParams& params) {
  if (params.slot_bytes.empty()) return Status::InvalidArgument("scale: a model without slots");
  if (params.max_engines == 0 || params.max_engines > 64)
    return Status::InvalidArgument("--scale-engines must be 1..64");
  if (params.max_chain_tokens < params.block_tokens)
    return Status::InvalidArgument("--scale-chain-tokens must hold at least one block");
  ScaleRun run(params);
  return run.Run();
}

void PrintScale(std::FILE* out, const ScaleReport& r) {
  auto line = [&](const std::string& s) { std::fprintf(out, "%s\n", s.c_str()); };
  line("");
  line(fmt::format("orbitkv-bench scale: {} pages, blocks of {}, pool {}", r.device,
                   FormatByteSize(r.block_bytes), FormatByteSize(r.pool_bytes)));
  line("  query latency against chain length (whole chain in DRAM, metadata only)");
  line(
      "    the engine's call over the socket; then means from the Manager's histograms: "
      "request = last byte read to reply sent, of which wait = for a request thread and "
      "Query = Manager::Query; the rest of the mean is the client and the kernel");
  line(fmt::format("    {:>8} {:>7} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8}", "tokens",
                   "blocks", "p50 ms", "p99 ms", "target", "mean", "request", "wait", "Query"));
  for (const auto& c : r.chain) {
    line(
        fmt::format("    {:>8} {:>7} {:>10.3f} {:>10.3f} {:>8} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f}",
                    c.tokens, c.blocks, c.query_ms.p50, c.query_ms.p99,
                    c.blocks == 8192 ? (c.query_ms.p50 < 1.0 ? "met" : "MISS") : "", c.mean_ms,
                    c.manager_request_ms, c.manager_wait_ms, c.manager_query_ms));
  }
  line("  restore and publish against engines (each its own session, pages and blocks)");
  line(fmt::format("    {:>7} {:>12} {:>12}", "engines", "restore GB/s", "publish GB/s"));
  for (const auto& e : r.engines)
    line(fmt::format("    {:>7} {:>12.2f} {:>12.2f}", e.engines, e.restore_gbps, e.publish_gbps));
  line(fmt::format(
      "  directory    {} objects of {}: Manager RSS {} -> {}; {:.0f} bytes per object beyond its "
      "pool bytes ({})",
      demo::Count(r.objects), FormatByteSize(r.object_bytes), demo::Bytes(double(r.rss_before)),
      demo::Bytes(double(r.rss_after)), r.directory_bytes_per_object,
      r.pool_locked
          ? "pool locked resident from the start"
          : "less orbitkv_pool_used_bytes growth " + demo::Bytes(double(r.pool_used_delta))));
  line(fmt::format(
      "  storm        one-block restore p50/p99 {:.3f}/{:.3f} ms alone, {:.3f}/{:.3f} ms while {} "
      "engine(s) publish at {:.2f} GB/s",
      r.idle_ms.p50, r.idle_ms.p99, r.storm_ms.p50, r.storm_ms.p99, r.storm_publishers,
      r.storm_publish_gbps));
  line(fmt::format("  verification {} blocks checked, {} mismatched", r.blocks_checked,
                   r.mismatched));
}

json ScaleJson(const ScaleReport& r) {
  auto q = [](const Quantiles& x) {
    return json{{"n", x.n}, {"p50_ms", x.p50}, {"p99_ms", x.p99}, {"max_ms", x.max}};
  };
  json j;
  j["workload"] = "scale";
  j["device"] = r.device;
  j["block_bytes"] = r.block_bytes;
  j["pool_bytes"] = r.pool_bytes;
  j["query_vs_chain"] = json::array();
  for (const auto& c : r.chain)
    j["query_vs_chain"].push_back({{"tokens", c.tokens},
                                   {"blocks", c.blocks},
                                   {"query", q(c.query_ms)},
                                   {"mean_ms", c.mean_ms},
                                   {"manager_request_ms", c.manager_request_ms},
                                   {"manager_wait_ms", c.manager_wait_ms},
                                   {"manager_query_ms", c.manager_query_ms}});
  j["engines"] = json::array();
  for (const auto& e : r.engines)
    j["engines"].push_back({{"engines", e.engines},
                            {"restore_gbps", e.restore_gbps},
                            {"publish_gbps", e.publish_gbps},
                            {"restored_bytes", e.restored_bytes},
                            {"published_bytes", e.published_bytes}});
  j["directory"] = {{"objects", r.objects},
                    {"object_bytes", r.object_bytes},
                    {"rss_before", r.rss_before},
                    {"rss_after", r.rss_after},
                    {"pool_used_delta", r.pool_used_delta},
                    {"pool_locked", r.pool_locked},
                    {"bytes_per_object", r.directory_bytes_per_object}};
  j["storm"] = {{"idle", q(r.idle_ms)},
                {"storm", q(r.storm_ms)},
                {"publishers", r.storm_publishers},
                {"publish_gbps", r.storm_publish_gbps}};
  j["verification"] = {{"checked", r.blocks_checked}, {"mismatched", r.mismatched}};
  return j;
}

}  // namespace orbitkv::bench
