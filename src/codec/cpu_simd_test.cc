// The CPU codecs' AVX2 paths against their scalar references, byte for byte
// (internal::ForceScalarCodecs selects the scalar ones, so both run in CI on an
// AVX2 machine): ans frames and decoded bytes, ans chunk encoders (states and
// words), the exact division the AVX2 ans encoder uses, fp8 frames and
// decoded bytes over every bf16/fp16 pattern and every e4m3fn byte with
// extreme scales. Also the ans encoder's histogram bound, which lets it take
// a plane raw without coding it: never above the coded size it stands for.
// The AVX2 comparisons skip on a CPU without AVX2.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "codec/ans_chunk.h"
#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

using testing::EncodeOrDie;
using testing::HashedKvSegment;
using testing::KvLikeSegment;
using testing::RandomBytes;
using testing::Skewed;

// Runs f with the scalar paths forced, then with the default (AVX2) ones.
template <typename F>
auto ScalarThenSimd(F f) {
  internal::ForceScalarCodecs(true);
  auto scalar = f();
  internal::ForceScalarCodecs(false);
  return std::make_pair(std::move(scalar), f());
}

#define REQUIRE_AVX2() \
  if (!internal::AnsAvx2Available()) GTEST_SKIP() << "no AVX2 on this CPU"

TEST(CpuSimdTest, ScalarSwitchSelectsThePath) {
  internal::ForceScalarCodecs(true);
  EXPECT_FALSE(internal::CodecAvx2Enabled());
  internal::ForceScalarCodecs(false);
  EXPECT_EQ(internal::CodecAvx2Enabled(), internal::AnsAvx2Available());
}

// Every 16-bit pattern, in order and shuffled (NaN, Inf, denormals, zeros).
std::vector<uint8_t> AllPatterns(uint64_t shuffle_seed) {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  if (shuffle_seed != 0) std::shuffle(v.begin(), v.end(), std::mt19937_64(shuffle_seed));
  std::vector<uint8_t> out(2 * v.size());
  for (size_t i = 0; i < v.size(); ++i) Store16(out.data() + 2 * i, v[i]);
  return out;
}

// The inputs both paths are held to: special pages, every pattern, KV-like,
// skewed, random, odd sizes.
std::vector<std::vector<uint8_t>> EdgeInputs() {
  std::vector<std::vector<uint8_t>> in;
  in.push_back({});
  in.push_back({0x80, 0x3f});
  in.push_back(std::vector<uint8_t>(2 * 4096, 0));     // all-zero page
  in.push_back(std::vector<uint8_t>(2 * 3001, 0xff));  // all NaN (0xffff)
  std::vector<uint8_t> special;
  for (int i = 0; i < 5000; ++i) {
    const uint16_t v[] = {0x7fc0, 0x7f80, 0xff80, 0x0001, 0x8001, 0x0000, 0x8000,
                          0x7c00, 0xfc00, 0x7e00, 0x03ff, 0x7bff, 0x3c00};
    special.push_back(static_cast<uint8_t>(v[i % 13]));
    special.push_back(static_cast<uint8_t>(v[i % 13] >> 8));
  }
  in.push_back(special);
  in.push_back(AllPatterns(0));
  in.push_back(AllPatterns(5));
  for (size_t elems : {size_t{1}, size_t{31}, size_t{33}, size_t{1027}, size_t{65536 + 77}}) {
    in.push_back(KvLikeSegment(elems, DType::kBf16, 128, elems));
    in.push_back(KvLikeSegment(elems, DType::kFp16, 64, elems + 1));
    in.push_back(HashedKvSegment(elems, DType::kBf16, 96, elems, true));
  }
  in.push_back(RandomBytes(2 * 40001, 3));
  in.push_back(Skewed(2 * 50001, 0.05, 4));
  in.push_back(Skewed(2 * 30000, 0.6, 5));
  return in;
}

