#include "workload/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace orbitkv::demo {

MetricsSnapshot MetricsSnapshot::Parse(const std::string& text) {
  MetricsSnapshot s;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Series series;
    std::string name;
    size_t pos = line.find_first_of("{ ");
    if (pos == std::string::npos) continue;
    name = line.substr(0, pos);
    if (line[pos] == '{') {
      size_t end = line.find('}', pos);
      if (end == std::string::npos) continue;
      std::string body = line.substr(pos + 1, end - pos - 1);
      size_t i = 0;
      while (i < body.size()) {
        size_t eq = body.find('=', i);
        if (eq == std::string::npos || eq + 1 >= body.size() || body[eq + 1] != '"') break;
        std::string key = body.substr(i, eq - i);
        std::string value;
        size_t j = eq + 2;
        for (; j < body.size() && body[j] != '"'; ++j) {
          if (body[j] == '\\' && j + 1 < body.size()) ++j;
          value.push_back(body[j]);
        }
        series.labels[key] = value;
        i = j + 1;
        if (i < body.size() && body[i] == ',') ++i;
      }
      pos = end + 1;
    }
    series.value = std::strtod(line.c_str() + pos, nullptr);
    s.series_.emplace(name, std::move(series));
  }
  return s;
}

double MetricsSnapshot::Value(const std::string& name,
                              const std::map<std::string, std::string>& labels) const {
  auto [lo, hi] = series_.equal_range(name);
  for (auto it = lo; it != hi; ++it) {
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto l = it->second.labels.find(k);
      if (l == it->second.labels.end() || l->second != v) {
        match = false;
        break;
      }
    }
    if (match) return it->second.value;
  }
  return 0;
}

std::vector<std::string> MetricsSnapshot::LabelValues(const std::string& name,
                                                      const std::string& label) const {
  std::vector<std::string> out;
  auto [lo, hi] = series_.equal_range(name);
  for (auto it = lo; it != hi; ++it) {
    auto l = it->second.labels.find(label);
    if (l != it->second.labels.end()) out.push_back(l->second);
  }
  return out;
}

Result<MetricsSnapshot> ScrapeMetrics(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int e = errno;
    ::close(fd);
    return Status::IOError("connect 127.0.0.1:" + std::to_string(port), e);
  }
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    int e = errno;
    ::close(fd);
    return Status::IOError("send /metrics request", e);
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) {
      ::close(fd);
      return Status::DeadlineExceeded("/metrics did not answer within 5 s");
    }
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Status::IOError("recv /metrics", e);
    }
    if (n == 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (resp.rfind("HTTP/1.", 0) != 0 || resp.find(" 200 ") == std::string::npos ||
      resp.find(" 200 ") > resp.find("\r\n")) {
    return Status::Unavailable("/metrics answered: " + resp.substr(0, resp.find("\r\n")));
  }
  size_t body = resp.find("\r\n\r\n");
  if (body == std::string::npos) return Status::Corruption("/metrics reply has no body");
  return MetricsSnapshot::Parse(resp.substr(body + 4));
}

}  // namespace orbitkv::demo
