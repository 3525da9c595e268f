// Machine: the embedded defaults the demo sizes from the host it runs on:
// where its state lives, how much RAM there is, how much the state directory's
// file system has free.
#pragma once

#include <cstdint>
#include <string>

#include "orbitkv/status.h"

namespace orbitkv::demo {

// $ORBITKV_DEMO_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/orbitkv-demo.
std::string DefaultStateDir();
// mkdir -p.
Status MakeDirs(const std::string& path);
// Total RAM (sysinfo).
uint64_t TotalRamBytes();
// Bytes an unprivileged user may still write under `path` (statvfs).
Result<uint64_t> FreeBytes(const std::string& path);
// The directory of this executable (/proc/self/exe).
std::string SelfDir();

}  // namespace orbitkv::demo
