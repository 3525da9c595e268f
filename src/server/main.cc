// orbitkv-cache-manager: the per-host Manager process. Parses flags, starts the
// Manager (DRAM pool, SSD store, lanes), the engine socket and /metrics, logs
// its configuration and runs until SIGINT or SIGTERM, then shuts down cleanly:
// the socket stops accepting, sessions close (releasing what they held), the
// lanes drain.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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
  if (o.socket_path.empty()) o.socket_path = DefaultSocketPath();
  if (Status st = InitLogging(o.log_level); !st.ok()) return Fail(st);

  // Block the stop signals before any thread starts, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  MetricsRegistry metrics;
  ManagerConfig config;
  config.options = o;
  config.metrics = &metrics;
  config.admission = o.admission_reuse ? AdmissionPolicy::kReuse : AdmissionPolicy::kAll;
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
  protocol::ServerOptions so;
  so.path = o.socket_path;
  Result<std::unique_ptr<protocol::SocketServer>> server =
      protocol::SocketServer::Start(so, &service);
  if (!server.ok()) return Fail(server.status().WithContext("--socket " + o.socket_path));
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
      "read path {} | queue depth {} x {} workers | socket {} | metrics {}",
      FormatByteSize(o.pool_size), gpu.description,
      platform ? platform->Describe() : "none (" + no_gpu + "; host instances only)",
      ssd ? o.ssd_cache_path : "off", FormatByteSize(o.ssd_cache_capacity), o.ssd_shards,
      ssd ? (*manager)->ssd_backend() : "-",
      o.ssd_read_path ? SsdReadPathName(*o.ssd_read_path) : "unset", o.ssd_queue_depth,
      o.ssd_io_workers, o.socket_path,
      http ? "http://127.0.0.1:" + std::to_string(http->port()) + "/metrics" : "off");

  int sig = 0;
  sigwait(&stop, &sig);
  OKV_LOG_INFO("received {}, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Stop();
  if (http) http->Stop();
  manager->reset();
  OKV_LOG_INFO("shutdown complete");
  return 0;
}

}  // namespace
}  // namespace orbitkv

int main(int argc, char** argv) { return orbitkv::Run(argc, argv); }
