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
    Result<std::vector<Status>> r = (*dec)->Finish(*stream);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_TRUE((*r)[0].ok()) << (*r)[0].ToString();
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
  Result<std::vector<Status>> r = (*dec)->Finish(*stream);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  for (const Status& st : *r) EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  ASSERT_TRUE((*dec)->DecodeAsync(CodecId::kFp8, 128, {ops + 2, 1}, *stream).ok());
  r = (*dec)->Finish(*stream);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].code(), StatusCode::kCorruption) << "an ans frame decoded as fp8";
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Get(outs[i], n), std::vector<uint8_t>(n, kPoison)) << "op " << i << " wrote";
  }
  ASSERT_TRUE((*dec)->DecodeAsync(CodecId::kAns, 0, {ops + 3, 1}, *stream).ok());
  r = (*dec)->Finish(*stream);
  ASSERT_TRUE(r.ok() && (*r)[0].ok());
  EXPECT_EQ(Get(outs[3], n), raw);
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
