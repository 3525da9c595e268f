// orbitkv-cache-manager: the per-host Manager process. Parses flags, sets up
// the SSD store and /metrics, logs its configuration and runs until SIGINT or
// SIGTERM, then shuts down cleanly.
#include <signal.h>

#include <cstdio>
#include <memory>

#include "io/io_engine.h"
#include "orbitkv/logging.h"
#include "orbitkv/metrics.h"
#include "orbitkv/units.h"
#include "server/flags.h"
#include "server/metrics_http.h"
#include "store/ssd_store.h"

namespace orbitkv {
namespace {

int Fail(const Status& st) {
  std::fprintf(stderr, "orbitkv-cache-manager: %s\n", st.ToString().c_str());
  return 1;
}

int Run(int argc, char** argv) {
  std::string help;
  Result<ParsedFlags> parsed = ParseFlags(argc, argv, &help);
  if (!parsed.ok()) {
    std::fprintf(stderr, "orbitkv-cache-manager: %s\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->exit_now) {
    std::fputs(help.c_str(), stdout);
    return 0;
  }
  const ManagerOptions& o = parsed->options;
  if (Status st = InitLogging(o.log_level); !st.ok()) return Fail(st);

  // Block the stop signals before any thread starts, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  MetricsRegistry metrics;
  std::unique_ptr<SsdStore> store;
  if (o.ssd_cache_path.empty()) {
    OKV_LOG_INFO("SSD cache off (no --ssd-cache-path)");
  } else {
    if (o.ssd_backend == SsdBackend::kCufile) {
      return Fail(Status::Unavailable("--ssd-backend cufile: this build has no cuFile support"));
    }
    // Probe io_uring with the opcodes the workers use before touching files.
    Result<std::unique_ptr<IoEngine>> probe = CreateUringEngine({o.ssd_queue_depth, nullptr});
    if (!probe.ok()) return Fail(probe.status().WithContext("io_uring"));
    SsdStoreOptions so;
    so.path = o.ssd_cache_path;
    so.capacity = o.ssd_cache_capacity;
    so.shards = o.ssd_shards;
    so.reserve_capacity = false;  // io_uring: logical sizing, no upfront reservation
    so.metrics = &metrics;
    Result<std::unique_ptr<SsdStore>> opened = SsdStore::Open(so);
    if (!opened.ok()) return Fail(opened.status());
    store = std::move(opened).value();
  }
  std::unique_ptr<MetricsHttpServer> http;
  if (o.metrics_port != 0) {
    Result<std::unique_ptr<MetricsHttpServer>> s =
        MetricsHttpServer::Start(&metrics, o.metrics_port);
    if (!s.ok()) return Fail(s.status().WithContext("--metrics-port"));
    http = std::move(s).value();
  }
  OKV_LOG_INFO(
      "orbitkv-cache-manager ready: pool {} | ssd {} capacity {} in {} shards of {} | backend {} "
      "| read path {} | queue depth {} x {} workers | metrics {}",
      FormatByteSize(o.pool_size), o.ssd_cache_path.empty() ? "off" : o.ssd_cache_path,
      FormatByteSize(o.ssd_cache_capacity), o.ssd_shards,
      store ? FormatByteSize(store->shard_capacity()) : "-",
      !store                               ? "-"
      : o.ssd_backend == SsdBackend::kAuto ? "uring (auto: cuFile is not available in this build)"
                                           : "uring",
      o.ssd_read_path ? SsdReadPathName(*o.ssd_read_path) : "unset", o.ssd_queue_depth,
      o.ssd_io_workers,
      http ? "http://127.0.0.1:" + std::to_string(http->port()) + "/metrics" : "off");

  int sig = 0;
  sigwait(&stop, &sig);
  OKV_LOG_INFO("received {}, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (http) http->Stop();
  store.reset();
  OKV_LOG_INFO("shutdown complete");
  return 0;
}

}  // namespace
}  // namespace orbitkv

int main(int argc, char** argv) { return orbitkv::Run(argc, argv); }
