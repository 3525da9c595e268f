#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_name.h"
#include "common/unique_fd.h"
#include "orbitkv/logging.h"

namespace orbitkv {

// ---- request-line parser ----------------------------------------------------

namespace {

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  constexpr std::string_view kPunct = "!#$%&'*+-.^_`|~";
  return kPunct.find(c) != std::string_view::npos;
}

// Visible US-ASCII: no space, no controls, no DEL, no bytes >= 0x80.
bool IsVisibleAscii(char c) {
  auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f;
}

}  // namespace

Result<HttpRequestHead> ParseHttpRequestHead(std::string_view head) {
  const size_t eol = head.find("\r\n");
  if (eol == std::string_view::npos) return Status::InvalidArgument("request line has no CRLF");
  const std::string_view line = head.substr(0, eol);

  const size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return Status::InvalidArgument("request line has no spaces");
  const std::string_view method = line.substr(0, sp1);
  if (method.empty()) return Status::InvalidArgument("empty method");
  if (!std::all_of(method.begin(), method.end(), IsTokenChar)) {
    return Status::InvalidArgument("method is not a token");
  }

  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) {
    return Status::InvalidArgument("request line has no HTTP version");
  }
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (target.empty()) return Status::InvalidArgument("empty request target");
  if (target.front() != '/') return Status::InvalidArgument("request target is not origin-form");
  if (!std::all_of(target.begin(), target.end(), IsVisibleAscii)) {
    return Status::InvalidArgument("request target has a space, control or non-ASCII byte");
  }

  // Exactly "HTTP/1.<digit>": no trailing spaces, nothing after.
  const std::string_view version = line.substr(sp2 + 1);
  constexpr std::string_view kPrefix = "HTTP/1.";
  if (version.size() != kPrefix.size() + 1 || version.substr(0, kPrefix.size()) != kPrefix ||
      version.back() < '0' || version.back() > '9') {
    return Status::InvalidArgument("HTTP version is not HTTP/1.x");
  }

  HttpRequestHead req;
  req.method.assign(method);
  req.path.assign(target.substr(0, target.find('?')));
  req.minor_version = version.back() - '0';
  return req;
}

// ---- server -------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHost[] = "127.0.0.1";
constexpr int kBacklog = 16;
// The whole request head must arrive within this. Scrapes come from loopback;
// 1 s is ample.
constexpr auto kReadTimeout = std::chrono::seconds(1);
// The whole response must be taken by the client within this.
constexpr auto kWriteTimeout = std::chrono::seconds(1);
// After the response, the server half-closes and reads (and drops) what the
// client still sends, until it closes, for at most this long and kMaxDrain
// bytes. Closing with unread bytes in the receive queue sends an RST, which
// can make the client discard the response before reading it (e.g. the 431
// for an oversized head, or a request with a body).
constexpr auto kLingerTimeout = std::chrono::milliseconds(500);
constexpr size_t kMaxDrain = 64 * 1024;
// Connections served at once (each on its own thread, each for at most about
// 2.5 s); more get a 503 at once.
constexpr size_t kMaxConcurrentConnections = 64;
// How long to back off when accept fails for lack of resources (EMFILE...).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

constexpr std::string_view kTextContentType = "text/plain; charset=utf-8";

enum class Wait { kReady, kTimeout, kStopped, kError };

// Waits until `fd` has one of `events`, `wake_fd` is readable (Stop), or
// `deadline` passes. A socket error or hangup counts as ready: the next
// recv/send reports it.
Wait WaitFor(int fd, short events, int wake_fd, Clock::time_point deadline) {
  for (;;) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return Wait::kTimeout;
    // Round up so we never spin on a 0 ms timeout just before the deadline.
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    pollfd fds[2] = {{wake_fd, POLLIN, 0}, {fd, events, 0}};
    const int r = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 60'000)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Wait::kError;
    }
    if (fds[0].revents != 0) return Wait::kStopped;
    if (fds[1].revents != 0) return Wait::kReady;
  }
}

