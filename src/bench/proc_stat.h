// ProcStat: CPU time of another process from /proc/<pid>/stat (utime + stime,
// in clock ticks), for the Manager's CPU seconds per GB moved. Thread-safe.
#pragma once

#include <sys/types.h>

#include <string>

#include "orbitkv/status.h"

namespace orbitkv::bench {

// User + system CPU seconds `pid` has used so far (its threads included).
Result<double> ProcessCpuSeconds(pid_t pid);
// Parses the text of /proc/<pid>/stat (exposed for tests).
Result<double> ParseProcStatCpuSeconds(const std::string& stat, long ticks_per_second);

}  // namespace orbitkv::bench
