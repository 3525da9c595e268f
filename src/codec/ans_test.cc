#include <gtest/gtest.h>

#include <cstring>

#include "codec/ans_chunk.h"
#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

using testing::EncodeOrDie;
using testing::KvLikeSegment;
using testing::RandomBytes;
using testing::ResealFrame;

// Decodes with the dispatching decoder and, separately, the scalar one; both
// must give the input back.
void ExpectBitExact(const std::vector<uint8_t>& raw, DType dtype, uint32_t chunk = 0) {
  const SegmentInfo info{dtype, 128};
  const auto frame =
      EncodeOrDie(CodecId::kAns, info, raw, EncodeOptions{.ans_chunk_elements = chunk});
  std::vector<uint8_t> out(raw.size(), 0xa5);
  ASSERT_TRUE(Decode(frame, out).ok());
  ASSERT_EQ(out, raw);
  Result<FrameInfo> fi = ParseFrame(frame);
  ASSERT_TRUE(fi.ok());
  std::fill(out.begin(), out.end(), 0x5a);
  ASSERT_TRUE(internal::AnsDecodeScalar(*fi, frame, out).ok());
  ASSERT_EQ(out, raw);
}

TEST(AnsTest, KvLikeBf16CompressesAndRoundTrips) {
  for (DType t : {DType::kBf16, DType::kFp16}) {
    const auto raw = KvLikeSegment(1 << 18, t, 128, 11);
    const auto frame = EncodeOrDie(CodecId::kAns, {t, 128}, raw);
    const double ratio = double(raw.size()) / frame.size();
    std::printf("ans ratio on KV-like %s: %.3f\n", t == DType::kBf16 ? "bf16" : "fp16", ratio);
    EXPECT_GT(ratio, t == DType::kBf16 ? 1.3 : 1.08);
    ExpectBitExact(raw, t);
  }
}

TEST(AnsTest, EveryBf16BitPatternIncludingNanInfAndDenormals) {
  std::vector<uint8_t> raw(65536 * 2);
  for (uint32_t v = 0; v < 65536; ++v) Store16(raw.data() + 2 * v, static_cast<uint16_t>(v));
  ExpectBitExact(raw, DType::kBf16);
  ExpectBitExact(raw, DType::kFp16, 4096);
}

TEST(AnsTest, SpecialPagesRoundTrip) {
  std::vector<uint8_t> zeros(1 << 16, 0);
  ExpectBitExact(zeros, DType::kBf16);
  const auto zframe = EncodeOrDie(CodecId::kAns, {DType::kBf16, 128}, zeros);
  EXPECT_LT(zframe.size(), zeros.size() / 10) << "an all-zero page costs only the lane states";

  std::vector<uint8_t> nans(4096);
  for (size_t i = 0; i < nans.size(); i += 2) Store16(nans.data() + i, i % 4 ? 0x7fc1 : 0xff80);
  ExpectBitExact(nans, DType::kBf16);
  std::vector<uint8_t> denormals(4096);
  for (size_t i = 0; i < denormals.size(); i += 2) {
    Store16(denormals.data() + i, static_cast<uint16_t>(((i * 7) & 0x7f) | (i & 2 ? 0x8000 : 0)));
  }
  ExpectBitExact(denormals, DType::kBf16);
  ExpectBitExact(denormals, DType::kFp8E4m3fn);
}

TEST(AnsTest, IncompressibleInputIsStored) {
  const auto raw = RandomBytes(1 << 16, 9);
  const auto frame = EncodeOrDie(CodecId::kAns, {DType::kBf16, 128}, raw);
  Result<FrameInfo> fi = ParseFrame(frame);
  ASSERT_TRUE(fi.ok());
  EXPECT_EQ(fi->flags, kFrameFlagStored);
  EXPECT_EQ(frame.size(), raw.size() + kFramePrefixBytes);
  ExpectBitExact(raw, DType::kBf16);
}

TEST(AnsTest, RawLowPlaneAndCodedHighPlane) {
  // Random mantissas with a narrow exponent range: plane 0 stays raw, plane 1
  // is coded; the frame must still beat the stored form.
  auto raw = RandomBytes(1 << 15, 2);
  for (size_t i = 1; i < raw.size(); i += 2) raw[i] = static_cast<uint8_t>(0x3c + (raw[i] & 1));
  const auto frame = EncodeOrDie(CodecId::kAns, {DType::kBf16, 128}, raw);
  EXPECT_EQ(frame[kAnsPlaneDescOffset], kAnsPlaneRaw);
  EXPECT_EQ(frame[kAnsPlaneDescOffset + kAnsPlaneDescBytes], kAnsPlaneRans);
  EXPECT_LT(frame.size(), raw.size() * 65 / 100);
  ExpectBitExact(raw, DType::kBf16);
}

TEST(AnsTest, OddSizesAndChunkTails) {
  for (size_t elems : {0, 1, 2, 31, 32, 33, 95, 96, 97, 1000, 4097, 8192 * 3 + 5}) {
    for (uint32_t chunk : {0u, 32u, 96u, 4096u}) {
      SCOPED_TRACE(::testing::Message() << elems << " elements, chunk " << chunk);
      ExpectBitExact(KvLikeSegment(elems, DType::kBf16, 128, elems), DType::kBf16, chunk);
      auto fp8 = KvLikeSegment(elems, DType::kBf16, 128, elems + 1);
      fp8.resize(elems);
      ExpectBitExact(fp8, DType::kFp8E4m3fn, chunk);
    }
  }
}

