// MetricsHttpServer: serves GET /metrics (Prometheus text 0.0.4) from a
// MetricsRegistry on 127.0.0.1 only, from its own listener thread (cpp-httplib).
// The registry is borrowed and must outlive the server. All methods are
// thread-safe; Stop is idempotent and the destructor calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "orbitkv/metrics.h"
#include "orbitkv/status.h"

namespace orbitkv {

inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

class MetricsHttpServer {
 public:
  // Binds 127.0.0.1:port (0 picks an ephemeral port) and starts serving before
  // it returns. Unavailable, naming the port, when the port cannot be bound.
  // REQUIRES: registry != nullptr.
  static Result<std::unique_ptr<MetricsHttpServer>> Start(MetricsRegistry* registry, uint16_t port);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the ephemeral one when Start was given 0).
  uint16_t port() const { return port_; }
  // Closes the listening socket and joins the listener thread; requests in
  // flight finish first (a client that connected but sent nothing delays it by
  // up to 1 s).
  void Stop();

 private:
  struct Impl;
  MetricsHttpServer(std::unique_ptr<Impl> impl, uint16_t port);

  std::unique_ptr<Impl> impl_;
  const uint16_t port_;
};

}  // namespace orbitkv
