#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace orbitkv {
namespace {

// Connects to 127.0.0.1:port; -1 with errno set on failure.
int Connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{5, 0};  // a hung server fails the test instead of hanging it
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Sends `request` and reads until the server closes; the raw response.
std::string Fetch(uint16_t port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) {
    ADD_FAILURE() << "connect to port " << port << ": " << strerror(errno);
    return "";
  }
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ADD_FAILURE() << "recv: " << strerror(errno);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

std::string StatusLine(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

std::string Body(const std::string& response) {
  size_t pos = response.find("\r\n\r\n");
  return pos == std::string::npos ? "" : response.substr(pos + 4);
}

TEST(MetricsHttpTest, ServesMetrics) {
  MetricsRegistry reg;
  reg.GetCounter("okv_requests_total", "Requests.", {{"op", "get"}})->Inc(42);
  auto server = MetricsHttpServer::Start(&reg, 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uint16_t port = (*server)->port();
  ASSERT_NE(port, 0);

  std::string response = Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_NE(StatusLine(response).find(" 200 "), std::string::npos) << response;
  EXPECT_NE(response.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << response;
  EXPECT_EQ(Body(response), reg.RenderPrometheus());
  EXPECT_NE(Body(response).find("okv_requests_total{op=\"get\"} 42\n"), std::string::npos)
      << response;

  // Scrapes see live values.
  reg.GetCounter("okv_requests_total", "Requests.", {{"op", "get"}})->Inc();
  EXPECT_NE(
      Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n").find("okv_requests_total{op=\"get\"} 43\n"),
      std::string::npos);
}

TEST(MetricsHttpTest, RootPointsAtMetricsAndOtherPathsAre404) {
  MetricsRegistry reg;
  auto server = MetricsHttpServer::Start(&reg, 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uint16_t port = (*server)->port();

  std::string root = Fetch(port, "GET / HTTP/1.0\r\n\r\n");
  EXPECT_NE(StatusLine(root).find(" 200 "), std::string::npos) << root;
  EXPECT_NE(Body(root).find("/metrics"), std::string::npos) << root;

  for (const char* path : {"/nope", "/metrics/extra", "/metricsx"}) {
    std::string r = Fetch(port, std::string("GET ") + path + " HTTP/1.0\r\n\r\n");
    EXPECT_NE(StatusLine(r).find(" 404 "), std::string::npos) << path << ": " << r;
  }
}

TEST(MetricsHttpTest, ConcurrentScrapes) {
  MetricsRegistry reg;
  reg.GetGauge("okv_g", "G.")->Set(5);
  auto server = MetricsHttpServer::Start(&reg, 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uint16_t port = (*server)->port();
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([port] {
      for (int j = 0; j < 5; ++j) {
        EXPECT_NE(Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n").find("okv_g 5\n"),
                  std::string::npos);
      }
    });
  }
  for (auto& c : clients) c.join();
}

TEST(MetricsHttpTest, StopClosesThePort) {
  MetricsRegistry reg;
  auto server = MetricsHttpServer::Start(&reg, 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uint16_t port = (*server)->port();
  int fd = Connect(port);
  ASSERT_GE(fd, 0) << strerror(errno);
  close(fd);

  (*server)->Stop();
  fd = Connect(port);
  EXPECT_LT(fd, 0) << "connect after Stop succeeded";
  if (fd >= 0) close(fd);
  (*server)->Stop();  // idempotent; the destructor stops again
}

TEST(MetricsHttpTest, StopIsPromptWithAnIdleClient) {
  MetricsRegistry reg;
  auto server = MetricsHttpServer::Start(&reg, 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  int idle = Connect((*server)->port());  // connects, never sends a request
  ASSERT_GE(idle, 0) << strerror(errno);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let a worker pick it up
  auto t0 = std::chrono::steady_clock::now();
  (*server)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  close(idle);
}

TEST(MetricsHttpTest, StopRightAfterStartDoesNotHang) {
  MetricsRegistry reg;
  for (int i = 0; i < 20; ++i) {
    auto server = MetricsHttpServer::Start(&reg, 0);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
  }
}

TEST(MetricsHttpTest, BusyPortIsUnavailableAndNamed) {
  MetricsRegistry reg;
  auto first = MetricsHttpServer::Start(&reg, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  uint16_t port = (*first)->port();
  auto second = MetricsHttpServer::Start(&reg, port);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(std::to_string(port)), std::string::npos)
      << second.status().ToString();

  // Once the first one stops, the port can be bound again.
  (*first)->Stop();
  auto third = MetricsHttpServer::Start(&reg, port);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ((*third)->port(), port);
  EXPECT_NE(Fetch(port, "GET / HTTP/1.0\r\n\r\n").find(" 200 "), std::string::npos);
}

}  // namespace
}  // namespace orbitkv
