#include "bench/ceilings.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "orbitkv/units.h"
#include "workload/format.h"
#include "workload/process.h"

namespace orbitkv::bench {
namespace {

// Finds `name` on $PATH (or takes it as a path when it has a slash).
std::string Which(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  for (const std::string& d : demo::SplitList(path ? path : "/usr/bin:/bin", ':')) {
    const std::string cand = d + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return "";
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

bool FioAvailable(const std::string& fio) { return !Which(fio).empty(); }

Ceiling ParseFioJson(const std::string& text, bool write) {
  Ceiling c;
  // fio may print notes before the JSON object.
  const size_t brace = text.find('{');
  nlohmann::json j = nlohmann::json::parse(brace == std::string::npos ? text : text.substr(brace),
                                           nullptr, /*allow_exceptions=*/false);
  const char* dir = write ? "write" : "read";
  if (!j.is_object() || !j.contains("jobs") || !j["jobs"].is_array() || j["jobs"].empty() ||
      !j["jobs"][0].contains(dir) || !j["jobs"][0][dir].contains("bw_bytes")) {
    c.reason = "fio's output has no jobs[0]." + std::string(dir) + ".bw_bytes";
    return c;
  }
  const nlohmann::json& job = j["jobs"][0];
  if (job.value("error", 0) != 0) {
    c.reason = "fio reported error " + std::to_string(job.value("error", 0));
    return c;
  }
  c.bytes_per_s = job[dir]["bw_bytes"].get<double>();
  c.ok = c.bytes_per_s > 0;
  if (!c.ok) c.reason = "fio measured 0 bytes/s";
  return c;
}

Ceiling MeasureFio(const FioParams& p) {
  Ceiling c;
  const std::string fio = Which(p.fio);
  if (fio.empty()) {
    c.reason = "fio not found (" + p.fio + "); scripts/setup.sh installs it";
    return c;
  }
  const bool write = p.mode == FioMode::kWrite;
  const char* mode = write ? "write" : p.mode == FioMode::kRead ? "read" : "randread";
  const std::string file = p.dir + "/fio-ceiling.bin";
  const uint64_t bs = std::max<uint64_t>(4096, AlignUp(p.block_bytes, 4096));
  const uint64_t size = std::max<uint64_t>(AlignUp(p.file_bytes, bs), bs * 8);
  std::vector<std::string> argv = {fio,
                                   "--name=orbitkv-ceiling",
                                   "--filename=" + file,
                                   "--ioengine=io_uring",
                                   "--direct=1",
                                   std::string("--rw=") + mode,
                                   fmt::format("--bs={}", bs),
                                   fmt::format("--iodepth={}", p.iodepth),
                                   fmt::format("--numjobs={}", p.jobs),
                                   fmt::format("--size={}", size),
                                   fmt::format("--runtime={:.1f}", p.seconds),
                                   p.huge_buffers ? "--iomem=shmhuge" : "--iomem=malloc",
                                   "--time_based",
                                   "--group_reporting",
                                   "--output-format=json"};
  c.what =
      fmt::format("fio {} bs={} iodepth={} numjobs={} io_uring O_DIRECT {} buffers, {} file in {}",
                  mode, FormatByteSize(bs), p.iodepth, p.jobs,
                  p.huge_buffers ? "2 MiB-page" : "4 KiB-page", FormatByteSize(size), p.dir);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    c.reason = std::string("pipe: ") + std::strerror(errno);
    return c;
  }
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  demo::SpawnOptions so;
  so.stdout_fd = out[1];
  so.stderr_fd = devnull;
  Result<demo::Child> child = demo::Child::Spawn(argv, so);
  ::close(out[1]);
  if (devnull >= 0) ::close(devnull);
  if (!child.ok()) {
    ::close(out[0]);
    c.reason = "cannot start fio: " + std::string(child.status().message());
    return c;
  }
  const std::string text = ReadAll(out[0]);
  ::close(out[0]);
  const int st = child->Wait(std::chrono::seconds(60));
  if (p.remove_file) {
    std::error_code ec;
    std::filesystem::remove(file, ec);
  }
  if (!demo::ExitedZero(st)) {
    c.reason = "fio " + demo::DescribeWaitStatus(st);
    return c;
  }
  Ceiling parsed = ParseFioJson(text, write);
  parsed.what = c.what;
  return parsed;
}

uint64_t FreeHugetlbBytes() {
  std::ifstream in("/proc/meminfo");
  uint64_t free_pages = 0, page_kib = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("HugePages_Free:", 0) == 0)
      free_pages = std::strtoull(line.c_str() + 15, nullptr, 10);
    if (line.rfind("Hugepagesize:", 0) == 0)
      page_kib = std::strtoull(line.c_str() + 13, nullptr, 10);
  }
  return free_pages * page_kib * 1024;
}

bool HugeBuffersFit(const FioParams& p) {
  const uint64_t need = AlignUp(p.block_bytes, 4096) * p.iodepth * p.jobs;
  return FreeHugetlbBytes() >= need + need / 8 + 4 * kMiB;
}

Ceiling BestReadCeiling(FioParams p, uint64_t staging_bytes, const std::string& file,
                        const std::function<Ceiling(FioParams&)>& measure) {
  const uint64_t bs = std::max<uint64_t>(4096, AlignUp(p.block_bytes, 4096));
  const uint32_t configured = p.iodepth;
  const uint32_t staged = static_cast<uint32_t>(
      std::clamp<uint64_t>(staging_bytes / (bs * std::max<uint32_t>(1, p.jobs)), 1, configured));
  std::vector<uint32_t> depths = {configured};
  if (staged != configured) depths.push_back(staged);
  Ceiling best;
  std::string tried;
  p.remove_file = false;  // lay the file out once
  for (uint32_t depth : depths) {
    for (FioMode mode : {FioMode::kRandRead, FioMode::kRead}) {
      p.iodepth = depth;
      p.mode = mode;
      Ceiling c = measure(p);
      if (!c.ok) {
        if (!best.ok) best = c;
        continue;
      }
      tried += fmt::format("{}{} qd {}{}: {:.2f}", tried.empty() ? "" : ", ",
                           mode == FioMode::kRead ? "read" : "randread", depth,
                           p.huge_buffers ? " 2M pages" : "", c.bytes_per_s / 1e9);
      if (!best.ok || c.bytes_per_s > best.bytes_per_s) best = c;
    }
  }
  std::error_code ec;
  std::filesystem::remove(p.dir + file, ec);
  if (best.ok) best.what = "best of [" + tried + " GB/s]: " + best.what;
  return best;
}

Ceiling MeasureFioRead(FioParams p, uint64_t staging_bytes) {
  Ceiling best = BestReadCeiling(p, staging_bytes, "/fio-ceiling.bin", [](FioParams& q) {
    q.huge_buffers = HugeBuffersFit(q);
    return MeasureFio(q);
  });
  if (best.ok && best.what.find("4 KiB-page") != std::string::npos) {
    best.what +=
        " (no free hugetlb pages: the Manager's staging sits on 2 MiB pages, so it may beat this; "
        "reserve some with vm.nr_hugepages for a like-for-like ceiling)";
  }
  return best;
}

Ceiling MeasureMemcpy(const std::vector<uint64_t>& slot_bytes, uint32_t threads, double seconds) {
  Ceiling c;
  threads = std::max<uint32_t>(1, threads);
  uint64_t block = 0;
  for (uint64_t b : slot_bytes) block += b;
  // Per thread: `blocks` objects and `blocks` pages of >= 128 MiB each (beyond the caches).
  const uint64_t blocks = std::max<uint64_t>(128 * kMiB / block, 4);
  c.what = fmt::format(
      "memcpy of {} blocks as {} slot copies into split-layout pages, {} thread{}, {} per "
      "thread each way",
      FormatByteSize(block), slot_bytes.size(), threads, threads == 1 ? "" : "s",
      FormatByteSize(blocks * block));
  std::vector<std::vector<uint8_t>> src(threads), dst(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    src[t].assign(blocks * block, static_cast<uint8_t>(t + 1));  // touched: no faults when timed
    dst[t].assign(blocks * block, 0);
  }
  std::atomic<bool> go{false}, stop{false};
  std::vector<uint64_t> bytes(threads, 0);
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      uint64_t moved = 0;
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const uint64_t object = i * 7 % blocks, page = i * 13 % blocks;  // not sequential
        const uint8_t* from = src[t].data() + object * block;
        uint64_t region = 0;  // slot s of every page lies in region s (split layout)
        for (uint64_t s : slot_bytes) {
          std::memcpy(dst[t].data() + region + page * s, from, s);
          from += s;
          region += blocks * s;
        }
        moved += block;
      }
      bytes[t] = moved;
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (std::thread& w : workers) w.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  c.bytes_per_s = double(total) / secs;
  c.ok = c.bytes_per_s > 0;
  return c;
}

}  // namespace orbitkv::bench
