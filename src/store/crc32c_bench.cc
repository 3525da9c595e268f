// Micro-benchmark: what verifying a restored object costs on the CPU. CRC32C
// (ISA-L, the object format's checksum) against memcpy (the copy every
// restore makes into host pages or pinned staging) and zlib's crc32, at object
// and segment sizes. Google Benchmark; reports bytes/s. Not a test:
//   build/src/store/crc32c_bench --benchmark_min_time=0.2
#include <zlib.h>

#include <cstdlib>
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
// A host-page publish's per-slot work (manager/publish.cc): 32 KiB slots of
// a 256 MiB working set copied into a pool-like layout (segments at offset 2048
// of a 4 KiB page, as the Manager's are), with (arg 1) or without (arg 0) each
// slot's CRC32C taken right after its copy. Page-aligned buffers: 2 KiB apart
// modulo 4 KiB, clear of the small offsets where some CPUs' rep movsb slows.
void BM_SlotCopy(benchmark::State& state) {
  constexpr size_t kSlot = 32768, kSlots = 8192, kPitch = kSlot + 4096;
  auto* src = static_cast<uint8_t*>(std::aligned_alloc(4096, kSlot * kSlots));
  auto* dst = static_cast<uint8_t*>(std::aligned_alloc(4096, kPitch * kSlots));
  std::memset(src, 7, kSlot * kSlots);
  std::memset(dst, 0, kPitch * kSlots);
  for (auto _ : state) {
    for (size_t i = 0; i < kSlots; ++i) {
      uint8_t* d = dst + i * kPitch + 2048;
      std::memcpy(d, src + i * kSlot, kSlot);
      if (state.range(0)) benchmark::DoNotOptimize(Crc32c({d, kSlot}));
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t{kSlot * kSlots});
  std::free(src);
  std::free(dst);
}

BENCHMARK(BM_Memcpy)->RangeMultiplier(8)->Range(4 << 10, 64 << 20);
BENCHMARK(BM_Crc32Zlib)->RangeMultiplier(8)->Range(4 << 10, 64 << 20);
BENCHMARK(BM_SlotCopy)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace orbitkv

BENCHMARK_MAIN();
