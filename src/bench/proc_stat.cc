#include "bench/proc_stat.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace orbitkv::bench {
namespace {
unsigned char uc(char c) { return static_cast<unsigned char>(c); }
}  // namespace

Result<double> ParseProcStatCpuSeconds(const std::string& stat, long ticks) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
  // fields are counted from the last ')'. utime and stime are fields 14, 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || ticks <= 0)
    return Status::Corruption("unreadable /proc stat line");
  std::istringstream in(stat.substr(close + 1));
  std::string field;
  double utime = -1, stime = -1;
  for (int i = 3; in >> field; ++i) {
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) {
      stime = std::strtod(field.c_str(), nullptr);
      break;
    }
  }
  if (utime < 0 || stime < 0) return Status::Corruption("/proc stat line too short");
  return (utime + stime) / double(ticks);
}

Result<double> ProcessCpuSeconds(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream f(path);
  if (!f) return Status::NotFound("cannot read " + path);
  std::string line;
  std::getline(f, line);
  return ParseProcStatCpuSeconds(line, ::sysconf(_SC_CLK_TCK));
}

std::string ParseProcStatComm(const std::string& stat) {
  const size_t open = stat.find('(');
  const size_t close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close <= open) return {};
  return stat.substr(open + 1, close - open - 1);
}

Result<uint64_t> ParseSchedstatRunNs(const std::string& schedstat) {
  std::istringstream in(schedstat);
  std::string field;
  if (!(in >> field) || field.empty() ||
      !std::all_of(field.begin(), field.end(), [](char c) { return std::isdigit(uc(c)); })) {
    return Status::Corruption("unreadable schedstat line");
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

Result<std::map<pid_t, ThreadCpu>> ThreadCpuSeconds(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::NotFound("cannot list " + dir);
  const long ticks = ::sysconf(_SC_CLK_TCK);
  std::map<pid_t, ThreadCpu> out;
  while (const dirent* e = ::readdir(d)) {
    if (!std::isdigit(uc(e->d_name[0]))) continue;
    std::ifstream f(dir + "/" + e->d_name + "/stat");
    std::string line;
    if (!f || !std::getline(f, line)) continue;  // the thread ended meanwhile
    Result<double> s = ParseProcStatCpuSeconds(line, ticks);
    if (!s.ok()) continue;
    ThreadCpu t{ParseProcStatComm(line), *s, /*ticks=*/true};
    std::ifstream sf(dir + "/" + e->d_name + "/schedstat");
    std::string sched;
    if (sf && std::getline(sf, sched)) {
      // 0 with ticks counted: a kernel that does not keep it.
      if (Result<uint64_t> ns = ParseSchedstatRunNs(sched); ns.ok() && (*ns > 0 || *s == 0)) {
        t.seconds = double(*ns) / 1e9;
        t.ticks = false;
      }
    }
    out[static_cast<pid_t>(std::atol(e->d_name))] = std::move(t);
  }
  ::closedir(d);
  return out;
}

std::string ThreadRole(std::string_view name) {
  size_t end = name.size();
  while (end > 0 && std::isdigit(uc(name[end - 1]))) --end;
  return std::string(name.substr(0, end == 0 ? name.size() : end));
}

std::map<std::string, RoleCpu> CpuByRole(const std::map<pid_t, ThreadCpu>& before,
                                         const std::map<pid_t, ThreadCpu>& after) {
  std::map<std::string, RoleCpu> out;
  for (const auto& [tid, t] : after) {
    auto b = before.find(tid);
    // A reused tid with another name is another thread.
    const double base = b != before.end() && b->second.name == t.name ? b->second.seconds : 0.0;
    const double used = t.seconds - base;
    if (used <= 0) continue;
    RoleCpu& r = out[ThreadRole(t.name)];
    r.seconds += used;
    ++r.threads;
    r.ticks |= t.ticks;
  }
  return out;
}

}  // namespace orbitkv::bench
