#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

using testing::EncodeOrDie;
using testing::ResealFrame;

CodecId Tq(uint32_t bits) { return bits == 4 ? CodecId::kTurboQuant4 : CodecId::kTurboQuant3; }

// Random unit vectors (uniform on the sphere), stored as dtype.
std::vector<uint8_t> UnitVectors(uint32_t d, uint32_t count, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<uint8_t> raw(size_t{2} * d * count);
  std::vector<double> v(d);
  for (uint32_t n = 0; n < count; ++n) {
    double ss = 0;
    for (auto& x : v) ss += (x = normal(rng)) * x;
    for (uint32_t k = 0; k < d; ++k) {
      Store16(raw.data() + 2 * (size_t{n} * d + k),
              FloatToHalf16(static_cast<float>(v[k] / std::sqrt(ss)), t == DType::kBf16));
    }
  }
  return raw;
}

// Mean over vectors of |x - x'|^2 / |x|^2, x the stored input.
double NormalisedMse(const std::vector<uint8_t>& raw, const std::vector<uint8_t>& out, uint32_t d,
                     bool bf16) {
  double total = 0;
  const size_t count = raw.size() / 2 / d;
  for (size_t n = 0; n < count; ++n) {
    double e = 0, r = 0;
    for (uint32_t k = 0; k < d; ++k) {
      const double x = Half16ToFloat(Load16(raw.data() + 2 * (n * d + k)), bf16);
      const double y = Half16ToFloat(Load16(out.data() + 2 * (n * d + k)), bf16);
      e += (x - y) * (x - y);
      r += x * x;
    }
    total += e / r;
  }
  return total / count;
}

// The paper (Theorem 1) gives D_mse ~ 0.03 at b = 3 and 0.009 at b = 4 for
// unit vectors, under the upper bound sqrt(3) pi / 2 * 4^-b.
TEST(TurboQuantTest, DistortionOfUnitVectorsMatchesThePaper) {
  for (uint32_t d : {64u, 128u, 256u}) {
    for (uint32_t bits : {4u, 3u}) {
      const auto raw = UnitVectors(d, 4096, DType::kBf16, d * 10 + bits);
      const auto frame = EncodeOrDie(Tq(bits), {DType::kBf16, d}, raw);
      std::vector<uint8_t> out(raw.size());
      ASSERT_TRUE(Decode(frame, out).ok());
      const double mse = NormalisedMse(raw, out, d, true);
      const double theory = internal::TurboQuantCodebookDistortion(d, bits);
      const double paper = bits == 4 ? 0.009 : 0.03;
      const double bound = std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -double(bits));
      std::printf(
          "turboquant-%u d=%u: measured D_mse %.5f, codebook %.5f, paper ~%.3f, bound %.4f, "
          "ratio %.2f\n",
          bits, d, mse, theory, paper, bound, double(raw.size()) / frame.size());
      EXPECT_NEAR(mse, theory, 0.08 * theory);
      EXPECT_LT(mse, bound);
      EXPECT_NEAR(mse, paper, 0.25 * paper);
    }
  }
}

TEST(TurboQuantTest, CodebookIsSymmetricAndAscending) {
  for (uint32_t bits : {3u, 4u}) {
    const auto& c = internal::TurboQuantCodebook(128, bits);
    ASSERT_EQ(c.size(), 1u << bits);
    for (size_t k = 0; k + 1 < c.size(); ++k) EXPECT_LT(c[k], c[k + 1]);
    for (size_t k = 0; k < c.size(); ++k) EXPECT_NEAR(c[k], -c[c.size() - 1 - k], 1e-6);
  }
  // Gaussian Lloyd-Max at 3 bits: outer centroid 2.152 sigma.
  EXPECT_NEAR(internal::TurboQuantCodebook(1024, 3).back() * std::sqrt(1024.0), 2.152, 0.01);
}

