// ProcStat: CPU time of another process from /proc/<pid>/stat (utime + stime,
// in clock ticks), for the Manager's CPU seconds per GB moved, and of each of
// its threads, summed by thread role (the name without its worker index:
// common/thread_name.h), for where that CPU goes: in nanoseconds from
// /proc/<pid>/task/<tid>/schedstat where the kernel keeps it (a GPU run's
// phase lasts 0.1-1 s, a few clock ticks per thread), else in ticks from
// .../stat. Thread-safe.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>

#include "orbitkv/status.h"

namespace orbitkv::bench {

// User + system CPU seconds `pid` has used so far (its threads included).
Result<double> ProcessCpuSeconds(pid_t pid);
// Parses the text of /proc/<pid>/stat (exposed for tests).
Result<double> ParseProcStatCpuSeconds(const std::string& stat, long ticks_per_second);
// The comm field of such a line ("" when it has none).
std::string ParseProcStatComm(const std::string& stat);
// The first field of /proc/<pid>/task/<tid>/schedstat: nanoseconds on a CPU.
Result<uint64_t> ParseSchedstatRunNs(const std::string& schedstat);

// One thread's name and CPU seconds so far.
struct ThreadCpu {
  std::string name;
  double seconds = 0;
  bool ticks = false;  // from stat's clock ticks (no schedstat): 10 ms steps
};
// Every live thread of `pid`, by thread id (threads that end while it reads
// are left out).
Result<std::map<pid_t, ThreadCpu>> ThreadCpuSeconds(pid_t pid);

// A thread role's CPU between two snapshots.
struct RoleCpu {
  double seconds = 0;
  int threads = 0;     // threads of the role that ran in between
  bool ticks = false;  // some of them counted in clock ticks only
};
// "okv-ssd-read1" -> "okv-ssd-read": the role of a thread name.
std::string ThreadRole(std::string_view name);
// CPU between `before` and `after` summed by role; a thread absent from
// `before` started in between and counts from 0. A thread that ended in
// between is missing from `after`: its last CPU shows only in the process
// total.
std::map<std::string, RoleCpu> CpuByRole(const std::map<pid_t, ThreadCpu>& before,
                                         const std::map<pid_t, ThreadCpu>& after);

}  // namespace orbitkv::bench