TEST(CpuSimdTest, AnsFramesAndDecodesMatchScalar) {
  REQUIRE_AVX2();
  int frames = 0;
  for (const auto& raw : EdgeInputs()) {
    for (DType t : {DType::kBf16, DType::kFp16, DType::kFp8E4m3fn}) {
      for (uint32_t chunk : {0u, 32u, 96u, 2048u, 5024u, 1u << 20}) {
        const EncodeOptions opt{.ans_chunk_elements = chunk};
        const auto [scalar, simd] = ScalarThenSimd([&] {
          return EncodeOrDie(CodecId::kAns, {t, 128}, raw, opt);
        });
        ASSERT_EQ(scalar, simd) << raw.size() << " bytes, dtype " << int(t) << ", chunk " << chunk;
        const auto [back_scalar, back_simd] = ScalarThenSimd([&] {
          std::vector<uint8_t> back(raw.size(), 0xa5);
          EXPECT_TRUE(Decode(simd, back).ok());
          return back;
        });
        ASSERT_EQ(back_scalar, raw);
        ASSERT_EQ(back_simd, raw);
        ++frames;
      }
    }
  }
  EXPECT_GT(frames, 400);
}

// Chunk by chunk: final states and words, every tail length of the last step.
TEST(CpuSimdTest, AnsChunkEncodersMatchScalar) {
  REQUIRE_AVX2();
  std::mt19937_64 rng(9);
  for (int round = 0; round < 120; ++round) {
    const uint32_t n = round < 70 ? 1 + round : 1 + static_cast<uint32_t>(rng() % 20000);
    std::vector<uint8_t> sym;
    switch (round % 3) {
      case 0:
        sym = RandomBytes(n, rng());
        break;
      case 1:
        sym = Skewed(n, 0.02 + (rng() % 90) / 100.0, rng());
        break;
      default:  // one symbol with most of the mass, rare others
        sym = std::vector<uint8_t>(n, 7);
        for (uint32_t k = 0; k < n / 50; ++k) sym[rng() % n] = static_cast<uint8_t>(rng());
    }
    uint32_t count[256] = {};
    internal::AnsCountSymbols(sym.data(), n, count);
    internal::AnsPlaneCoder coder;
    internal::AnsBuildPlaneCoder(count, n, &coder);
    std::vector<uint16_t> wa(n + 8, 0), wb(n + 8, 0);
    uint32_t sa[kAnsLanes], sb[kAnsLanes];
    const uint32_t na =
        internal::AnsEncodeChunkScalar(sym.data(), n, coder, sa, wa.data() + wa.size());
    const uint32_t nb =
        internal::AnsEncodeChunkAvx2(sym.data(), n, coder, sb, wb.data() + wb.size());
    ASSERT_EQ(na, nb) << "n " << n;
    ASSERT_TRUE(std::equal(sa, sa + kAnsLanes, sb)) << "n " << n;
    ASSERT_TRUE(std::equal(wa.end() - na, wa.end(), wb.end() - nb)) << "n " << n;
  }
}

TEST(CpuSimdTest, DivisionByMultiplicationIsExact) {
  std::mt19937_64 rng(2);
  for (uint32_t d = 1; d <= kAnsProbScale; ++d) {
    const internal::AnsDivMagic m = internal::AnsMakeDivMagic(d);
    std::vector<uint32_t> xs = {0u,          1u,          d - 1,       d,          d + 1,
                                0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu};
    for (int k = 0; k < 64; ++k) {
      const uint32_t q = static_cast<uint32_t>(rng()) / d;
      xs.push_back(q * d);
      xs.push_back(q * d + d - 1);
      xs.push_back(static_cast<uint32_t>(rng()));
    }
    for (uint32_t x : xs) ASSERT_EQ(internal::AnsDivide(x, m), x / d) << x << " / " << d;
  }
}

