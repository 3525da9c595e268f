#include "bench/route_run.h"

#include <signal.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "bench/backend.h"
#include "bench/engine.h"
#include "bench/naive_store.h"
#include "bench/phase_gate.h"
#include "bench/proc_stat.h"
#include "manager/cufile_route.h"
#include "workload/format.h"
#include "workload/machine.h"
#include "workload/manager_process.h"
#include "workload/scrape.h"

namespace orbitkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Series {
  const char* key;  // how the figures name it
  const char* name;
  const char* label;  // route label value or null
};

// Counters summed over the measured phases.
constexpr Series kCounters[] = {
    {"ssd_read_bytes", "orbitkv_ssd_uring_read_bytes_total", nullptr},
    {"ssd_read_ops", "orbitkv_ssd_uring_read_ops_total", nullptr},
    {"ssd_cufile_read_bytes", "orbitkv_ssd_cufile_read_bytes_total", nullptr},
    {"ssd_write_bytes", "orbitkv_ssd_uring_write_bytes_total", nullptr},
    {"ssd_objects_written", "orbitkv_ssd_objects_written_total", nullptr},
    {"restore_dram_bytes", "orbitkv_bytes_total", "restore_dram"},
    {"restore_ssd_uring_bytes", "orbitkv_bytes_total", "restore_ssd_uring"},
    {"restore_ssd_cufile_bytes", "orbitkv_bytes_total", "restore_ssd_cufile"},
    {"publish_dram_bytes", "orbitkv_bytes_total", "publish_dram"},
    {"writeback_ssd_bytes", "orbitkv_bytes_total", "writeback_ssd"},
    {"pool_evictions", "orbitkv_pool_evictions_total", nullptr},
    {"publish_dropped", "orbitkv_publish_dropped_total", nullptr},
    {"writeback_queue_full", "orbitkv_writeback_queue_full_total", nullptr},
};
// Gauges whose peak the run keeps.
constexpr Series kGauges[] = {
    {"pool_capacity_bytes", "orbitkv_pool_capacity_bytes", nullptr},
    {"pool_used_bytes", "orbitkv_pool_used_bytes", nullptr},
    {"pool_pinned_bytes", "orbitkv_pool_pinned_bytes", nullptr},
    {"staging_capacity_bytes", "orbitkv_ssd_read_staging_capacity_bytes", nullptr},
    {"staging_used_bytes", "orbitkv_ssd_read_staging_used_bytes", nullptr},
    {"ssd_read_pinned_bytes", "orbitkv_ssd_read_pinned_bytes", nullptr},
    {"gpu_staging_bytes", "orbitkv_ssd_gpu_staging_bytes", nullptr},
    {"writeback_pending", "orbitkv_pool_writeback_pending", nullptr},
    {"leases_active", "orbitkv_ssd_leases_active", nullptr},
};

