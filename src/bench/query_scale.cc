#include "bench/query_scale.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "bench/page_target.h"
#include "bench/scale.h"
#include "manager/manager.h"
#include "orbitkv/metrics.h"
#include "orbitkv/units.h"
#include "store/object_format.h"

namespace orbitkv::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr uint64_t kSlot = 512;        // one small slot: a query's cost is per key, not per byte
constexpr uint32_t kPages = 256;       // engine pages the chain is published from
constexpr uint32_t kFirstBlocks = 64;  // the shortest chain queried
constexpr uint64_t kStaging = 1 * kMiB;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// This thread's CPU seconds: on a shared machine the wall time also holds
// the time other processes ran.
double ThreadCpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// One in-process Manager with one host instance, for one tier mix.
class Run {
 public:
  Run(const QueryScaleParams& p, uint32_t blocks, bool half_ssd)
      : p_(p), blocks_(blocks), half_ssd_(half_ssd) {}

  ~Run() {
    if (mgr_ && session_) mgr_->CloseSession(session_);
    mgr_.reset();
    if (!cache_.empty()) ::unlink(cache_.c_str());
  }

  Status Start() {
    const uint64_t object = AlignUp(ObjectSize({kSlot}), 4096);
    ManagerConfig c;
    c.metrics = &metrics_;
    c.lock_memory = false;
    c.options.metrics_port = 0;
    if (half_ssd_) {
      // The pool holds the even blocks only: publishing them after the odd
      // ones (written back first) evicts every odd block to the SSD.
      c.options.pool_size = AlignUp(uint64_t{(blocks_ + 1) / 2} * object, 4096) + kStaging;
      c.read_staging_bytes = kStaging;
      cache_ = fmt::format("{}/query-scale-{}.bin", p_.dir, ::getpid());
      c.options.ssd_cache_path = cache_;
      c.options.ssd_cache_capacity = AlignUp(uint64_t{blocks_} * 2 * object + 64 * kMiB, kMiB);
      c.options.ssd_shards = 1;
      c.options.ssd_io_workers = 1;
    } else {
      c.options.pool_size = AlignUp(uint64_t{blocks_} * object + 16 * kMiB, kMiB);
    }
    c.query_budget_bytes = uint64_t{blocks_} * 4 * object;  // never the limit here
    ORBITKV_ASSIGN_OR_RETURN(mgr_, Manager::Create(c));
    session_ = mgr_->OpenSession(::getpid());
    ORBITKV_ASSIGN_OR_RETURN(pages_, CreatePageTarget("host", kPages, {kSlot}));
    RegisterRequest reg;
    reg.ns = fmt::format("orbitkv-bench/query-scale/seed{}", p_.seed);
    std::vector<int> fds;
    pages_->Describe(&reg, &fds);
    ORBITKV_ASSIGN_OR_RETURN(instance_, mgr_->RegisterInstance(session_, reg, std::move(fds)));
    keys_.resize(blocks_);
    for (uint32_t i = 0; i < blocks_; ++i) keys_[i] = ScaleKey(p_.seed, 6, 0, i);
    if (!half_ssd_) return PublishWhere([](uint32_t) { return true; });
    ORBITKV_RETURN_IF_ERROR(PublishWhere([](uint32_t i) { return i % 2 == 1; }));
    mgr_->Drain();  // the odd blocks are on the SSD before the even ones evict them
    ORBITKV_RETURN_IF_ERROR(PublishWhere([](uint32_t i) { return i % 2 == 0; }));
    mgr_->Drain();
    return Status::OK();
  }

  Result<QueryScaleReport::Point> Measure(uint32_t n) {
    QueryScaleReport::Point pt;
    pt.tier = half_ssd_ ? "half-ssd" : "dram";
    pt.blocks = n;
    pt.tokens = n * p_.block_tokens;
    QueryRequest q;
    q.instance = instance_;
    q.keys.assign(keys_.begin(), keys_.begin() + n);
    std::vector<double> query_s, cpu_s, release_s;
    for (uint32_t k = 0; k < p_.repeats; ++k) {
      auto t0 = Clock::now();
      const double c0 = ThreadCpu();
      ORBITKV_ASSIGN_OR_RETURN(QueryResult r, mgr_->Query(session_, q));
      cpu_s.push_back(ThreadCpu() - c0);
      query_s.push_back(Since(t0));
      if (r.prefix != n)
        return Status::Internal(
            fmt::format("a query of {} published blocks found {}", n, r.prefix));
      pt.dram_blocks = std::count(r.sources.begin(), r.sources.end(), Tier::kDram);
      pt.ssd_blocks = std::count(r.sources.begin(), r.sources.end(), Tier::kSsd);
      t0 = Clock::now();
      ORBITKV_RETURN_IF_ERROR(mgr_->ReleaseQuery(session_, r.query));
      release_s.push_back(Since(t0));
    }
    pt.query_ms = QuantilesMs(std::move(query_s));
    pt.query_cpu_ms = QuantilesMs(std::move(cpu_s));
    pt.release_ms = QuantilesMs(std::move(release_s));
    return pt;
  }

