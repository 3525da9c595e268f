#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

using testing::EncodeOrDie;
using testing::KvLikeSegment;
using testing::ResealFrame;

// testdata/fp8_e4m3fn_torch.bin, written by testdata/make_fp8_golden.py with
// torch 2.11.0 (its header names the version).
struct Golden {
  std::vector<uint8_t> bytes;
  const uint8_t* bf16_table() const { return bytes.data() + 24; }
  const uint8_t* fp16_table() const { return bytes.data() + 24 + 65536; }
  uint32_t groups() const { return Load32(bytes.data() + 24 + 2 * 65536); }
  uint32_t group_size() const { return Load32(bytes.data() + 28 + 2 * 65536); }
  const uint8_t* inputs() const { return bytes.data() + 32 + 2 * 65536; }
  const uint8_t* scales() const { return inputs() + 2 * groups() * group_size(); }
  const uint8_t* fp8() const { return scales() + 4 * groups(); }
  const uint8_t* decoded() const { return fp8() + groups() * group_size(); }
};

const Golden& LoadGolden() {
  static const Golden g = [] {
    Golden g;
    std::ifstream in(ORBITKV_CODEC_TESTDATA "/fp8_e4m3fn_torch.bin", std::ios::binary);
    g.bytes.assign(std::istreambuf_iterator<char>(in), {});
    return g;
  }();
  return g;
}

TEST(Fp8Test, GoldenFileIsPresent) {
  const Golden& g = LoadGolden();
  ASSERT_GT(g.bytes.size(), 32 + 2 * 65536u);
  ASSERT_EQ(std::memcmp(g.bytes.data(), "OKVFP8G1", 8), 0);
  std::printf("golden vectors from torch %s\n", reinterpret_cast<const char*>(g.bytes.data() + 8));
  ASSERT_EQ(g.bytes.size(), size_t(g.decoded() - g.bytes.data()) + 2 * g.groups() * g.group_size());
}

// Every bf16 and fp16 value converts to exactly torch's e4m3fn byte.
TEST(Fp8Test, EveryBf16AndFp16ValueMatchesTorch) {
  const Golden& g = LoadGolden();
  ASSERT_GT(g.bytes.size(), 24 + 2 * 65536u);
  int bad = 0;
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint8_t b = FloatToE4m3fn(Bf16ToFloat(static_cast<uint16_t>(v)));
    const uint8_t h = FloatToE4m3fn(Fp16ToFloat(static_cast<uint16_t>(v)));
    if (b != g.bf16_table()[v] && bad++ < 10) {
      ADD_FAILURE() << std::hex << "bf16 0x" << v << ": 0x" << int(b) << " torch 0x"
                    << int(g.bf16_table()[v]);
    }
    if (h != g.fp16_table()[v] && bad++ < 10) {
      ADD_FAILURE() << std::hex << "fp16 0x" << v << ": 0x" << int(h) << " torch 0x"
                    << int(g.fp16_table()[v]);
    }
  }
  EXPECT_EQ(bad, 0);
}

// The codec's scaled groups give torch's scales, bytes and decoded bf16.
TEST(Fp8Test, ScaledGroupsMatchTorch) {
  const Golden& g = LoadGolden();
  ASSERT_GT(g.bytes.size(), 32 + 2 * 65536u);
  const uint32_t n = g.groups() * g.group_size();
  std::vector<uint8_t> raw(g.inputs(), g.inputs() + 2 * n);
  const auto frame = EncodeOrDie(CodecId::kFp8, {DType::kBf16, g.group_size()}, raw);
  ASSERT_EQ(frame.size(), kFp8ScalesOffset + 4 * g.groups() + n);
  for (uint32_t i = 0; i < g.groups(); ++i) {
    EXPECT_EQ(Load32(frame.data() + kFp8ScalesOffset + 4 * i), Load32(g.scales() + 4 * i))
        << "scale of group " << i;
  }
  const uint8_t* payload = frame.data() + kFp8ScalesOffset + 4 * g.groups();
  EXPECT_EQ(std::memcmp(payload, g.fp8(), n), 0);
  std::vector<uint8_t> out(2 * n);
  ASSERT_TRUE(Decode(frame, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), g.decoded(), 2 * n), 0);
}