// The exact coded size of a plane (every chunk coded, as the GPU's count pass).
uint64_t CodedBytes(const std::vector<uint8_t>& sym, uint32_t chunk, const uint32_t* count) {
  internal::AnsPlaneCoder coder;
  internal::AnsBuildPlaneCoder(count, sym.size(), &coder);
  std::vector<uint16_t> words(chunk + 8);
  uint32_t state[kAnsLanes];
  uint64_t bytes = 0;
  for (uint32_t c = 0; c < internal::AnsChunkCount(sym.size(), chunk); ++c) {
    const uint32_t n = internal::AnsChunkLength(sym.size(), chunk, c);
    const uint32_t w = internal::AnsEncodeChunkScalar(sym.data() + uint64_t{c} * chunk, n, coder,
                                                      state, words.data() + words.size());
    bytes += internal::AnsStreamBytes(w);
  }
  return bytes;
}

// The bound behind the encoder's early raw choice never exceeds the coded size
// (were it to, a plane that codes smaller would be stored raw and the bytes
// would change), and is close enough to prove KV-like low planes raw.
TEST(CpuSimdTest, AnsCodedBytesLowerBoundHolds) {
  std::mt19937_64 rng(11);
  int proven_raw = 0, cases = 0;
  double tightest = 1;
  for (int round = 0; round < 90; ++round) {
    const size_t n = round % 10 == 0 ? 1 + rng() % 64 : 1000 + rng() % 300000;
    std::vector<uint8_t> sym;
    switch (round % 6) {
      case 0:
        sym = RandomBytes(n, rng());
        break;
      case 1:
        sym = Skewed(n, 0.01 + (rng() % 98) / 100.0, rng());
        break;
      case 2:
      case 3: {  // a plane of a KV-like segment, bf16 or fp16
        const DType t = round % 2 ? DType::kBf16 : DType::kFp16;
        const auto raw = KvLikeSegment(n, t, 128, rng());
        const int p = static_cast<int>(rng() % 2);
        sym.resize(n);
        for (size_t i = 0; i < n; ++i) sym[i] = raw[2 * i + p];
        break;
      }
      case 4:  // near-uniform over a few symbols: frequencies of 1 .. 4096
        sym.resize(n);
        for (auto& s : sym) s = static_cast<uint8_t>(rng() % (1 + round % 200));
        break;
      default:  // rare symbols of frequency 1 beside a dominant one
        sym = std::vector<uint8_t>(n, 200);
        for (size_t k = 0; k < n / 300; ++k) sym[rng() % n] = static_cast<uint8_t>(rng());
    }
    for (uint32_t chunk : {32u, 2048u, internal::AnsChunkElements(n, 0), 1u << 20}) {
      uint32_t count[256] = {};
      internal::AnsCountSymbols(sym.data(), sym.size(), count);
      internal::AnsEncTable table;
      internal::AnsBuildEncTable(count, sym.size(), &table);
      const uint64_t bound = internal::AnsCodedBytesLowerBound(count, table, n, chunk);
      const uint64_t coded = CodedBytes(sym, chunk, count);
      ASSERT_LE(bound, coded) << "round " << round << ", n " << n << ", chunk " << chunk;
      const uint64_t tables = kAnsFreqTableBytes + 4 * uint64_t{internal::AnsChunkCount(n, chunk)};
      if (bound + tables >= n) {
        ++proven_raw;
        ASSERT_GE(coded + tables, n);
      }
      const uint64_t states = uint64_t{kAnsStatesBytes} * internal::AnsChunkCount(n, chunk);
      if (coded > states + 64) {
        tightest = std::min(tightest, double(coded - bound) / double(coded - states));
      }
      ++cases;
    }
  }
  std::printf("%d of %d planes proven raw from the histogram; words bound at least %.3f%% below\n",
              proven_raw, cases, 100 * tightest);
  EXPECT_GT(proven_raw, 20);
  // KV-like bf16 segments: the low plane is raw (1.40 ratio), proven so.
  const auto raw = KvLikeSegment(1 << 20, DType::kBf16, 128, 42);
  std::vector<uint8_t> lo(1 << 20);
  for (size_t i = 0; i < lo.size(); ++i) lo[i] = raw[2 * i];
  uint32_t count[256] = {};
  internal::AnsCountSymbols(lo.data(), lo.size(), count);
  internal::AnsEncTable table;
  internal::AnsBuildEncTable(count, lo.size(), &table);
  const uint32_t chunk = internal::AnsChunkElements(lo.size(), 0);
  EXPECT_GE(internal::AnsCodedBytesLowerBound(count, table, lo.size(), chunk) + kAnsFreqTableBytes +
                4 * uint64_t{internal::AnsChunkCount(lo.size(), chunk)},
            lo.size());
}

