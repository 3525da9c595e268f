// Ceilings: what the hardware does without OrbitKV, measured in the same run
// so that every throughput can be given as a fraction of one. fio (io_uring,
// O_DIRECT, in the directory of the SSD cache, at the stored object's extent
// size and the Manager's queue depth and I/O worker count) for the SSD; for
// host pages, memcpy of the very copies a restore makes (a block's slots from
// a contiguous object into split-layout pages), single-threaded and with as
// many threads as the Manager copies on; CUDA copies for CUDA pages
// (cuda_pages.h).
// A ceiling that cannot be measured is "n/a" with a reason, never a failure.
// Call from one thread (memcpy spawns its own workers).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace orbitkv::bench {

struct Ceiling {
  bool ok = false;
  double bytes_per_s = 0;
  std::string what;    // how it was measured (tool, sizes, threads)
  std::string reason;  // why it is n/a
};

enum class FioMode { kRandRead, kRead, kWrite };

struct FioParams {
  std::string fio = "fio";  // binary
  std::string dir;          // file system to measure (the SSD cache's directory)
  FioMode mode = FioMode::kRandRead;
  uint64_t block_bytes = 0;  // the I/O size
  uint32_t iodepth = 64;
  uint32_t jobs = 2;
  uint64_t file_bytes = 1ull << 30;
  double seconds = 3;
  bool remove_file = true;    // false: keep the laid-out file for the next run
  bool huge_buffers = false;  // --iomem=shmhuge: I/O buffers on hugetlb pages
};

// Whether `fio` (a name on $PATH or a path) is an executable here.
bool FioAvailable(const std::string& fio);
// Runs fio with --output-format=json and reads jobs[0].{read,write}.bw_bytes.
Ceiling MeasureFio(const FioParams& params);
// The read ceiling: the best of random and sequential reads (restores read both
// ways), at the Manager's configured depth and at the depth its read staging
// allows (staging_bytes / I/O size over the jobs), with I/O buffers on hugetlb
// pages where enough are free: the Manager's staging is on transparent huge
// pages, and devices that take a bounded number of segments per request read
// large blocks faster from large pages. `what` lists every run.
Ceiling MeasureFioRead(FioParams params, uint64_t staging_bytes);
// The read sweep both disk ceilings share: random and sequential reads at the
// configured depth and at the depth `staging_bytes` allows (the file laid out
// once, removed at the end: `file` under params.dir); the best one, with every
// figure tried in its description. `measure` runs one (mode, depth).
Ceiling BestReadCeiling(FioParams params, uint64_t staging_bytes, const std::string& file,
                        const std::function<Ceiling(FioParams&)>& measure);
// Whether hugetlb pages are free for fio's buffers at these parameters.
bool HugeBuffersFit(const FioParams& params);
// Extracts the bandwidth from fio's JSON output (exposed for tests).
Ceiling ParseFioJson(const std::string& json, bool write);

// Copies blocks of these slots, each from a contiguous object to its slots in
// split-layout pages (one memcpy per slot, as the Manager's restore does),
// over source and destination sets larger than the caches, on `threads`
// threads at once, for about `seconds`.
Ceiling MeasureMemcpy(const std::vector<uint64_t>& slot_bytes, uint32_t threads, double seconds);

}  // namespace orbitkv::bench