double Get(const demo::MetricsSnapshot& m, const Series& s) {
  if (s.label) return m.Value(s.name, {{"route", s.label}});
  return m.Value(s.name);
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class Driver {
 public:
  explicit Driver(const RouteRunConfig& c) : c_(c), info_(Info(c.route)) {}

  Result<RouteRunResult> Run() {
    out_.route = c_.route;
    out_.manager = !info_.naive;
    if (out_.manager && c_.storage.codec != "none") out_.storage_codec = c_.storage.codec;
    ORBITKV_RETURN_IF_ERROR(demo::MakeDirs(c_.dir));
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(c_.dir, ec))
      std::filesystem::remove_all(entry.path(), ec);
    if (info_.naive && c_.model) {
      return Status::InvalidArgument(
          "the naive route keeps dense chains; a hybrid model runs on the Manager routes");
    }
    if (info_.naive) {
      ORBITKV_ASSIGN_OR_RETURN(
          naive_, NaiveStore::Create(c_.dir + "/naive.bin", c_.ssd_bytes, BlockBytes()));
    } else {
      ORBITKV_RETURN_IF_ERROR(StartManager());
    }
    const Plan& plan = *c_.plan;
    const size_t phases = plan.phases.size();
    const uint32_t engines = static_cast<uint32_t>(plan.phases.at(0).engines.size());
    PhaseGate gate(engines, phases + 1);
    gate_ = &gate;
    epoch_ = Clock::now();
    std::vector<EngineOptions> opts(engines);
    std::mutex probe_mu;  // one latency probe in flight at a time
    std::vector<Status> statuses(engines);
    out_.engines.resize(engines);
    std::vector<std::thread> threads;
    for (uint32_t e = 0; e < engines; ++e) {
      EngineOptions& o = opts[e];
      o.index = e;
      o.plan = &plan;
      o.device = c_.device;
      o.slot_bytes = c_.slot_bytes;
      o.page_first = c_.page_first;
      o.model = c_.model;
      o.group_slot_bytes = c_.group_slot_bytes;
      o.block_tokens = c_.block_tokens;
      o.verify = c_.verify;
      o.probes = c_.probes_per_engine;
      o.probe_mu = &probe_mu;
      o.corrupt_every = c_.corrupt_every;
      o.seed = c_.seed;
      o.epoch = epoch_;
      o.gate = &gate;
      o.live = &live_;
      o.connect = [this, e](PageTarget& pages) -> Result<std::unique_ptr<Backend>> {
        if (naive_) return NewNaiveBackend(*naive_, pages);
        return ConnectManagerBackend(socket_, c_.ns, pages,
                                     "orbitkv-bench-engine-" + std::to_string(e), c_.storage,
                                     c_.model);
      };
      threads.emplace_back([&, e] { statuses[e] = RunEngine(opts[e], &out_.engines[e]); });
    }
    Status st = Phases(plan);
    if (!st.ok()) gate.Abort(st.ToString());
    for (std::thread& t : threads) t.join();
    Draw(true);
    for (const Status& s : statuses)
      if (st.ok() && !s.ok()) st = s;
    if (st.ok() && gate.aborted()) st = Status::Cancelled(gate.reason());
    if (naive_) out_.naive_dropped = naive_->dropped();
    Status stop = StopManager();
    if (st.ok()) st = stop;
    if (!st.ok()) return st;
    return std::move(out_);
  }

 private:
  // Adds `sign` times the storage codec's series in `m` to `into`:
  // codec_{encode,decode}_{in,out} (bytes), codec_{encode,decode}_s (codec
  // seconds), codec_dram_{gpu,cpu} (encoded DRAM entries restored into CUDA
  // pages, by where they decoded), codec_dram_copies and
  // codec_dram_saved_bytes (--codec-dram-copy encoded).
  void AddCodec(std::map<std::string, double>& into, const demo::MetricsSnapshot& m, double sign) {
    if (c_.storage.codec.empty() || c_.storage.codec == "none") return;
    const std::string& c = c_.storage.codec;
    for (const char* op : {"encode", "decode"}) {
      for (const char* dir : {"in", "out"}) {
        const std::string name = std::string("orbitkv_codec_bytes_") + dir + "_total";
        into[std::string("codec_") + op + "_" + dir] +=
            sign * m.Value(name, {{"codec", c}, {"op", op}});
      }
      into[std::string("codec_") + op + "_s"] +=
          sign * m.Value("orbitkv_codec_seconds_sum", {{"codec", c}, {"op", op}});
    }
    for (const char* where : {"gpu", "cpu"}) {
      into[std::string("codec_dram_") + where] +=
          sign * m.Value("orbitkv_codec_dram_restores_total", {{"codec", c}, {"where", where}});
    }
    into["codec_dram_copies"] += sign * m.Value("orbitkv_codec_dram_copies_total", {{"codec", c}});
    for (std::string_view reason : CufileSeries::kEncodeFallbacks) {
      into["codec_gpu_encode_fallback_" + std::string(reason)] +=
          sign *
          m.Value("orbitkv_ssd_gpu_encode_fallbacks_total", {{"reason", std::string(reason)}});
    }
    into["codec_dram_saved_bytes"] +=
        sign * m.Value("orbitkv_codec_dram_bytes_saved_total", {{"codec", c}});
  }

  static void AddCost(std::map<std::string, double>& into, const demo::MetricsSnapshot& m,
                      double sign) {
    for (const char* path : kCostPaths) {
      for (const char* part : {"sum", "count"}) {
        const double v = m.Value(std::string("orbitkv_cost_seconds_") + part, {{"path", path}});
        if (v != 0) into[std::string("cost_") + path + "_" + part] += sign * v;
      }
    }
  }

  uint64_t BlockBytes() const {
    uint64_t sum = 0;
    for (uint64_t b : c_.slot_bytes) sum += b;
    return sum;
  }

  Status StartManager() {
    ORBITKV_ASSIGN_OR_RETURN(manager_binary_, demo::FindManagerBinary(c_.manager_binary));
    socket_ = c_.dir + "/orbitkv.sock";
    if (socket_.size() >= 108)
      return Status::InvalidArgument("socket path too long (over 107 bytes): " + socket_);
    demo::ManagerLaunch launch;
    launch.binary = manager_binary_;
    launch.args = {"--pool-size",          std::to_string(c_.pool_bytes),
                   "--ssd-cache-path",     c_.dir + "/cache.bin",
                   "--ssd-cache-capacity", std::to_string(c_.ssd_bytes),
                   "--ssd-shards",         std::to_string(c_.ssd_shards),
                   "--ssd-queue-depth",    std::to_string(c_.ssd_queue_depth),
                   "--ssd-io-workers",     std::to_string(c_.ssd_io_workers),
                   "--ssd-read-staging",   c_.ssd_read_staging,
                   "--log-level",          "warn"};
    launch.args.insert(launch.args.end(), info_.manager_flags.begin(), info_.manager_flags.end());
    launch.args.insert(launch.args.end(), c_.manager_flags.begin(), c_.manager_flags.end());
    launch.env = info_.manager_env;
    launch.socket = socket_;
    launch.log_path = c_.dir + "/manager.log";
    launch.interrupted = c_.interrupted;
    out_.view.log_path = launch.log_path;
    ORBITKV_ASSIGN_OR_RETURN(demo::RunningManager m, demo::StartManager(launch));
    manager_.emplace(std::move(m));
    return Status::OK();
  }

  Status StopManager() {
    if (!manager_) return Status::OK();
    const int st = manager_->child.Stop(SIGTERM, std::chrono::seconds(30));
    out_.view.exit = "stopped with SIGTERM, " + demo::DescribeWaitStatus(st);
    manager_.reset();
    if (!demo::ExitedZero(st) && !manager_died_) {
      return Status::Internal("the Manager " + demo::DescribeWaitStatus(st) + " on SIGTERM; see " +
                              out_.view.log_path);
    }
    return Status::OK();
  }

  std::optional<demo::MetricsSnapshot> Scrape() {
    if (!manager_) return std::nullopt;
    Result<demo::MetricsSnapshot> m = demo::ScrapeMetrics(manager_->metrics_port);
    if (!m.ok()) return std::nullopt;
    for (const Series& s : kGauges) {
      double& peak = out_.view.peak[s.key];
      peak = std::max(peak, Get(*m, s));
    }
    return std::move(m).value();
  }

  // Checks the Manager and the user; false (with the gate aborted) to stop.
  bool Healthy() {
    if (c_.interrupted && c_.interrupted->load()) {
      gate_->Abort("interrupted");
      return false;
    }
    int st = 0;
    if (manager_ && manager_->child.Poll(&st)) {
      manager_died_ = true;
      gate_->Abort("the Manager " + demo::DescribeWaitStatus(st) + " during the run; see " +
                   out_.view.log_path);
      return false;
    }
    return !gate_->aborted();
  }

  void Draw(bool force) {
    if (!c_.live || !(force || c_.live->Due())) return;
    const uint64_t q = live_.queried.load(), h = live_.hits.load();
    const uint64_t bad = live_.mismatched.load();
    c_.live->Show(fmt::format(
        "[{:6.1f} s] {} {} | {} | requests {}/{} | restored {} | hit {:.1f}% "
        "| {}",
        c_.live->Elapsed(), c_.label, info_.name, phase_name_, live_.requests.load(),
        total_requests_, demo::Bytes(double(live_.restored_bytes.load())), demo::Percent(h, q),
        !c_.verify ? "not verified"
        : bad      ? fmt::format("MISMATCHES {}", bad)
                   : "verified"));
  }

  // Waits for every engine to finish phase k, scraping and drawing meanwhile.
  Status Wait(size_t k) {
    auto last_scrape = Clock::now();
    while (!gate_->AllDone(k)) {
      if (!Healthy()) return Status::Cancelled(gate_->reason());
      if (Since(last_scrape) >= 0.1) {
        Scrape();
        last_scrape = Clock::now();
      }
      Draw(false);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Status::OK();
  }

  // Polls /metrics until `done` holds; seconds it took, or -1 after `limit`.
  template <typename Pred>
  double PollUntil(Clock::time_point since, double limit, Pred done) {
    while (Since(since) < limit) {
      std::optional<demo::MetricsSnapshot> m = Scrape();
      if (m && done(*m)) return Since(since);
      if (!Healthy()) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }

  static bool WritebackIdle(const demo::MetricsSnapshot& m) {
    return m.Value("orbitkv_pool_writeback_pending") == 0 &&
           m.Value("orbitkv_ssd_reservations_inflight") == 0;
  }

  Status Phases(const Plan& plan) {
    for (const Phase& ph : plan.phases)
      for (const auto& reqs : ph.engines) total_requests_ += reqs.size();
    phase_name_ = "connecting";
    for (size_t k = 0; k < plan.phases.size(); ++k) {
      const Phase& ph = plan.phases[k];
      if (ph.drain_before && manager_) {
        phase_name_ = "waiting for SSD writeback";
        if (PollUntil(Clock::now(), 300, WritebackIdle) < 0 && gate_->aborted())
          return Status::Cancelled(gate_->reason());
      }
      phase_name_ = ph.name;
      double cpu0 = 0;
      Result<std::map<pid_t, ThreadCpu>> threads0 = Status::NotFound("not read");
      std::optional<demo::MetricsSnapshot> before;
      if (ph.measured && manager_) {
        before = Scrape();
        cpu0 = ProcessCpuSeconds(manager_->child.pid()).value_or(0);
        threads0 = ThreadCpuSeconds(manager_->child.pid());
      }
      const auto t0 = Clock::now();
      gate_->Open(k);
      ORBITKV_RETURN_IF_ERROR(Wait(k));
      if (ph.measured) {
        out_.measured_wall_s += Since(t0);
        if (manager_) {
          out_.view.cpu_seconds += ProcessCpuSeconds(manager_->child.pid()).value_or(cpu0) - cpu0;
          // Only against a start snapshot: a missing one would count every
          // thread's CPU since the Manager started.
          if (Result<std::map<pid_t, ThreadCpu>> t = ThreadCpuSeconds(manager_->child.pid());
              t.ok() && threads0.ok()) {
            for (const auto& [role, c] : CpuByRole(*threads0, *t)) {
              RoleCpu& sum = out_.view.cpu_by_role[role];
              sum.seconds += c.seconds;
              sum.threads = std::max(sum.threads, c.threads);
              sum.ticks |= c.ticks;
            }
          }
          std::optional<demo::MetricsSnapshot> after = Scrape();
          if (before && after) {
            for (const Series& s : kCounters)
              out_.view.delta[s.key] += Get(*after, s) - Get(*before, s);
            AddCodec(out_.view.delta, *after, 1);
            AddCodec(out_.view.delta, *before, -1);
            AddCost(out_.view.delta, *after, 1);
            AddCost(out_.view.delta, *before, -1);
          }
        }
      }
    }
    if (manager_) {
      phase_name_ = "draining";
      const auto end = Clock::now();
      out_.lease_drain_s = PollUntil(end, 60, [](const demo::MetricsSnapshot& m) {
        return m.Value("orbitkv_ssd_leases_active") == 0 &&
               m.Value("orbitkv_queries_active") == 0 && m.Value("orbitkv_restores_inflight") == 0;
      });
      out_.writeback_drain_s = PollUntil(end, 300, WritebackIdle);
    }
    phase_name_ = "latency probes";
    std::optional<demo::MetricsSnapshot> before_probes;
    if (manager_) before_probes = Scrape();
    gate_->Open(plan.phases.size());
    ORBITKV_RETURN_IF_ERROR(Wait(plan.phases.size()));
    if (std::optional<demo::MetricsSnapshot> m = Scrape()) {
      if (before_probes) {
        AddCost(out_.view.probe_cost, *m, 1);
        AddCost(out_.view.probe_cost, *before_probes, -1);
      }
      for (const Series& s : kCounters) out_.view.end[s.key] = Get(*m, s);
      for (const Series& s : kGauges) out_.view.end[s.key] = Get(*m, s);
      AddCodec(out_.view.end, *m, 1);
    }
    phase_name_ = "done";
    return Status::OK();
  }

  const RouteRunConfig& c_;
  const RouteInfo& info_;
  RouteRunResult out_;
  std::unique_ptr<NaiveStore> naive_;
  std::optional<demo::RunningManager> manager_;
  bool manager_died_ = false;
  std::string manager_binary_, socket_;
  PhaseGate* gate_ = nullptr;
  LiveCounters live_;
  Clock::time_point epoch_;
  std::string phase_name_;
  uint64_t total_requests_ = 0;
};

}  // namespace

Result<RouteRunResult> RunRoute(const RouteRunConfig& config) { return Driver(config).Run(); }

}  // namespace orbitkv::bench
