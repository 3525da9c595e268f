// DiskProbe: the disk ceiling measured by orbitkv-bench itself, for hosts
// without fio (the project's H200 host has none). Like the fio ceiling
// (ceilings.h): io_uring, O_DIRECT, a file in the SSD cache's directory, I/O
// size = the stored object's 4 KiB extent, `jobs` threads each with its own
// ring at `iodepth` (the Manager's --ssd-io-workers and --ssd-queue-depth),
// random or sequential offsets, buffers on transparent huge pages (as the
// Manager's read staging). Reads and writes run over a file laid out first
// with real data (never sparse), as fio does. Call from one thread; it spawns
// its workers.
#pragma once

#include <cstdint>
#include <string>

#include "bench/ceilings.h"

namespace orbitkv::bench {

// Measures `mode` (kRandRead, kRead or kWrite) with p.dir, p.block_bytes,
// p.iodepth, p.jobs, p.file_bytes and p.seconds (p.fio and p.huge_buffers are
// not used). n/a with the reason when io_uring or O_DIRECT does not work there.
Ceiling MeasureUringProbe(const FioParams& p);

// The read ceiling without fio: the best of random and sequential reads at the
// configured depth and at the depth `staging_bytes` allows, as MeasureFioRead.
Ceiling MeasureUringProbeRead(FioParams p, uint64_t staging_bytes);

}  // namespace orbitkv::bench