// PyTorch's semantics, spelled out (they are what the golden file holds).
TEST(Fp8Test, ConversionEdgeCases) {
  EXPECT_EQ(FloatToE4m3fn(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3fn(464.0f), 0x7e);    // tie to even, down
  EXPECT_EQ(FloatToE4m3fn(464.001f), 0x7f);  // rounds above 448: NaN, not saturated
  EXPECT_EQ(FloatToE4m3fn(-1000.0f), 0xff);
  EXPECT_EQ(FloatToE4m3fn(INFINITY), 0x7f);
  EXPECT_EQ(FloatToE4m3fn(-INFINITY), 0xff);
  EXPECT_EQ(FloatToE4m3fn(NAN), 0x7f);
  EXPECT_EQ(FloatToE4m3fn(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4m3fn(std::ldexp(1.0f, -9)), 0x01);    // smallest subnormal
  EXPECT_EQ(FloatToE4m3fn(std::ldexp(1.0f, -10)), 0x00);   // tie to even
  EXPECT_EQ(FloatToE4m3fn(std::ldexp(3.0f, -10)), 0x02);   // tie to even, up
  EXPECT_EQ(FloatToE4m3fn(std::ldexp(15.0f, -10)), 0x08);  // carries into 2^-6
  EXPECT_TRUE(std::isnan(E4m3fnToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(E4m3fnToFloat(0xff)));
  EXPECT_EQ(E4m3fnToFloat(0x7e), 448.0f);
  for (uint32_t b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToE4m3fn(E4m3fnToFloat(static_cast<uint8_t>(b))), b);
  }
}

TEST(Fp8Test, RoundTripWithinTheE4m3Bound) {
  for (DType t : {DType::kBf16, DType::kFp16}) {
    const bool bf16 = t == DType::kBf16;
    const uint32_t d = 128;
    const auto raw = KvLikeSegment(d * 256, t, d, 17);
    const auto frame = EncodeOrDie(CodecId::kFp8, {t, d}, raw);
    std::vector<uint8_t> out(raw.size());
    ASSERT_TRUE(Decode(frame, out).ok());
    double err2 = 0, ref2 = 0;
    for (size_t g = 0; g < 256; ++g) {
      const float scale = BitsToFloat(Load32(frame.data() + kFp8ScalesOffset + 4 * g));
      for (size_t k = 0; k < d; ++k) {
        const size_t i = g * d + k;
        const float x = Half16ToFloat(Load16(raw.data() + 2 * i), bf16);
        const float y = Half16ToFloat(Load16(out.data() + 2 * i), bf16);
        // e4m3 keeps 3 mantissa bits (relative 2^-4 at half an ulp), its
        // subnormal step is 2^-9 * scale; the output rounding adds 2^-8 (bf16).
        const float bound = std::fabs(x) * (0.0625f + 0.0079f) + std::ldexp(scale, -10);
        ASSERT_LE(std::fabs(x - y), bound) << i;
        err2 += double(x - y) * (x - y);
        ref2 += double(x) * x;
      }
    }
    std::printf("fp8 %s relative MSE %.2e, ratio %.3f\n", bf16 ? "bf16" : "fp16", err2 / ref2,
                double(raw.size()) / frame.size());
    EXPECT_LT(err2 / ref2, 2e-3);
  }
}

TEST(Fp8Test, SpecialValues) {
  std::vector<uint8_t> raw(2 * 8);
  const uint16_t in[8] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x3f80, 0xbf80, 0x0001};
  for (int i = 0; i < 8; ++i) Store16(raw.data() + 2 * i, in[i]);
  const auto frame = EncodeOrDie(CodecId::kFp8, {DType::kBf16, 8}, raw);
  EXPECT_EQ(BitsToFloat(Load32(frame.data() + kFp8ScalesOffset)), 1.0f / 448.0f)
      << "amax ignores the infinities and the NaN";
  std::vector<uint8_t> out(raw.size());
  ASSERT_TRUE(Decode(frame, out).ok());
  EXPECT_EQ(Load16(out.data() + 0), 0x0000);
  EXPECT_EQ(Load16(out.data() + 2), 0x8000);  // -0 kept
  for (int i = 2; i < 5; ++i) {
    EXPECT_TRUE(std::isnan(Bf16ToFloat(Load16(out.data() + 2 * i)))) << "Inf and NaN become NaN";
  }
  EXPECT_EQ(Load16(out.data() + 10), 0x3f80);
  EXPECT_EQ(Load16(out.data() + 12), 0xbf80);

  std::vector<uint8_t> zeros(2 * 300, 0), zout(600, 1);
  const auto zframe = EncodeOrDie(CodecId::kFp8, {DType::kFp16, 128}, zeros);
  ASSERT_TRUE(Decode(zframe, zout).ok());
  EXPECT_EQ(zout, zeros);
}

// The GPU's NaN payloads differ from the CPU's (a NaN scale, a NaN
// element): every decoded NaN must be the one pattern, or the CPU and CUDA
// decoders give different bytes for the same frame.
TEST(Fp8Test, AnyNanDecodesToTheOneNanPattern) {
  std::vector<uint8_t> raw(2 * 64);
  for (size_t i = 0; i < 64; ++i) Store16(raw.data() + 2 * i, FloatToBf16(float(i) - 20.0f));
  auto frame = EncodeOrDie(CodecId::kFp8, {DType::kBf16, 32}, raw);
  Store32(frame.data() + kFp8ScalesOffset, 0x7fa00001u);      // group 0: a signalling-NaN scale
  Store32(frame.data() + kFp8ScalesOffset + 4, 0xffc12345u);  // group 1: a negative NaN scale
  ResealFrame(frame);
  std::vector<uint8_t> out(raw.size());
  ASSERT_TRUE(Decode(frame, out).ok());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(Load16(out.data() + 2 * i), kHalf16Nan) << i;
  EXPECT_EQ(FloatToFp16(BitsToFloat(0x7f800001u)), kHalf16Nan);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7fc00000u)), kHalf16Nan);
}

TEST(Fp8Test, RejectsFp8InputAndMalformedFrames) {
  std::vector<uint8_t> raw(256), out(1024);
  EXPECT_EQ(Encode(CodecId::kFp8, {DType::kFp8E4m3fn, 128}, raw, out).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Encode(CodecId::kFp8, {DType::kBf16, 0}, raw, out).status().code(),
            StatusCode::kInvalidArgument);
  const auto good = EncodeOrDie(CodecId::kFp8, {DType::kBf16, 16}, raw);
  std::vector<uint8_t> dec(raw.size());
  auto bad = good;
  Store32(bad.data() + kPrefixParam, 32);  // group size no longer matches the frame size
  ResealFrame(bad);
  EXPECT_EQ(Decode(bad, dec).code(), StatusCode::kCorruption);
  bad = good;
  bad[kPrefixDType] = static_cast<uint8_t>(DType::kFp8E4m3fn);
  ResealFrame(bad);
  EXPECT_EQ(Decode(bad, dec).code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace orbitkv::codec
