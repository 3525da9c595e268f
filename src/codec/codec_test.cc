#include "codec/codec.h"

#include <gtest/gtest.h>

#include <cstring>

#include "codec/codec_test_util.h"
#include "codec/crc32c_parallel.h"

namespace orbitkv::codec {
namespace {

using testing::EncodeOrDie;
using testing::KvLikeSegment;
using testing::ResealFrame;

TEST(CodecNamesTest, EveryCodecParsesItsName) {
  for (int i = 0; i < kNumCodecs; ++i) {
    const auto id = static_cast<CodecId>(i);
    Result<CodecId> parsed = ParseCodecName(CodecName(id));
    ASSERT_TRUE(parsed.ok()) << CodecName(id);
    EXPECT_EQ(*parsed, id);
  }
  EXPECT_EQ(ParseCodecName("zstd").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodecName(CodecId::kTurboQuant3), "turboquant-3");
  EXPECT_TRUE(CodecIsLossless(CodecId::kAns));
  EXPECT_FALSE(CodecIsLossless(CodecId::kFp8));
}

TEST(Crc32cTest, StandardCheckValueAndChaining) {
  const char* s = "123456789";
  std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(s), 9);
  EXPECT_EQ(Crc32c(b), 0xe3069283u);  // the CRC-32C check value
  EXPECT_EQ(Crc32c(b.subspan(4), Crc32c(b.first(4))), 0xe3069283u);
  EXPECT_EQ(Crc32c({}), 0u);
}

// The piecewise CRC of the CUDA decoder (crc32c_parallel.h) against ISA-L.
TEST(Crc32cTest, PiecewiseCombinationMatchesIsal) {
  const Crc32cTables t = MakeCrc32cTables();
  const auto data = testing::RandomBytes(10000, 3);
  for (size_t piece : {1, 7, 1024, 4096, 10000}) {
    uint32_t acc = 0;
    for (size_t start = 0; start < data.size(); start += piece) {
      const size_t end = std::min(data.size(), start + piece);
      uint32_t reg = start == 0 ? 0xffffffffu : 0;
      size_t i = start;
      for (; i + 4 <= end && piece % 4 == 0; i += 4)
        reg = Crc32cWord(t.slice, reg, Load32(&data[i]));
      for (; i < end; ++i) reg = Crc32cByte(t.slice, reg, data[i]);
      acc ^= Crc32cShift(t, reg, data.size() - end);
    }
    EXPECT_EQ(~acc, Crc32c(data)) << piece;
    EXPECT_EQ(~(Crc32cShift(t, 0xffffffffu, 5) ^ Crc32cShift(t, 0, 0)),
              Crc32c(std::vector<uint8_t>(5, 0)));
  }
}

// The GPU check pass computes each frame's CRC with its CRC field read as
// zero (the frame's own CRC) and derives the stored bytes' CRC (an object
// header's segment CRC) from it: Crc32cWithWord against ISA-L.
TEST(Crc32cTest, StoredBytesCrcFollowsFromTheZeroedFieldCrc) {
  const Crc32cTables t = MakeCrc32cTables();
  for (size_t size : {32, 33, 100, 4096, 10001}) {
    auto data = testing::RandomBytes(size, static_cast<uint32_t>(size));
    for (size_t at : {size_t{0}, size_t{28}, (size - 4) / 4 * 4}) {
      std::vector<uint8_t> zeroed = data;
      std::memset(&zeroed[at], 0, 4);
      const uint32_t zeroed_reg = ~Crc32c(zeroed);
      EXPECT_EQ(~Crc32cWithWord(t, zeroed_reg, Load32(&data[at]), at, size), Crc32c(data))
          << size << " " << at;
    }
  }
}

class EveryCodecTest : public ::testing::TestWithParam<CodecId> {};

TEST_P(EveryCodecTest, FrameIsSelfDescribingAndWithinTheBound) {
  const SegmentInfo info{DType::kBf16, 128};
  const auto raw = KvLikeSegment(128 * 64, DType::kBf16, 128, 7);
  std::vector<uint8_t> frame(MaxEncodedSize(GetParam(), info, raw.size()));
  Result<size_t> n = Encode(GetParam(), info, raw, frame);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_LE(*n, frame.size());
  frame.resize(*n);
  Result<FrameInfo> fi = ParseFrame(frame);
  ASSERT_TRUE(fi.ok()) << fi.status().ToString();
  EXPECT_EQ(fi->codec, GetParam());
  EXPECT_EQ(fi->version, CodecFormatVersion(GetParam()));
  EXPECT_EQ(fi->decoded_size, raw.size());
  EXPECT_EQ(fi->frame_size, frame.size());
  EXPECT_EQ(fi->crc, FrameCrc(frame));
  std::vector<uint8_t> out(raw.size());
  ASSERT_TRUE(Decode(frame, out, GetParam()).ok());
  if (CodecIsLossless(GetParam())) EXPECT_EQ(out, raw);
}

TEST_P(EveryCodecTest, AnyFlippedBitFailsTheCrc) {
  const SegmentInfo info{DType::kBf16, 64};
  const auto raw = KvLikeSegment(64 * 8, DType::kBf16, 64, 3);
  const auto good = EncodeOrDie(GetParam(), info, raw);
  std::vector<uint8_t> out(raw.size());
  for (size_t i = 0; i < good.size(); i += std::max<size_t>(1, good.size() / 97)) {
    auto bad = good;
    bad[i] ^= static_cast<uint8_t>(1u << (i % 8));
    const Status st = Decode(bad, out);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << "byte " << i;
  }
}

TEST_P(EveryCodecTest, TruncatedOrExtendedFramesAreCorruption) {
  const SegmentInfo info{DType::kFp16, 32};
  const auto raw = KvLikeSegment(32 * 5, DType::kFp16, 32, 4);
  const auto good = EncodeOrDie(GetParam(), info, raw);
  std::vector<uint8_t> out(raw.size());
  for (size_t len = 0; len < good.size(); ++len) {
    std::span<const uint8_t> cut(good.data(), len);
    EXPECT_EQ(Decode(cut, out).code(), StatusCode::kCorruption) << len;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(Decode(longer, out).code(), StatusCode::kCorruption);
}

TEST_P(EveryCodecTest, ResealedMutationsNeverCrash) {
  // With the CRC rewritten every mutation reaches the codec's own parser; it
  // may decode (a payload byte changed) but must stay in bounds (ASan build).
  const SegmentInfo info{DType::kBf16, 32};
  const auto raw = KvLikeSegment(32 * 70, DType::kBf16, 32, 5);
  const auto good = EncodeOrDie(GetParam(), info, raw, EncodeOptions{.ans_chunk_elements = 96});
  int corrupt = 0;
  for (size_t i = 0; i < std::min<size_t>(good.size(), 600); ++i) {
    if (i >= kFrameCrcOffset && i < kFrameCrcOffset + 4) continue;
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      auto bad = good;
      bad[i] ^= flip;
      ResealFrame(bad);
      Result<FrameInfo> fi = ParseFrame(bad);
      if (!fi.ok()) {
        ++corrupt;
        continue;
      }
      std::vector<uint8_t> out(std::min<uint64_t>(fi->decoded_size, 1 << 20));
      const Status st = Decode(bad, out);
      if (st.code() == StatusCode::kInvalidArgument) continue;  // decoded size changed
      EXPECT_TRUE(st.ok() || st.code() == StatusCode::kCorruption) << st.ToString();
      corrupt += st.code() == StatusCode::kCorruption;
    }
  }
  EXPECT_GT(corrupt, 0);
}

INSTANTIATE_TEST_SUITE_P(Codecs, EveryCodecTest,
                         ::testing::Values(CodecId::kAns, CodecId::kFp8, CodecId::kTurboQuant4,
                                           CodecId::kTurboQuant3),
                         [](const auto& p) {
                           std::string n(CodecName(p.param));
                           for (auto& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

TEST(CodecFrameTest, PrefixErrorsNameTheirCause) {
  const SegmentInfo info{DType::kBf16, 128};
  const auto raw = KvLikeSegment(1024, DType::kBf16, 128, 1);
  auto frame = EncodeOrDie(CodecId::kAns, info, raw);
  std::vector<uint8_t> out(raw.size());

  auto bad = frame;
  bad[0] = 'X';
  ResealFrame(bad);
  EXPECT_NE(Decode(bad, out).ToString().find("magic"), std::string::npos);
  bad = frame;
  bad[kPrefixCodec] = 9;
  ResealFrame(bad);
  EXPECT_NE(Decode(bad, out).ToString().find("unknown codec id 9"), std::string::npos);
  bad = frame;
  bad[kPrefixVersion] = 2;
  ResealFrame(bad);
  EXPECT_NE(Decode(bad, out).ToString().find("format version 2"), std::string::npos);
  bad = frame;
  bad[kPrefixFlags] = 0x80;
  ResealFrame(bad);
  EXPECT_EQ(Decode(bad, out).code(), StatusCode::kCorruption);
  bad = frame;
  bad[kFrameCrcOffset] ^= 1;
  EXPECT_NE(Decode(bad, out).ToString().find("CRC32C"), std::string::npos);

  EXPECT_NE(Decode(frame, out, CodecId::kFp8).ToString().find("where fp8 was expected"),
            std::string::npos);
  std::vector<uint8_t> small(raw.size() - 2);
  EXPECT_EQ(Decode(frame, small).code(), StatusCode::kInvalidArgument);
}

TEST(CodecFrameTest, EncodeRejectsWhatDoesNotFit) {
  std::vector<uint8_t> raw(301), out(4096);
  EXPECT_EQ(Encode(CodecId::kAns, {DType::kBf16, 128}, raw, out).status().code(),
            StatusCode::kInvalidArgument);  // odd byte count for bf16
  raw.resize(300);
  EXPECT_EQ(Encode(CodecId::kNone, {DType::kBf16, 128}, raw, out).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> tiny(10);
  EXPECT_EQ(Encode(CodecId::kAns, {DType::kBf16, 128}, raw, tiny).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxEncodedSize(CodecId::kNone, {}, 300), 300u);
}

// The CPU encoders' exact bytes, pinned (size and CRC32C of each frame) on
// hashed KV-like inputs with and without special values, every codec, both
// 16-bit dtypes, head_dims 32 to 1024, odd element counts: a change to an
// encoder (a faster loop, a SIMD path) must keep every byte, since the GPU
// encoder and decoder are held to the CPU's (tests/gpu/codec_cuda_test.cc) and
// frames on SSD outlive the binary. The TurboQuant codebook in the frame comes
// from libm's exp/log1p in double, rounded to float.
TEST(CodecBytesTest, EncodedFramesArePinned) {
  struct Case {
    CodecId id;
    DType dtype;
    uint32_t head_dim;
    size_t elems;
    uint64_t seed;
    bool specials;
    size_t frame_size;
    uint32_t crc;
  };
  const Case cases[] = {
      {CodecId::kAns, DType::kBf16, 128, 1048576, 1, false, 1478060, 0xac0b1fbeu},
      {CodecId::kAns, DType::kBf16, 128, 65632, 2, true, 95076, 0x6c9c3666u},
      {CodecId::kAns, DType::kFp16, 64, 100000, 3, true, 180760, 0x64c0f4a3u},
      {CodecId::kFp8, DType::kBf16, 128, 65536, 4, true, 67616, 0x7e80c141u},
      {CodecId::kFp8, DType::kFp16, 96, 28800, 5, true, 30032, 0x4f31cadeu},
      {CodecId::kTurboQuant4, DType::kBf16, 128, 262144, 6, false, 139376, 0x3f2484f3u},
      {CodecId::kTurboQuant4, DType::kFp16, 32, 16000, 7, true, 10112, 0x50b3e047u},
      {CodecId::kTurboQuant4, DType::kBf16, 1024, 40960, 8, true, 20752, 0x20af8d8cu},
      {CodecId::kTurboQuant3, DType::kBf16, 128, 262144, 9, false, 106576, 0xdf0f4fc6u},
      {CodecId::kTurboQuant3, DType::kFp16, 64, 44800, 10, true, 19680, 0x5246bb60u},
      {CodecId::kTurboQuant3, DType::kBf16, 256, 23040, 11, true, 9080, 0x9e813cceu},
  };
  for (const Case& c : cases) {
    const auto raw = testing::HashedKvSegment(c.elems, c.dtype, c.head_dim, c.seed, c.specials);
    const auto frame = EncodeOrDie(c.id, {c.dtype, c.head_dim}, raw);
    EXPECT_EQ(frame.size(), c.frame_size) << CodecName(c.id) << " seed " << c.seed;
    EXPECT_EQ(Crc32c(frame), c.crc) << CodecName(c.id) << " seed " << c.seed;
    std::vector<uint8_t> back(raw.size());
    ASSERT_TRUE(Decode(frame, back).ok()) << CodecName(c.id) << " seed " << c.seed;
    if (CodecIsLossless(c.id)) EXPECT_EQ(back, raw) << "seed " << c.seed;
  }
}

}  // namespace
}  // namespace orbitkv::codec
