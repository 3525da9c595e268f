// MetricsHttpServer: serves GET /metrics (Prometheus text 0.0.4) from a
// MetricsRegistry on 127.0.0.1 only. Plain POSIX sockets, no HTTP library: one
// listener thread polls the listening socket and a stop eventfd and hands each
// connection to a thread of its own (at most 64 at once; more get a 503), one
// request per connection, so idle or slow clients never delay a scrape.
// The registry is borrowed and must outlive the server. All methods are
// thread-safe; Stop is idempotent and the destructor calls it.
//
// Per connection: the request head (request line + headers) must arrive within
// 1 s and fit in 8 KiB; only the request line is interpreted. The response is
// always `Connection: close`, and must be written within 1 s. So a client that
// misbehaves (sends nothing, sends garbage, never reads) holds its thread for
// at most about 2.5 s, and Stop interrupts it at once.
//
//   GET|HEAD /metrics[?...]  200, the registry's Prometheus text
//   GET|HEAD /               200, a short note pointing at /metrics
//   GET|HEAD other paths     404
//   other methods            405 (Allow: GET, HEAD)
//   malformed request line   400
//   head over 8 KiB          431 (400 when not even the request line fits)
//   head incomplete at 1 s   408 (the connection is just closed if nothing came)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "orbitkv/metrics.h"
#include "orbitkv/status.h"

namespace orbitkv {

inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// The most bytes of request head (through the blank line) the server reads.
inline constexpr size_t kMaxHttpRequestHead = 8 * 1024;

// The request line of an HTTP/1.x request.
struct HttpRequestHead {
  std::string method;     // as sent; methods are case-sensitive ("GET", "HEAD")
  std::string path;       // origin-form target without its query: "/metrics"
  int minor_version = 1;  // HTTP/1.<minor_version>
};

// Parses the request line at the start of `head`: METHOD SP TARGET SP
// HTTP/1.<digit> CRLF. What follows the CRLF (headers, body) is ignored.
// METHOD is an RFC 9110 token; TARGET is origin-form ("/" then visible ASCII,
// no spaces or controls), and a query ("?...") is dropped from `path`.
// InvalidArgument, saying what is wrong, for anything else, including a
// missing CRLF, absolute-form or "*" targets, other versions and extra spaces.
// Pure and total: safe on any bytes (it is fuzzed in the tests).
Result<HttpRequestHead> ParseHttpRequestHead(std::string_view head);

class MetricsHttpServer {
 public:
  // Binds 127.0.0.1:port (0 picks an ephemeral port; SO_REUSEADDR, never
  // SO_REUSEPORT) and is accepting connections before it returns. Unavailable,
  // naming the port, when the port cannot be bound or listened on.
  // REQUIRES: registry != nullptr.
  static Result<std::unique_ptr<MetricsHttpServer>> Start(MetricsRegistry* registry, uint16_t port);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port (the ephemeral one when Start was given 0).
  uint16_t port() const { return port_; }
  // Wakes and joins the listener thread, then closes the listening socket;
  // once it returns, connecting to port() fails. A connection being served is
  // abandoned at its next wait (a render in progress finishes first), so Stop
  // does not wait for slow clients. Idempotent.
  void Stop();

 private:
  struct Impl;
  MetricsHttpServer(std::unique_ptr<Impl> impl, uint16_t port);

  std::unique_ptr<Impl> impl_;
  const uint16_t port_;
};

}  // namespace orbitkv
