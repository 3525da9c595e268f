#include "bench/proc_stat.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace orbitkv::bench {

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

}  // namespace orbitkv::bench
