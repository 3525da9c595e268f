#include "server/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "orbitkv/logging.h"

namespace orbitkv {
namespace {

constexpr char kHost[] = "127.0.0.1";
// Scrapes are small and rare; two workers bound the threads this adds.
constexpr size_t kWorkers = 2;
// Stop waits for workers, and a worker waits this long for a client that has
// connected but not sent its request. Scrapes come from loopback; 1 s is ample.
constexpr time_t kIdleTimeoutSec = 1;

}  // namespace

struct MetricsHttpServer::Impl {
  httplib::Server server;
  std::mutex mu;
  std::thread listener;  // guarded by mu; joinable until Stop

  void Stop() {
    std::lock_guard lock(mu);
    if (!listener.joinable()) return;
    server.stop();
    listener.join();
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl, uint16_t port)
    : impl_(std::move(impl)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() { impl_->Stop(); }

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(MetricsRegistry* registry,
                                                                    uint16_t port) {
  auto impl = std::make_unique<Impl>();
  httplib::Server& svr = impl->server;
  svr.new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  svr.set_read_timeout(kIdleTimeoutSec);
  svr.set_keep_alive_timeout(kIdleTimeoutSec);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind a port
  // that is already serving and silently split the scrapes. SO_REUSEADDR alone
  // still allows a restart while old connections sit in TIME_WAIT.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const std::string content_type(kPrometheusContentType);
  svr.Get("/metrics", [registry, content_type](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheus(), content_type);
  });
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("OrbitKV: Prometheus metrics are at /metrics\n", "text/plain; charset=utf-8");
  });
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content("not found; metrics are at /metrics\n", "text/plain; charset=utf-8");
    }
  });

  int bound = port == 0 ? svr.bind_to_any_port(kHost) : (svr.bind_to_port(kHost, port) ? port : -1);
  if (bound <= 0) {
    return Status::Unavailable("metrics HTTP server cannot listen on " + std::string(kHost) + ":" +
                               std::to_string(port) + " (port in use or not permitted)");
  }

  try {
    impl->listener = std::thread([&svr] { svr.listen_after_bind(); });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted(std::string("metrics HTTP server: cannot start thread: ") +
                                     e.what());
  }
  // Server::stop() is a no-op until the listener has marked itself running, so
  // a Stop() right after Start() would hang in join. Wait for it here.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!svr.is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      impl->Stop();
      return Status::Internal("metrics HTTP server on port " + std::to_string(bound) +
                              " did not start listening");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  OKV_LOG_INFO("metrics: serving http://{}:{}/metrics", kHost, bound);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(impl), static_cast<uint16_t>(bound)));
}

}  // namespace orbitkv