TEST(CpuSimdTest, Fp8FramesAndDecodesMatchScalar) {
  REQUIRE_AVX2();
  int frames = 0;
  for (const auto& raw : EdgeInputs()) {
    for (DType t : {DType::kBf16, DType::kFp16}) {
      for (uint32_t head_dim : {1u, 7u, 8u, 16u, 33u, 128u, 1000u}) {
        const auto [scalar, simd] = ScalarThenSimd([&] {
          return EncodeOrDie(CodecId::kFp8, {t, head_dim}, raw);
        });
        ASSERT_EQ(scalar, simd) << raw.size() << " bytes, dtype " << int(t) << ", head_dim "
                                << head_dim;
        const auto [back_scalar, back_simd] = ScalarThenSimd([&] {
          std::vector<uint8_t> back(raw.size(), 0xa5);
          EXPECT_TRUE(Decode(simd, back).ok());
          return back;
        });
        ASSERT_EQ(back_scalar, back_simd) << raw.size() << " bytes, head_dim " << head_dim;
        ++frames;
      }
    }
  }
  EXPECT_GT(frames, 300);
}

// Every e4m3fn byte decoded with scales that reach the 16-bit types' edges
// (subnormal and overflowing results, Inf, NaN, negative and denormal scales:
// a frame's scale is whatever its bytes say).
TEST(CpuSimdTest, Fp8DecodeOfEveryByteAndExtremeScalesMatchesScalar) {
  REQUIRE_AVX2();
  std::vector<uint32_t> scales = {0x00800000u, 0x00000001u, 0x3f800000u, 0x7f7fffffu,
                                  0x7f800000u, 0xff800000u, 0x7fc00000u, 0xbf800000u,
                                  0x33800000u, 0x38800000u, 0x477fe000u, 0x5f000000u};
  std::mt19937_64 rng(8);
  for (int k = 0; k < 52; ++k) scales.push_back(static_cast<uint32_t>(rng()));
  const uint32_t group = 256;
  for (DType t : {DType::kBf16, DType::kFp16}) {
    const uint64_t elems = uint64_t{group} * scales.size();
    std::vector<uint8_t> frame(kFp8ScalesOffset + 4 * scales.size() + elems);
    internal::WritePrefix(frame.data(), CodecId::kFp8, t, 0, 2 * elems, frame.size(), group);
    for (size_t g = 0; g < scales.size(); ++g) {
      Store32(frame.data() + kFp8ScalesOffset + 4 * g, scales[g]);
      for (uint32_t b = 0; b < group; ++b) {
        frame[kFp8ScalesOffset + 4 * scales.size() + g * group + b] = static_cast<uint8_t>(b);
      }
    }
    testing::ResealFrame(frame);
    const auto [scalar, simd] = ScalarThenSimd([&] {
      std::vector<uint8_t> out(2 * elems, 0xa5);
      EXPECT_TRUE(Decode(frame, out).ok());
      return out;
    });
    for (uint64_t i = 0; i < elems; ++i) {
      ASSERT_EQ(Load16(scalar.data() + 2 * i), Load16(simd.data() + 2 * i))
          << "dtype " << int(t) << ", scale 0x" << std::hex << scales[i / group] << ", byte 0x"
          << (i % group);
    }
  }
}

}  // namespace
}  // namespace orbitkv::codec
