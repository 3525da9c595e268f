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
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "demo/format.h"
#include "demo/process.h"
#include "orbitkv/units.h"

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
  const std::string file = p.dir + "/fio-ceiling.bin";
  const uint64_t bs = std::max<uint64_t>(4096, AlignUp(p.block_bytes, 4096));
  const uint64_t size = std::max<uint64_t>(AlignUp(p.file_bytes, bs), bs * 8);
  std::vector<std::string> argv = {fio,
                                   "--name=orbitkv-ceiling",
                                   "--filename=" + file,
                                   "--ioengine=io_uring",
                                   "--direct=1",
                                   std::string("--rw=") + (p.write ? "write" : "randread"),
                                   fmt::format("--bs={}", bs),
                                   fmt::format("--iodepth={}", p.iodepth),
                                   fmt::format("--numjobs={}", p.jobs),
                                   fmt::format("--size={}", size),
                                   fmt::format("--runtime={:.1f}", p.seconds),
                                   "--time_based",
                                   "--group_reporting",
                                   "--output-format=json"};
  c.what = fmt::format("fio {} bs={} iodepth={} numjobs={} io_uring O_DIRECT, {} file in {}",
                       p.write ? "write" : "randread", FormatByteSize(bs), p.iodepth, p.jobs,
                       FormatByteSize(size), p.dir);
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
  std::error_code ec;
  std::filesystem::remove(file, ec);
  if (!demo::ExitedZero(st)) {
    c.reason = "fio " + demo::DescribeWaitStatus(st);
    return c;
  }
  Ceiling parsed = ParseFioJson(text, p.write);
  parsed.what = c.what;
  return parsed;
}

Ceiling MeasureMemcpy(uint64_t block_bytes, uint32_t threads, double seconds) {
  Ceiling c;
  threads = std::max<uint32_t>(1, threads);
  // Per thread: source and destination sets of >= 64 MiB (beyond the caches).
  const uint64_t per = std::max<uint64_t>(64 * kMiB / block_bytes, 2) * block_bytes;
  c.what = fmt::format("memcpy of {} blocks, {} thread{}, {} per thread each way",
                       FormatByteSize(block_bytes), threads, threads == 1 ? "" : "s",
                       FormatByteSize(per));
  std::vector<std::vector<uint8_t>> src(threads), dst(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    src[t].assign(per, static_cast<uint8_t>(t + 1));  // touched: no page faults while timed
    dst[t].assign(per, 0);
  }
  std::atomic<bool> go{false}, stop{false};
  std::vector<uint64_t> bytes(threads, 0);
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const uint64_t blocks = per / block_bytes;
      uint64_t moved = 0;
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const uint64_t off = (i * 7 % blocks) * block_bytes;  // not sequential
        std::memcpy(dst[t].data() + off, src[t].data() + off, block_bytes);
        moved += block_bytes;
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