TEST(TurboQuantTest, NormsAreKeptAndSparseVectorsSpread) {
  // Basis vectors scaled by 1000: one Hadamard round would leave every
  // coordinate at +-1/sqrt(d); two rounds make them near Gaussian.
  const uint32_t d = 128;
  std::vector<uint8_t> raw(2 * d * d, 0);
  for (uint32_t n = 0; n < d; ++n) Store16(raw.data() + 2 * (n * d + n), FloatToBf16(1000.0f));
  for (uint32_t bits : {4u, 3u}) {
    const auto frame = EncodeOrDie(Tq(bits), {DType::kBf16, d}, raw);
    std::vector<uint8_t> out(raw.size());
    ASSERT_TRUE(Decode(frame, out).ok());
    const double mse = NormalisedMse(raw, out, d, true);
    EXPECT_LT(mse, 2 * internal::TurboQuantCodebookDistortion(d, bits)) << bits;
  }
}

TEST(TurboQuantTest, Fp16ZeroAndNonFiniteVectors) {
  const uint32_t d = 32;
  auto raw = UnitVectors(d, 3, DType::kFp16, 1);
  std::fill(raw.begin(), raw.begin() + 2 * d, 0);  // vector 0: zeros
  Store16(raw.data() + 2 * (d + 3), 0x7e00);       // vector 1: a NaN
  const auto frame = EncodeOrDie(CodecId::kTurboQuant4, {DType::kFp16, d}, raw);
  std::vector<uint8_t> out(raw.size());
  ASSERT_TRUE(Decode(frame, out).ok());
  for (uint32_t k = 0; k < d; ++k) {
    EXPECT_EQ(Fp16ToFloat(Load16(out.data() + 2 * k)), 0.0f);
    EXPECT_TRUE(std::isnan(Fp16ToFloat(Load16(out.data() + 2 * (d + k)))));
    EXPECT_NEAR(Fp16ToFloat(Load16(out.data() + 2 * (2 * d + k))),
                Fp16ToFloat(Load16(raw.data() + 2 * (2 * d + k))), 0.12);
  }
}

TEST(TurboQuantTest, SeedIsInTheFrameAndEncodingIsDeterministic) {
  const auto raw = UnitVectors(64, 16, DType::kBf16, 2);
  const auto a = EncodeOrDie(CodecId::kTurboQuant3, {DType::kBf16, 64}, raw);
  const auto b = EncodeOrDie(CodecId::kTurboQuant3, {DType::kBf16, 64}, raw);
  EXPECT_EQ(a, b);
  const auto c = EncodeOrDie(CodecId::kTurboQuant3, {DType::kBf16, 64}, raw,
                             EncodeOptions{.turboquant_seed = 99});
  EXPECT_NE(a, c);
  std::vector<uint8_t> out(raw.size());
  ASSERT_TRUE(Decode(c, out).ok());
  EXPECT_LT(NormalisedMse(raw, out, 64, true), 0.05);
}

TEST(TurboQuantTest, RejectsBadShapesAndFrames) {
  std::vector<uint8_t> raw(2 * 96 * 4), out(1 << 16);
  EXPECT_EQ(Encode(CodecId::kTurboQuant4, {DType::kBf16, 96}, raw, out).status().code(),
            StatusCode::kInvalidArgument);  // not a power of two
  EXPECT_EQ(Encode(CodecId::kTurboQuant4, {DType::kBf16, 16}, raw, out).status().code(),
            StatusCode::kInvalidArgument);  // below 32
  EXPECT_EQ(Encode(CodecId::kTurboQuant4, {DType::kBf16, 256}, raw, out).status().code(),
            StatusCode::kInvalidArgument);  // 384 elements: not whole vectors
  const auto good = EncodeOrDie(CodecId::kTurboQuant4, {DType::kBf16, 32}, raw);
  std::vector<uint8_t> dec(raw.size());
  for (uint32_t off : {kTqBitsOffset, kTqRoundsOffset, kTqVectorsOffset, kPrefixParam}) {
    auto bad = good;
    bad[off] ^= 1;
    ResealFrame(bad);
    EXPECT_EQ(Decode(bad, dec).code(), StatusCode::kCorruption) << off;
  }
}

}  // namespace
}  // namespace orbitkv::codec
