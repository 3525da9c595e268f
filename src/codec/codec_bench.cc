// Codec micro-benchmarks (Google Benchmark): encode and decode GB/s of a
// 4 MiB KV-like bf16 segment (head_dim 128) per codec, counted in decoded
// (uncompressed) bytes, next to memcpy and CRC32C of the same bytes in the
// same run. `ratio` is raw / encoded bytes. The `_scalar` rows force the
// scalar reference paths (internal::ForceScalarCodecs) where AVX2 is there.
#include <benchmark/benchmark.h>

#include <cstring>

#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

constexpr size_t kSegmentBytes = 4 << 20;

const std::vector<uint8_t>& Segment() {
  static const auto s = testing::KvLikeSegment(kSegmentBytes / 2, DType::kBf16, 128, 42);
  return s;
}

void BM_Memcpy(benchmark::State& state) {
  const auto& raw = Segment();
  std::vector<uint8_t> out(raw.size());
  for (auto _ : state) {
    std::memcpy(out.data(), raw.data(), raw.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * raw.size());
}
BENCHMARK(BM_Memcpy);

void BM_Crc32c(benchmark::State& state) {
  const auto& raw = Segment();
  for (auto _ : state) benchmark::DoNotOptimize(Crc32c(raw));
  state.SetBytesProcessed(int64_t(state.iterations()) * raw.size());
}
BENCHMARK(BM_Crc32c);

// Selects the scalar paths for one benchmark's lifetime.
class ScalarScope {
 public:
  explicit ScalarScope(bool scalar) : scalar_(scalar) {
    if (scalar_) internal::ForceScalarCodecs(true);
  }
  ~ScalarScope() {
    if (scalar_) internal::ForceScalarCodecs(false);
  }
  ScalarScope(const ScalarScope&) = delete;
  ScalarScope& operator=(const ScalarScope&) = delete;

 private:
  bool scalar_;
};

void BM_Encode(benchmark::State& state, CodecId id, bool scalar) {
  const ScalarScope scope(scalar);
  const auto& raw = Segment();
  const SegmentInfo info{DType::kBf16, 128};
  std::vector<uint8_t> frame(MaxEncodedSize(id, info, raw.size()));
  size_t n = 0;
  for (auto _ : state) {
    Result<size_t> r = Encode(id, info, raw, frame);
    if (!r.ok()) state.SkipWithError(r.status().ToString().c_str());
    n = r.value_or(0);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * raw.size());
  state.counters["ratio"] = n ? double(raw.size()) / n : 0;
}

void BM_Decode(benchmark::State& state, CodecId id, bool scalar) {
  const ScalarScope scope(scalar);
  const auto& raw = Segment();
  const auto frame = testing::EncodeOrDie(id, {DType::kBf16, 128}, raw);
  std::vector<uint8_t> out(raw.size());
  for (auto _ : state) {
    const Status st = Decode(frame, out);
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    benchmark::ClobberMemory();
  }
  if (CodecIsLossless(id) && out != raw) state.SkipWithError("ans round trip differs");
  state.SetBytesProcessed(int64_t(state.iterations()) * raw.size());
  state.counters["ratio"] = double(raw.size()) / frame.size();
}

BENCHMARK_CAPTURE(BM_Encode, ans, CodecId::kAns, false);
BENCHMARK_CAPTURE(BM_Encode, ans_scalar, CodecId::kAns, true);
BENCHMARK_CAPTURE(BM_Decode, ans, CodecId::kAns, false);
BENCHMARK_CAPTURE(BM_Decode, ans_scalar, CodecId::kAns, true);
BENCHMARK_CAPTURE(BM_Encode, fp8, CodecId::kFp8, false);
BENCHMARK_CAPTURE(BM_Encode, fp8_scalar, CodecId::kFp8, true);
BENCHMARK_CAPTURE(BM_Decode, fp8, CodecId::kFp8, false);
BENCHMARK_CAPTURE(BM_Decode, fp8_scalar, CodecId::kFp8, true);
BENCHMARK_CAPTURE(BM_Encode, turboquant_4, CodecId::kTurboQuant4, false);
BENCHMARK_CAPTURE(BM_Decode, turboquant_4, CodecId::kTurboQuant4, false);
BENCHMARK_CAPTURE(BM_Encode, turboquant_3, CodecId::kTurboQuant3, false);
BENCHMARK_CAPTURE(BM_Decode, turboquant_3, CodecId::kTurboQuant3, false);

}  // namespace
}  // namespace orbitkv::codec

BENCHMARK_MAIN();
