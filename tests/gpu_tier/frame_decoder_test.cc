// The GPU seam's frame decoder (gpu::FrameDecoder, gpu/platform.h) on the
// gates' platform: the CPU codec on the fake platform (CI), CudaDecoder on
// CUDA (gpu_tier_gate_cuda_test). Frames in device memory decode into device
// memory to the CPU decoder's bytes; a frame that fails its CRC or whose
// prefix is not what the op expects writes nothing; bad arguments are
// refused before anything is enqueued.
#include <gtest/gtest.h>

#include <vector>

#include "codec/codec.h"
#include "codec/codec_test_util.h"
#include "gpu_tier/gate_env.h"

namespace orbitkv {
namespace {

using codec::CodecId;

constexpr uint8_t kPoison = 0x5c;

class FrameDecoderSeam : public ::testing::Test {
 protected:
  std::unique_ptr<testing::GateEnv> env;
  gpu::Device* dev = nullptr;
  std::unique_ptr<gpu::Stream> stream;
  std::vector<testing::GateEnv::Pages> held;

  void SetUp() override {
    env = testing::CreateGateEnv();
    if (std::string why = env->Unavailable(); !why.empty()) GTEST_SKIP() << why;
    Result<gpu::Device*> d = env->inner()->device(0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev = *d;
    auto s = dev->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stream = std::move(s).value();
  }
  void TearDown() override {
    stream.reset();
    for (auto& p : held) env->Free(p);
    if (env) EXPECT_EQ(env->Leaks(), "");
  }
  gpu::DevPtr Put(const std::vector<uint8_t>& bytes) {
    held.push_back(env->Allocate(bytes.size()));
    env->Write(held.back().base, bytes.data(), bytes.size());
    return held.back().base;
  }
  gpu::DevPtr Poisoned(uint64_t bytes) { return Put(std::vector<uint8_t>(bytes, kPoison)); }
  std::vector<uint8_t> Get(gpu::DevPtr p, uint64_t n) {
    std::vector<uint8_t> out(n);
    env->Read(out.data(), p, n);
    return out;
  }
  static codec::SegmentInfo Info() { return {codec::DType::kBf16, 128}; }
};

TEST_F(FrameDecoderSeam, DecodesEveryCodecToTheCpuBytes) {
  auto dec = dev->CreateFrameDecoder(4);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  const std::vector<uint8_t> raw =
      codec::testing::KvLikeSegment(16384, codec::DType::kBf16, 128, 7);
  for (CodecId id : {CodecId::kAns, CodecId::kFp8, CodecId::kTurboQuant4, CodecId::kTurboQuant3}) {
    SCOPED_TRACE(std::string(codec::CodecName(id)));
    const std::vector<uint8_t> frame = codec::testing::EncodeOrDie(id, Info(), raw);
    std::vector<uint8_t> want(raw.size());
    ASSERT_TRUE(codec::Decode(frame, want).ok());
    const gpu::DevPtr in = Put(frame), out = Poisoned(raw.size());
    const gpu::DecodeOp op{in, frame.size(), out, raw.size()};
    ASSERT_TRUE((*dec)->DecodeAsync(id, 128, {&op, 1}, *stream).ok());
    Result<std::vector<gpu::DecodeResult>> r = (*dec)->Finish(*stream);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_TRUE((*r)[0].status.ok()) << (*r)[0].status.ToString();
    EXPECT_EQ(Get(out, raw.size()), want);
  }
}

TEST_F(FrameDecoderSeam, FramesFailingTheirChecksWriteNothing) {
  auto dec = dev->CreateFrameDecoder(4);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  const std::vector<uint8_t> raw = codec::testing::KvLikeSegment(8192, codec::DType::kBf16, 128, 3);
  std::vector<uint8_t> flipped = codec::testing::EncodeOrDie(CodecId::kAns, Info(), raw);
  const std::vector<uint8_t> good = flipped;
  flipped[flipped.size() / 2] ^= 0x08;  // the frame's CRC32C no longer matches
  const gpu::DevPtr in_flipped = Put(flipped), in_good = Put(good);
  const uint64_t n = raw.size();
  const gpu::DevPtr outs[4] = {Poisoned(n), Poisoned(n), Poisoned(n), Poisoned(n)};
  const gpu::DecodeOp ops[4] = {
      {in_flipped, flipped.size(), outs[0], n},  // fails its CRC32C
      {in_good, good.size(), outs[1], n - 256},  // another decoded size than the frame's
      {in_good, good.size(), outs[2], n},        // decoded as fp8 below: another codec
      {in_good, good.size(), outs[3], n},        // intact
  };
  ASSERT_TRUE((*dec)->DecodeAsync(CodecId::kAns, 0, {ops, 2}, *stream).ok());
  Result<std::vector<gpu::DecodeResult>> r = (*dec)->Finish(*stream);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  for (const gpu::DecodeResult& x : *r) {
    EXPECT_EQ(x.status.code(), StatusCode::kCorruption) << x.status.ToString();
    EXPECT_EQ(x.check, gpu::DecodeCheck::kFrame);
  }
  ASSERT_TRUE((*dec)->DecodeAsync(CodecId::kFp8, 128, {ops + 2, 1}, *stream).ok());
  r = (*dec)->Finish(*stream);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].status.code(), StatusCode::kCorruption) << "an ans frame decoded as fp8";
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Get(outs[i], n), std::vector<uint8_t>(n, kPoison)) << "op " << i << " wrote";
  }
  ASSERT_TRUE((*dec)->DecodeAsync(CodecId::kAns, 0, {ops + 3, 1}, *stream).ok());
  r = (*dec)->Finish(*stream);
  ASSERT_TRUE(r.ok() && (*r)[0].status.ok());
  EXPECT_EQ(Get(outs[3], n), raw);
}

