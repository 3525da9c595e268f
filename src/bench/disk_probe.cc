#include "bench/disk_probe.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "io/io_engine.h"
#include "orbitkv/units.h"

namespace orbitkv::bench {
namespace {

constexpr const char* kProbeFile = "/uring-probe.bin";

// One worker's I/O buffers: depth x bs on transparent huge pages.
struct Buffers {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  explicit Buffers(uint64_t n) : bytes(AlignUp(n, 2 * kMiB)) {
    base = static_cast<uint8_t*>(std::aligned_alloc(2 * kMiB, bytes));
    if (base) {
      (void)::madvise(base, bytes, MADV_HUGEPAGE);  // best effort, as the Manager's staging
      std::memset(base, 0x5A, bytes);               // touched: no faults while timed
    }
  }
  ~Buffers() { std::free(base); }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
};

std::string ModeName(FioMode m) {
  return m == FioMode::kWrite ? "write" : m == FioMode::kRead ? "read" : "randread";
}

// Writes the whole file once (so reads hit real extents), jobs x depth at a time.
Status LayOut(int fd, const std::string& file, uint64_t size, uint64_t bs, uint32_t depth) {
  UringOptions uo;
  uo.queue_depth = depth;
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, CreateUringEngine(uo));
  Buffers buf(bs * depth);
  if (!buf.base) return Status::ResourceExhausted("no memory for the probe's buffers");
  for (uint64_t off = 0; off < size;) {
    std::vector<IoRequest> reqs;
    for (uint32_t i = 0; i < depth && off < size; ++i, off += bs) {
      IoRequest r;
      r.op = IoOp::kWrite;
      r.fd = fd;
      r.offset = off;
      r.buf = buf.base + uint64_t{i} * bs;
      r.len = bs;
      r.file = file;
      reqs.push_back(r);
    }
    ORBITKV_RETURN_IF_ERROR(engine->Run(reqs));
  }
  return Status::OK();
}

}  // namespace

Ceiling MeasureUringProbe(const FioParams& p) {
  Ceiling c;
  const bool write = p.mode == FioMode::kWrite;
  const uint64_t bs = std::max<uint64_t>(4096, AlignUp(p.block_bytes, 4096));
  const uint64_t size = std::max<uint64_t>(AlignUp(p.file_bytes, bs), bs * 8);
  const uint32_t depth = std::max<uint32_t>(1, p.iodepth);
  const uint32_t jobs = std::max<uint32_t>(1, p.jobs);
  const std::string file = p.dir + kProbeFile;
  c.what = fmt::format(
      "orbitkv-bench io_uring probe (fio not used) {} bs={} iodepth={} x {} threads O_DIRECT "
      "2 MiB-page buffers, {} file in {}",
      ModeName(p.mode), FormatByteSize(bs), depth, jobs, FormatByteSize(size), p.dir);
  const bool exists = std::filesystem::exists(file) && std::filesystem::file_size(file) >= size;
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    c.reason = fmt::format("cannot open {} with O_DIRECT: {}", file, std::strerror(errno));
    return c;
  }
  auto finish = [&](Ceiling out) {
    ::close(fd);
    if (p.remove_file) {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    }
    return out;
  };
  // Laid out first for writes too (as fio does): overwrites, not first
  // allocations of a sparse file, which run several times slower.
  if (!exists) {
    if (Status st = LayOut(fd, file, size, bs, depth); !st.ok()) {
      c.reason = "laying out the probe file: " + st.ToString();
      return finish(c);
    }
  }
  const uint64_t blocks = size / bs;
  std::atomic<bool> go{false}, stop{false};
  std::vector<uint64_t> moved(jobs, 0);
  std::vector<Status> errors(jobs);
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < jobs; ++t) {
    workers.emplace_back([&, t] {
      UringOptions uo;
      uo.queue_depth = depth;
      Result<std::unique_ptr<IoEngine>> engine = CreateUringEngine(uo);
      if (!engine.ok()) {
        errors[t] = engine.status();
        return;
      }
      Buffers buf(bs * depth);
      if (!buf.base) {
        errors[t] = Status::ResourceExhausted("no memory for the probe's buffers");
        return;
      }
      std::mt19937_64 rng(t + 1);
      // Sequential modes: each thread walks its own share of the file.
      uint64_t next = blocks / jobs * t;
      std::vector<IoRequest> reqs(uint64_t{depth} * 4);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        // Four depths' worth per Run keeps the ring full (Run refills it).
        for (size_t i = 0; i < reqs.size(); ++i) {
          IoRequest& r = reqs[i];
          r = IoRequest{};
          r.op = write ? IoOp::kWrite : IoOp::kRead;
          r.fd = fd;
          const uint64_t block = p.mode == FioMode::kRandRead ? rng() % blocks : next++ % blocks;
          r.offset = block * bs;
          r.buf = buf.base + (i % depth) * bs;
          r.len = bs;
          r.file = file;
        }
        if (Status st = (*engine)->Run(reqs); !st.ok()) {
          errors[t] = st;
          return;
        }
        moved[t] += reqs.size() * bs;
      }
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(p.seconds));
  stop.store(true);
  for (std::thread& w : workers) w.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const Status& st : errors) {
    if (!st.ok()) {
      c.reason = "io_uring probe: " + st.ToString();
      return finish(c);
    }
  }
  uint64_t total = 0;
  for (uint64_t m : moved) total += m;
  c.bytes_per_s = double(total) / secs;
  c.ok = c.bytes_per_s > 0;
  if (!c.ok) c.reason = "the io_uring probe moved no bytes";
  return finish(c);
}

Ceiling MeasureUringProbeRead(FioParams p, uint64_t staging_bytes) {
  return BestReadCeiling(p, staging_bytes, kProbeFile,
                         [](FioParams& q) { return MeasureUringProbe(q); });
}

}  // namespace orbitkv::bench