TEST(AnsTest, ChunkOptionIsValidated) {
  std::vector<uint8_t> raw(256), out(1024);
  EXPECT_EQ(Encode(CodecId::kAns, {DType::kBf16, 128}, raw, out, {.ans_chunk_elements = 33})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// A valid chunk stream for both decoders: the scalar and AVX2 decoders agree
// on every symbol and on every malformed variant.
TEST(AnsTest, Avx2AndScalarChunkDecodersAgree) {
  if (!internal::AnsAvx2Available()) GTEST_SKIP() << "no AVX2 on this CPU";
  const auto raw = KvLikeSegment(5000, DType::kBf16, 128, 21);
  const auto frame = EncodeOrDie(CodecId::kAns, {DType::kBf16, 128}, raw,
                                 EncodeOptions{.ans_chunk_elements = 5024});
  // Plane 1 (high bytes) is coded: rebuild its table and stream by hand.
  const uint8_t* d = frame.data() + kAnsPlaneDescOffset + kAnsPlaneDescBytes;
  ASSERT_EQ(d[0], kAnsPlaneRans);
  const uint32_t off = Load32(d + 4), table_off = Load32(d + 12);
  const uint32_t end = Load32(frame.data() + table_off + kAnsFreqTableBytes);
  std::vector<uint32_t> table(kAnsProbScale);
  uint32_t cum = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t f = Load16(frame.data() + table_off + 2 * s);
    for (uint32_t k = 0; k < f; ++k) table[cum + k] = AnsTableEntry(s, f, k);
    cum += f;
  }
  std::vector<uint8_t> stream(frame.begin() + off, frame.begin() + off + end);
  std::vector<uint8_t> a(5000), b(5000);
  ASSERT_TRUE(
      internal::AnsDecodeChunkScalar(table.data(), stream.data(), stream.size(), 5000, a.data()));
  ASSERT_TRUE(
      internal::AnsDecodeChunkAvx2(table.data(), stream.data(), stream.size(), 5000, b.data()));
  EXPECT_EQ(a, b);
  for (size_t i = 0; i < 5000; ++i) ASSERT_EQ(a[i], raw[2 * i + 1]) << i;
  for (size_t i = 0; i < stream.size(); i += 7) {
    auto bad = stream;
    bad[i] ^= 0x10;
    std::fill(a.begin(), a.end(), 0);
    std::fill(b.begin(), b.end(), 0);
    const bool sa =
        internal::AnsDecodeChunkScalar(table.data(), bad.data(), bad.size(), 5000, a.data());
    const bool sb =
        internal::AnsDecodeChunkAvx2(table.data(), bad.data(), bad.size(), 5000, b.data());
    ASSERT_EQ(sa, sb) << i;
    if (sa) ASSERT_EQ(a, b) << i;  // a refused stream leaves its output unspecified
  }
  // A stream cut short runs out of words: both refuse it.
  for (size_t len = kAnsStatesBytes; len < stream.size(); len += 4) {
    EXPECT_FALSE(internal::AnsDecodeChunkScalar(table.data(), stream.data(), len, 5000, a.data()));
    EXPECT_FALSE(internal::AnsDecodeChunkAvx2(table.data(), stream.data(), len, 5000, b.data()));
  }
}

TEST(AnsTest, MalformedHeadersAreCorruption) {
  const auto raw = KvLikeSegment(4096, DType::kBf16, 128, 5);
  const auto good = EncodeOrDie(CodecId::kAns, {DType::kBf16, 128}, raw);
  std::vector<uint8_t> out(raw.size());
  auto expect = [&](auto mutate, const char* what) {
    auto bad = good;
    mutate(bad);
    ResealFrame(bad);
    const Status st = Decode(bad, out);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << what;
    EXPECT_NE(st.ToString().find(what), std::string::npos) << st.ToString();
  };
  expect([](auto& f) { f[kAnsPlanesOffset] = 1; }, "plane count");
  expect([](auto& f) { f[kAnsLanesOffset] = 16; }, "lanes");
  expect([](auto& f) { Store32(f.data() + kPrefixParam, 100); }, "chunk size");
  expect([](auto& f) { Store32(f.data() + kAnsChunksOffset, 7); }, "chunk count");
  expect([](auto& f) { f[kAnsPlaneDescOffset + 16] = 7; }, "unknown mode");
  expect([](auto& f) { Store32(f.data() + kAnsPlaneDescOffset + 16 + 4, 1u << 30); },
         "data out of the frame");
  expect(
      [](auto& f) {
        const uint32_t t = Load32(f.data() + kAnsPlaneDescOffset + 16 + 12);
        Store16(f.data() + t, static_cast<uint16_t>(Load16(f.data() + t) + 1));
      },
      "frequencies");
  expect(
      [](auto& f) {
        const uint32_t t = Load32(f.data() + kAnsPlaneDescOffset + 16 + 12);
        Store32(f.data() + t + kAnsFreqTableBytes, 1u << 28);
      },
      "stream bounds");
  expect(
      [](auto& f) {
        const uint32_t off = Load32(f.data() + kAnsPlaneDescOffset + 16 + 4);
        f[off + 3] ^= 0x40;  // lane 0's initial state
      },
      "does not decode");
}

}  // namespace
}  // namespace orbitkv::codec