// An object's segments as one group (the decode lane's task): the stored
// bytes' CRC32C (the header's segment CRC) and the dtype are checked before
// any write; one segment failing, a check-only one included, leaves the whole
// group unwritten and fails the others as siblings; an op of its own group
// fails alone.
TEST_F(FrameDecoderSeam, SegmentChecksGateTheWholeObject) {
  auto dec = dev->CreateFrameDecoder(8);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  for (CodecId id : {CodecId::kAns, CodecId::kFp8, CodecId::kTurboQuant4}) {
    SCOPED_TRACE(std::string(codec::CodecName(id)));
    std::vector<std::vector<uint8_t>> raws, frames;
    std::vector<uint32_t> crcs;
    std::vector<gpu::DevPtr> ins, outs;
    for (uint32_t k = 0; k < 3; ++k) {
      raws.push_back(
          codec::testing::KvLikeSegment(128 * (32 + 8 * k), codec::DType::kBf16, 128, 40 + k));
      frames.push_back(codec::testing::EncodeOrDie(id, Info(), raws.back()));
      crcs.push_back(codec::Crc32c(frames.back()));
      ins.push_back(Put(frames.back()));
      outs.push_back(Poisoned(raws.back().size()));
    }
    const bool tq = id == CodecId::kTurboQuant4;
    auto ops = [&] {
      std::vector<gpu::DecodeOp> v(3);
      for (uint32_t k = 0; k < 3; ++k) {
        v[k] = {ins[k], frames[k].size(), outs[k], raws[k].size()};
        v[k].segment_crc = crcs[k];
        v[k].dtype = static_cast<uint8_t>(codec::DType::kBf16);
        if (tq) v[k].param = 128;
        v[k].group = 0;
      }
      return v;
    };
    auto run = [&](const std::vector<gpu::DecodeOp>& v) {
      for (uint32_t k = 0; k < 3; ++k) {
        env->Write(outs[k], std::vector<uint8_t>(raws[k].size(), kPoison).data(), raws[k].size());
      }
      EXPECT_TRUE((*dec)->DecodeAsync(id, 128, v, *stream).ok());
      Result<std::vector<gpu::DecodeResult>> r = (*dec)->Finish(*stream);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      return r.ok() ? *r : std::vector<gpu::DecodeResult>(3);
    };
    auto untouched = [&](uint32_t k) {
      return Get(outs[k], raws[k].size()) == std::vector<uint8_t>(raws[k].size(), kPoison);
    };
    auto decoded = [&](uint32_t k) {
      std::vector<uint8_t> want(raws[k].size());
      EXPECT_TRUE(codec::Decode(frames[k], want).ok());
      return Get(outs[k], raws[k].size()) == want;
    };
    std::vector<gpu::DecodeOp> v = ops();
    std::vector<gpu::DecodeResult> r = run(v);
    for (uint32_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(r[k].status.ok()) << k << ": " << r[k].status.ToString();
      EXPECT_TRUE(decoded(k)) << k;
    }
    v = ops();
    v[1].segment_crc = crcs[1] ^ 4;  // the header's CRC, not the frame's own
    r = run(v);
    EXPECT_EQ(r[1].check, gpu::DecodeCheck::kSegmentCrc);
    EXPECT_EQ(r[0].check, gpu::DecodeCheck::kSibling);
    EXPECT_EQ(r[2].check, gpu::DecodeCheck::kSibling);
    for (uint32_t k = 0; k < 3; ++k) {
      EXPECT_EQ(r[k].status.code(), StatusCode::kCorruption) << k;
      EXPECT_TRUE(untouched(k)) << "segment " << k << " was written";
    }
    v = ops();
    v[2].check_only = true;  // a segment the restore does not want
    v[2].segment_crc = crcs[2] + 1;
    r = run(v);
    EXPECT_EQ(r[2].check, gpu::DecodeCheck::kSegmentCrc);
    EXPECT_EQ(r[0].check, gpu::DecodeCheck::kSibling);
    EXPECT_TRUE(untouched(0) && untouched(1) && untouched(2));
    v = ops();
    v[2].check_only = true;
    r = run(v);
    EXPECT_TRUE(r[0].status.ok() && r[1].status.ok() && r[2].status.ok());
    EXPECT_TRUE(decoded(0) && decoded(1) && untouched(2));
    v = ops();
    v[0].dtype = static_cast<uint8_t>(codec::DType::kFp16);
    r = run(v);
    EXPECT_EQ(r[0].check, gpu::DecodeCheck::kFrame);
    EXPECT_TRUE(untouched(0) && untouched(1) && untouched(2));
    v = ops();
    for (gpu::DecodeOp& op : v) op.group = gpu::DecodeOp::kOwnGroup;
    v[1].segment_crc = crcs[1] ^ 1;
    r = run(v);
    EXPECT_EQ(r[1].check, gpu::DecodeCheck::kSegmentCrc);
    EXPECT_TRUE(decoded(0) && untouched(1) && decoded(2));
    // Refused before anything runs: a group out of range, a check-only op
    // without its CRC.
    v = ops();
    v[0].group = 3;
    EXPECT_EQ((*dec)->DecodeAsync(id, 128, v, *stream).code(), StatusCode::kInvalidArgument);
    v = ops();
    v[0].check_only = true;
    v[0].segment_crc.reset();
    EXPECT_EQ((*dec)->DecodeAsync(id, 128, v, *stream).code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(FrameDecoderSeam, RefusesMisalignedAddressesTooManyFramesAndNone) {
  auto dec = dev->CreateFrameDecoder(1);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  const std::vector<uint8_t> raw(4096, 0);
  const std::vector<uint8_t> frame = codec::testing::EncodeOrDie(CodecId::kAns, Info(), raw);
  const gpu::DevPtr in = Put(frame), out = Poisoned(raw.size() + 16);
  const gpu::DecodeOp misaligned{in, frame.size(), out + 8, raw.size()};
  EXPECT_EQ((*dec)->DecodeAsync(CodecId::kAns, 0, {&misaligned, 1}, *stream).code(),
            StatusCode::kInvalidArgument);
  const gpu::DecodeOp two[2] = {{in, frame.size(), out, raw.size()},
                                {in, frame.size(), out, raw.size()}};
  EXPECT_EQ((*dec)->DecodeAsync(CodecId::kAns, 0, two, *stream).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*dec)->DecodeAsync(CodecId::kNone, 0, {two, 1}, *stream).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(out, raw.size() + 16), std::vector<uint8_t>(raw.size() + 16, kPoison));
}

}  // namespace
}  // namespace orbitkv
