// Micro-benchmark: what verifying a restored object costs on the CPU. CRC32C
// (ISA-L, the object format's checksum) against memcpy (the copy every
// restore makes into host pages or pinned staging) and zlib's crc32, at object
// and segment sizes. Google Benchmark; reports bytes/s. Not a test:
//   build/src/store/crc32c_bench --benchmark_min_time=0.2
#include <zlib.h>

#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>

#include "store/crc32c.h"

namespace orbitkv {
namespace {

std::vector<uint8_t> Bytes(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 131 + (i >> 11));
  return b;
}

void BM_Crc32cIsal(benchmark::State& state) {
  const std::vector<uint8_t> b = Bytes(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(Crc32c(b));
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<uint8_t> src = Bytes(static_cast<size_t>(state.range(0)));
  std::vector<uint8_t> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}

void BM_Crc32Zlib(benchmark::State& state) {
  const std::vector<uint8_t> b = Bytes(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(crc32(0, b.data(), static_cast<uInt>(b.size())));
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}

// 4 KiB .. 64 MiB: segments, 2 MiB objects (an 8B model's 16-token block), and
// sizes past the last-level cache, where both run at DRAM speed.
BENCHMARK(BM_Crc32cIsal)->RangeMultiplier(8)->Range(4 << 10, 64 << 20);
BENCHMARK(BM_Memcpy)->RangeMultiplier(8)->Range(4 << 10, 64 << 20);
BENCHMARK(BM_Crc32Zlib)->RangeMultiplier(8)->Range(4 << 10, 64 << 20);

}  // namespace
}  // namespace orbitkv

BENCHMARK_MAIN();