enum class ReadHead { kComplete, kTooLarge, kLineTooLarge, kTimeout, kClosed, kStopped, kError };

// Reads until the end of the request head ("\r\n\r\n"), at most
// kMaxHttpRequestHead bytes. On kComplete, `buf` holds the head (bytes after
// it that arrived in the same read may follow; they are ignored).
ReadHead ReadRequestHead(int fd, int wake_fd, Clock::time_point deadline, std::string* buf) {
  char chunk[kMaxHttpRequestHead];
  for (;;) {
    switch (WaitFor(fd, POLLIN, wake_fd, deadline)) {
      case Wait::kReady:
        break;
      case Wait::kTimeout:
        return ReadHead::kTimeout;
      case Wait::kStopped:
        return ReadHead::kStopped;
      case Wait::kError:
        return ReadHead::kError;
    }
    const size_t room = kMaxHttpRequestHead - buf->size();  // > 0: checked below
    const ssize_t n = ::recv(fd, chunk, room, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return ReadHead::kError;
    }
    if (n == 0) return ReadHead::kClosed;
    // The terminator may straddle the previous read.
    const size_t from = buf->size() >= 3 ? buf->size() - 3 : 0;
    buf->append(chunk, static_cast<size_t>(n));
    if (buf->find("\r\n\r\n", from) != std::string::npos) return ReadHead::kComplete;
    if (buf->size() >= kMaxHttpRequestHead) {
      return buf->find("\r\n") != std::string::npos ? ReadHead::kTooLarge : ReadHead::kLineTooLarge;
    }
  }
}

// Sends all of `data` by `deadline`. False on error, timeout or Stop.
bool WriteAll(int fd, int wake_fd, Clock::time_point deadline, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (WaitFor(fd, POLLOUT, wake_fd, deadline) != Wait::kReady) return false;
  }
  return true;
}

// Half-closes, then reads and drops what the client still sends until it
// closes, kMaxDrain bytes, kLingerTimeout or Stop, whichever comes first.
void LingeringClose(int fd, int wake_fd) {
  if (::shutdown(fd, SHUT_WR) != 0) return;
  const auto deadline = Clock::now() + kLingerTimeout;
  char sink[4096];
  size_t drained = 0;
  while (drained < kMaxDrain) {
    if (WaitFor(fd, POLLIN, wake_fd, deadline) != Wait::kReady) return;
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return;
    drained += static_cast<size_t>(n);
  }
}

std::string_view ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    default:
      return "Unknown";
  }
}

struct Response {
  int code = 500;
  std::string_view content_type = kTextContentType;
  std::string body;
  bool allow_header = false;  // 405: "Allow: GET, HEAD"
};

// Status line, headers and (unless `head_only`) the body.
std::string Serialize(const Response& r, bool head_only) {
  std::string out;
  out.reserve(160 + (head_only ? 0 : r.body.size()));
  out.append("HTTP/1.1 ").append(std::to_string(r.code)).append(" ");
  out.append(ReasonPhrase(r.code)).append("\r\n");
  out.append("Content-Type: ").append(r.content_type).append("\r\n");
  out.append("Content-Length: ").append(std::to_string(r.body.size())).append("\r\n");
  if (r.allow_header) out.append("Allow: GET, HEAD\r\n");
  out.append("Cache-Control: no-store\r\n");
  out.append("Connection: close\r\n\r\n");
  if (!head_only) out.append(r.body);
  return out;
}

Response Error(int code, std::string_view text) {
  Response r;
  r.code = code;
  r.body.assign(text).append("\n");
  return r;
}

// Maps a parsed request to its response. `head_only` is set for HEAD.
Response Route(const HttpRequestHead& req, MetricsRegistry* registry, bool* head_only) {
  *head_only = req.method == "HEAD";
  if (req.method != "GET" && !*head_only) {
    Response r = Error(405, "method not allowed; use GET /metrics");
    r.allow_header = true;
    return r;
  }
  if (req.path == "/metrics") {
    Response r;
    r.code = 200;
    r.content_type = kPrometheusContentType;
    // HEAD renders too, so that its Content-Length is the one GET would send.
    r.body = registry->RenderPrometheus();
    return r;
  }
  if (req.path == "/") {
    Response r;
    r.code = 200;
    r.body = "OrbitKV: Prometheus metrics are at /metrics\n";
    return r;
  }
  return Error(404, "not found; metrics are at /metrics");
}

}  // namespace

