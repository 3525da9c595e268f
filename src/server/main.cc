// orbitkv-cache-manager: the per-host Manager process. Parses flags, starts the
// Manager (DRAM pool, SSD store, lanes), the engine socket and /metrics, logs
// its configuration and runs until SIGINT or SIGTERM, then shuts down cleanly:
// the socket stops accepting, sessions close (releasing what they held), the
// lanes drain.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "gpu/host_memory_hooks.h"
#include "gpu/platform_default.h"
#ifdef ORBITKV_TEST_HOOKS
#include "gpu/fault_injecting_platform.h"
#endif
#include "manager/manager.h"
#include "orbitkv/client.h"
#include "orbitkv/logging.h"
#include "orbitkv/metrics.h"
#include "orbitkv/units.h"
#include "protocol/server.h"
#include "server/flags.h"
#include "server/metrics_http.h"
#include "server/service.h"

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
  ManagerOptions o = parsed->options;
  if (Status st = InitLogging(o.log_level); !st.ok()) return Fail(st);
  if (o.socket_path.empty()) {
    // The default socket lives where only this user can create files: a
    // squatter of another uid cannot take the path first.
    const std::string dir = DefaultSocketDirectory();
    const bool ours = std::getenv("XDG_RUNTIME_DIR") == nullptr || !*std::getenv("XDG_RUNTIME_DIR");
    if (Status st = protocol::EnsurePrivateDirectory(dir, ours); !st.ok()) {
      return Fail(st.WithContext("default --socket"));
    }
    o.socket_path = DefaultSocketPath();
  }

  // Block the stop signals before any thread starts, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Each engine connection and each host region it registers holds a
  // descriptor: use what the hard limit allows (bounded: nothing here scans
  // the descriptor table).
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    const rlim_t want = std::min<rlim_t>(nofile.rlim_max, 1 << 16);
    if (nofile.rlim_cur < want) {
      nofile.rlim_cur = want;
      if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
        OKV_LOG_WARN("cannot raise RLIMIT_NOFILE to {}: {}", want, std::strerror(errno));
      }
    }
  }

  MetricsRegistry metrics;
  ManagerConfig config;
  config.options = o;
  config.metrics = &metrics;
  HostMemoryHooks gpu = GetHostMemoryHooks();
  config.register_host_memory = gpu.register_memory;
  config.unregister_host_memory = gpu.unregister_memory;
  // CUDA devices and cuFile for "cuda:N" instances and the SSD backend
  // selection; outlives the Manager.
  std::string no_gpu;
  std::unique_ptr<gpu::Platform> platform = gpu::CreateDefaultPlatform(&no_gpu);
  config.gpu = platform.get();
#ifdef ORBITKV_TEST_HOOKS
  // orbitkv-cache-manager-faults only (never the shipped binary): cuFile
  // faults for process-level gates, from the environment.
  std::unique_ptr<gpu::FaultInjectingPlatform> faults;
  if (platform) {
    faults = std::make_unique<gpu::FaultInjectingPlatform>(platform.get());
    if (const char* n = std::getenv("ORBITKV_TEST_FAIL_CUFILE_READS")) {
      faults->FailReads(std::atoi(n), gpu::FaultInjectingPlatform::IoFault::kError);
      OKV_LOG_WARN("test hooks: the next {} cuFile reads fail with EIO", std::atoi(n));
    }
    config.gpu = faults.get();
  }
#endif
  if (!platform) config.gpu_unavailable = no_gpu;
  Result<std::unique_ptr<Manager>> manager = Manager::Create(config);
  if (!manager.ok()) return Fail(manager.status());
  ManagerService service(manager->get(), &metrics);
  protocol::ServerOptions so = parsed->server;
  so.path = o.socket_path;
  Result<std::unique_ptr<protocol::SocketServer>> server =
      protocol::SocketServer::Start(so, &service);
  if (!server.ok()) return Fail(server.status().WithContext("--socket " + o.socket_path));
  // The socket's state on /metrics, read at scrape time.
  protocol::SocketServer* srv = server->get();
  const uint64_t collector = metrics.AddCollector([srv](MetricWriter& w) {
    const protocol::ServerStats st = srv->Stats();
    w.Family("orbitkv_protocol_connections", "Engine connections open.", "gauge");
    w.Sample("orbitkv_protocol_connections", {}, static_cast<double>(st.active));
    w.Family("orbitkv_protocol_buffered_bytes",
             "Bytes of protocol messages buffered (<= --max-request-buffer).", "gauge");
    w.Sample("orbitkv_protocol_buffered_bytes", {}, static_cast<double>(st.buffered_bytes));
    w.Family("orbitkv_protocol_waiting_connections",
             "Connections whose next message waits for buffer room.", "gauge");
    w.Sample("orbitkv_protocol_waiting_connections", {},
             static_cast<double>(st.waiting_for_buffer));
    w.Family("orbitkv_protocol_refused_total",
             "Connections refused or closed with a reason, by reason.", "counter");
    w.Sample("orbitkv_protocol_refused_total", {{"reason", "peer_uid"}},
             static_cast<double>(st.rejected_peer));
    w.Sample("orbitkv_protocol_refused_total", {{"reason", "connection_limit"}},
             static_cast<double>(st.rejected_full));
    w.Sample("orbitkv_protocol_refused_total", {{"reason", "frame_limit"}},
             static_cast<double>(st.rejected_frame));
    w.Sample("orbitkv_protocol_refused_total", {{"reason", "timeout"}},
             static_cast<double>(st.closed_timeout));
    w.Family("orbitkv_protocol_frames_polled_total",
             "Requests the socket loop read while polling after activity (--protocol-spin-us), "
             "without a wake of its thread.",
             "counter");
    w.Sample("orbitkv_protocol_frames_polled_total", {}, static_cast<double>(st.frames_polled));
  });
  std::unique_ptr<MetricsHttpServer> http;
  if (o.metrics_port != 0) {
    Result<std::unique_ptr<MetricsHttpServer>> s =
        MetricsHttpServer::Start(&metrics, o.metrics_port);
    if (!s.ok()) return Fail(s.status().WithContext("--metrics-port"));
    http = std::move(s).value();
  }
  const bool ssd = !o.ssd_cache_path.empty();
  OKV_LOG_INFO(
      "orbitkv-cache-manager ready: pool {} ({}) | GPU {} | ssd {} capacity {} in {} shards | "
      "backend {} | "
      "read path {} | queue depth {} x {} workers, read staging {} in runs of {} | socket {} | "
      "metrics {}",
      FormatByteSize(o.pool_size), gpu.description,
      platform ? platform->Describe() : "none (" + no_gpu + "; host instances only)",
      ssd ? o.ssd_cache_path : "off", FormatByteSize(o.ssd_cache_capacity), o.ssd_shards,
      ssd ? (*manager)->ssd_backend() : "-",
      o.ssd_read_path ? SsdReadPathName(*o.ssd_read_path) : "unset", o.ssd_queue_depth,
      o.ssd_io_workers, ssd ? FormatByteSize(o.ReadStagingBytes()) : "-",
      FormatByteSize(o.ssd_read_run), o.socket_path,
      http ? "http://127.0.0.1:" + std::to_string(http->port()) + "/metrics" : "off");

  int sig = 0;
  sigwait(&stop, &sig);
  OKV_LOG_INFO("received {}, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (http) http->Stop();
  metrics.RemoveCollector(collector);
  (*server)->Stop();
  manager->reset();
  OKV_LOG_INFO("shutdown complete");
  return 0;
}

}  // namespace
}  // namespace orbitkv

int main(int argc, char** argv) { return orbitkv::Run(argc, argv); }