 private:
  template <typename Pred>
  Status PublishWhere(Pred pick) {
    PublishRequest req;
    req.instance = instance_;
    auto flush = [&]() -> Status {
      if (req.keys.empty()) return Status::OK();
      ORBITKV_ASSIGN_OR_RETURN(PublishResult r, mgr_->Publish(session_, req));
      if (r.stored != req.keys.size())
        return Status::Internal(fmt::format("query-scale: {} of {} blocks stored ({} dropped)",
                                            r.stored, req.keys.size(), r.dropped));
      req.keys.clear();
      req.pages.clear();
      return Status::OK();
    };
    for (uint32_t i = 0; i < blocks_; ++i) {
      if (!pick(i)) continue;
      const uint64_t page = req.keys.size();
      pages_->Fill(0, keys_[i], page);
      req.keys.push_back(keys_[i]);
      req.pages.push_back(page);
      if (req.keys.size() == kPages) ORBITKV_RETURN_IF_ERROR(flush());
    }
    return flush();
  }

  const QueryScaleParams& p_;
  const uint32_t blocks_;
  const bool half_ssd_;
  MetricsRegistry metrics_;
  std::string cache_;
  std::unique_ptr<Manager> mgr_;
  SessionId session_ = 0;
  std::unique_ptr<PageTarget> pages_;
  InstanceId instance_ = 0;
  std::vector<BlockKey> keys_;
};

}  // namespace

Result<QueryScaleReport> RunQueryScale(const QueryScaleParams& p) {
  if (p.block_tokens == 0 || p.max_chain_tokens < p.block_tokens)
    return Status::InvalidArgument("--scale-chain-tokens must hold at least one block");
  if (p.repeats == 0) return Status::InvalidArgument("query-scale: repeats must be positive");
  const uint32_t blocks = p.max_chain_tokens / p.block_tokens;
  std::vector<uint32_t> lengths;
  for (uint32_t n = std::min(kFirstBlocks, blocks); n < blocks; n *= 2) lengths.push_back(n);
  lengths.push_back(blocks);
  QueryScaleReport report;
  report.block_tokens = p.block_tokens;
  for (bool half_ssd : {false, true}) {
    Run run(p, blocks, half_ssd);
    ORBITKV_RETURN_IF_ERROR(run.Start().WithContext(half_ssd ? "query-scale, half on SSD"
                                                             : "query-scale, all in DRAM"));
    for (uint32_t n : lengths) {
      ORBITKV_ASSIGN_OR_RETURN(QueryScaleReport::Point pt, run.Measure(n));
      report.points.push_back(std::move(pt));
    }
  }
  return report;
}

void PrintQueryScale(std::FILE* out, const QueryScaleReport& r) {
  auto line = [&](const std::string& s) { std::fprintf(out, "%s\n", s.c_str()); };
  line(fmt::format(
      "  Manager::Query against chain length (in-process, no wire; {}-token blocks; the query "
      "released apart)",
      r.block_tokens));
  line(fmt::format("    {:>9} {:>8} {:>7} {:>6} {:>6} {:>9} {:>9} {:>9} {:>11} {:>7}", "tiers",
                   "tokens", "blocks", "dram", "ssd", "p50 ms", "p99 ms", "cpu p50", "release p50",
                   "target"));
  for (const auto& pt : r.points) {
    line(fmt::format("    {:>9} {:>8} {:>7} {:>6} {:>6} {:>9.3f} {:>9.3f} {:>9.3f} {:>11.3f} {:>7}",
                     pt.tier, pt.tokens, pt.blocks, pt.dram_blocks, pt.ssd_blocks, pt.query_ms.p50,
                     pt.query_ms.p99, pt.query_cpu_ms.p50, pt.release_ms.p50,
                     pt.blocks == 8192 ? (pt.query_ms.p50 < 1.0 ? "met" : "MISS") : ""));
  }
}

json QueryScaleJson(const QueryScaleReport& r) {
  auto q = [](const Quantiles& x) {
    return json{{"n", x.n}, {"p50_ms", x.p50}, {"p99_ms", x.p99}, {"max_ms", x.max}};
  };
  json points = json::array();
  for (const auto& pt : r.points)
    points.push_back({{"tiers", pt.tier},
                      {"tokens", pt.tokens},
                      {"blocks", pt.blocks},
                      {"dram_blocks", pt.dram_blocks},
                      {"ssd_blocks", pt.ssd_blocks},
                      {"query", q(pt.query_ms)},
                      {"query_cpu", q(pt.query_cpu_ms)},
                      {"release", q(pt.release_ms)}});
  return json{{"block_tokens", r.block_tokens}, {"points", points}};
}

}  // namespace orbitkv::bench