struct MetricsHttpServer::Impl {
  MetricsRegistry* registry = nullptr;
  UniqueFd listen_fd;
  UniqueFd wake_fd;  // eventfd; written once by Stop and never drained
  std::mutex mu;
  std::thread listener;  // guarded by mu; joinable until Stop
  Clock::time_point last_accept_warning{};

  // Connection threads (listener thread only, and Stop after joining it).
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Worker> workers;

  ~Impl() { Stop(); }

  void JoinFinished(bool all) {
    for (auto it = workers.begin(); it != workers.end();) {
      if (all || it->done->load(std::memory_order_acquire)) {
        it->thread.join();
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Serves `conn` on a thread of its own, so that a slow or idle client
  // holds only its own thread (for at most the read + write timeouts).
  void Dispatch(UniqueFd conn) {
    JoinFinished(false);
    if (workers.size() >= kMaxConcurrentConnections) {
      static constexpr std::string_view kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      ::send(conn.get(), kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      return;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    try {
      std::thread t([this, done, fd = std::move(conn)]() mutable {
        SetThreadName("okv-metrics-rq");
        ServeConnection(fd.get());
        fd.Reset();
        done->store(true, std::memory_order_release);
      });
      workers.push_back({std::move(t), std::move(done)});
    } catch (const std::system_error& e) {
      WarnAccept("thread", e.code().value());
    }
  }

  void Stop() {
    std::lock_guard lock(mu);
    if (listener.joinable()) {
      const uint64_t one = 1;
      ssize_t n;
      do {
        n = ::write(wake_fd.get(), &one, sizeof(one));
      } while (n < 0 && errno == EINTR);
      // An eventfd write fails only on counter overflow, i.e. it is already
      // readable; the listener wakes either way.
      listener.join();
      JoinFinished(true);  // Stop woke them all
    }
    listen_fd.Reset();
    wake_fd.Reset();
  }

  // The listener thread.
  void Run() {
    SetThreadName("okv-metrics");
    for (;;) {
      pollfd fds[2] = {{wake_fd.get(), POLLIN, 0}, {listen_fd.get(), POLLIN, 0}};
      const int r = ::poll(fds, 2, -1);
      if (r < 0) {
        if (errno == EINTR) continue;
        WarnAccept("poll", errno);
        if (Backoff()) return;
        continue;
      }
      if (fds[0].revents != 0) return;
      if (fds[1].revents == 0) continue;
      UniqueFd conn(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (conn.get() < 0) {
        const int err = errno;
        switch (err) {
          // Nothing to accept after all, or the connection died in the queue.
          case EINTR:
          case EAGAIN:
          case ECONNABORTED:
          case EPROTO:
          case ENETDOWN:
          case ENOPROTOOPT:
          case EHOSTDOWN:
          case ENONET:
          case EHOSTUNREACH:
          case EOPNOTSUPP:
          case ENETUNREACH:
            continue;
          default:
            // EMFILE, ENFILE, ENOBUFS, ENOMEM...: the connection stays queued;
            // back off instead of spinning on a listen socket that stays readable.
            WarnAccept("accept", err);
            if (Backoff()) return;
            continue;
        }
      }
      Dispatch(std::move(conn));
    }
  }

  // Waits kAcceptBackoff; true when Stop was called meanwhile.
  bool Backoff() {
    const Wait w = WaitFor(wake_fd.get(), POLLIN, wake_fd.get(), Clock::now() + kAcceptBackoff);
    if (w == Wait::kError) std::this_thread::sleep_for(kAcceptBackoff);
    return w == Wait::kStopped;
  }

  void WarnAccept(const char* what, int err) {
    const auto now = Clock::now();
    if (last_accept_warning != Clock::time_point{} &&
        now - last_accept_warning < std::chrono::seconds(10)) {
      return;
    }
    last_accept_warning = now;
    OKV_LOG_WARN("metrics HTTP server: {} failed: {} (errno {})", what, std::strerror(err), err);
  }

  // Reads one request, answers it and closes. Never throws.
  void ServeConnection(int fd) {
    const int wake = wake_fd.get();
    try {
      const int yes = 1;
      // One send per response, then FIN: no reason to wait for Nagle.
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));

      std::string buf;
      Response resp;
      bool head_only = false;
      switch (ReadRequestHead(fd, wake, Clock::now() + kReadTimeout, &buf)) {
        case ReadHead::kComplete: {
          Result<HttpRequestHead> req = ParseHttpRequestHead(buf);
          if (!req.ok()) {
            OKV_LOG_DEBUG("metrics HTTP: bad request: {}", req.status().message());
            resp = Error(400, "bad request: " + std::string(req.status().message()));
          } else {
            resp = Route(*req, registry, &head_only);
          }
          break;
        }
        case ReadHead::kTooLarge:
          resp = Error(431, "request head is over 8 KiB");
          break;
        case ReadHead::kLineTooLarge:
          resp = Error(400, "request line is over 8 KiB");
          break;
        case ReadHead::kTimeout:
          // Nothing at all: a probe or an idle client; just close.
          if (buf.empty()) return;
          resp = Error(408, "request head not received in time");
          break;
        case ReadHead::kClosed:
          if (buf.empty()) return;
          resp = Error(400, "connection closed before the end of the request head");
          break;
        case ReadHead::kStopped:
        case ReadHead::kError:
          return;
      }
      if (!WriteAll(fd, wake, Clock::now() + kWriteTimeout, Serialize(resp, head_only))) return;
      LingeringClose(fd, wake);
    } catch (const std::exception& e) {
      // bad_alloc while rendering, say; the connection is dropped, not the process.
      OKV_LOG_WARN("metrics HTTP server: dropping a connection: {}", e.what());
    } catch (...) {
      OKV_LOG_WARN("metrics HTTP server: dropping a connection: unknown exception");
    }
  }
};

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl, uint16_t port)
    : impl_(std::move(impl)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() { impl_->Stop(); }

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(MetricsRegistry* registry,
                                                                    uint16_t port) {
  auto impl = std::make_unique<Impl>();
  impl->registry = registry;
  const auto unavailable = [port](std::string_view what, int err) {
    return Status::Unavailable("metrics HTTP server cannot listen on " + std::string(kHost) + ":" +
                               std::to_string(port) + ": " + std::string(what) + ": " +
                               std::strerror(err) + " (port in use or not permitted?)");
  };

  impl->listen_fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (impl->listen_fd.get() < 0) return unavailable("socket", errno);
  const int fd = impl->listen_fd.get();
  // SO_REUSEADDR allows a restart while old connections sit in TIME_WAIT, but
  // (unlike SO_REUSEPORT) not a second server on a port that is serving.
  const int yes = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes)) != 0) {
    return unavailable("setsockopt(SO_REUSEADDR)", errno);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return unavailable("bind", errno);
  }
  if (::listen(fd, kBacklog) != 0) return unavailable("listen", errno);
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return unavailable("getsockname", errno);
  }
  const uint16_t bound = ntohs(addr.sin_port);

  impl->wake_fd = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (impl->wake_fd.get() < 0) return Status::IOError("metrics HTTP server: eventfd", errno);

  // The socket is listening, so connections queue from here on; the thread
  // need not be running yet, and a Stop before it runs still wakes it (the
  // eventfd stays readable).
  try {
    impl->listener = std::thread([p = impl.get()] { p->Run(); });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted(std::string("metrics HTTP server: cannot start thread: ") +
                                     e.what());
  }
  OKV_LOG_INFO("metrics: serving http://{}:{}/metrics", kHost, bound);
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl), bound));
}

}  // namespace orbitkv
