// Ceilings: what the hardware does without OrbitKV, measured in the same run
// so that every throughput can be given as a fraction of one. fio (io_uring,
// O_DIRECT, in the directory of the SSD cache, at the stored object's extent
// size and the Manager's queue depth and I/O worker count) for the SSD; memcpy
// of block-sized copies for host pages, single-threaded and with as many
// threads as the Manager copies on; CUDA copies for CUDA pages (cuda_pages.h).
// A ceiling that cannot be measured is "n/a" with a reason, never a failure.
// Call from one thread (memcpy spawns its own workers).
#pragma once

#include <cstdint>
#include <string>

namespace orbitkv::bench {

struct Ceiling {
  bool ok = false;
  double bytes_per_s = 0;
  std::string what;    // how it was measured (tool, sizes, threads)
  std::string reason;  // why it is n/a
};

struct FioParams {
  std::string fio = "fio";   // binary
  std::string dir;           // file system to measure (the SSD cache's directory)
  bool write = false;        // sequential write; else random read
  uint64_t block_bytes = 0;  // the I/O size
  uint32_t iodepth = 64;
  uint32_t jobs = 2;
  uint64_t file_bytes = 1ull << 30;
  double seconds = 3;
};

// Runs fio with --output-format=json and reads jobs[0].{read,write}.bw_bytes.
Ceiling MeasureFio(const FioParams& params);
// Extracts the bandwidth from fio's JSON output (exposed for tests).
Ceiling ParseFioJson(const std::string& json, bool write);

// memcpy of `block_bytes` copies from a source set to a destination set larger
// than the caches, on `threads` threads at once, for about `seconds`.
Ceiling MeasureMemcpy(uint64_t block_bytes, uint32_t threads, double seconds);

}  // namespace orbitkv::bench
