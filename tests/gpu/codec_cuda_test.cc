// The CUDA codec decoder and encoder (codec/codec_cuda.h) against the CPU
// ones, byte for byte, on KV-like, special, edge and random segments of every
// codec (GPU-encoded frames also decode on both sides); corrupted frames fail
// without writing (CRC, sizes) or as the CPU fails; and GPU decode and encode
// GB/s next to cudaMemcpy D2D (target for ans decode: >= 100 GB/s on the
// H200). Skips without a GPU.
#include "codec/codec_cuda.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>

#include "codec/codec.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

using testing::EncodeOrDie;
using testing::KvLikeSegment;
using testing::RandomBytes;
using testing::ResealFrame;
using testing::Skewed;

constexpr uint8_t kPoison = 0xcd;

struct Case {
  std::vector<uint8_t> frame;
  size_t decoded = 0;
};

// Device copies of frames and poisoned outputs, each 256-byte aligned.
class DeviceBatch {
 public:
  explicit DeviceBatch(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      in_off_.push_back(in_bytes_);
      out_off_.push_back(out_bytes_);
      in_bytes_ += (c.frame.size() + 255) / 256 * 256;
      out_bytes_ += (c.decoded + 255) / 256 * 256;
    }
    EXPECT_EQ(cudaMalloc(&in_, std::max<size_t>(in_bytes_, 256)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out_, std::max<size_t>(out_bytes_, 256)), cudaSuccess);
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(cudaMemcpy(in_ + in_off_[i], cases[i].frame.data(), cases[i].frame.size(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      frames_.push_back(
          {in_ + in_off_[i], cases[i].frame.size(), out_ + out_off_[i], cases[i].decoded});
    }
    Poison();
  }
  ~DeviceBatch() {
    cudaFree(in_);
    cudaFree(out_);
  }
  void Poison() {
    EXPECT_EQ(cudaMemset(out_, kPoison, std::max<size_t>(out_bytes_, 256)), cudaSuccess);
  }
  std::vector<uint8_t> Output(size_t i) const {
    std::vector<uint8_t> v(frames_[i].out_size);
    EXPECT_EQ(cudaMemcpy(v.data(), frames_[i].out, v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  std::span<const DeviceFrame> frames() const { return frames_; }
  std::vector<DeviceFrame>& mutable_frames() { return frames_; }

 private:
  uint8_t* in_ = nullptr;
  uint8_t* out_ = nullptr;
  size_t in_bytes_ = 0, out_bytes_ = 0;
  std::vector<size_t> in_off_, out_off_;
  std::vector<DeviceFrame> frames_;
};

class CodecCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = CudaDecoder::Create(1024);
    if (!d.ok()) GTEST_SKIP() << d.status().ToString();
    decoder_ = std::move(*d);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::vector<Status> Run(CodecId codec, const DeviceBatch& batch, uint32_t head_dim) {
    Status st = decoder_->DecodeAsync(codec, batch.frames(), head_dim, stream_);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto r = decoder_->Finish(stream_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<Status> out(batch.frames().size(), Status::Internal("failed"));
    if (r.ok()) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = (*r)[i].status;
    }
    return out;
  }

  // Decodes every case on the GPU and on the CPU: the same status class and,
  // when OK, the same bytes. Returns the number of cases that failed.
  int ExpectSameAsCpu(CodecId codec, const std::vector<Case>& cases, uint32_t head_dim) {
    DeviceBatch batch(cases);
    const std::vector<Status> gpu = Run(codec, batch, head_dim);
    int failed = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      std::vector<uint8_t> cpu(cases[i].decoded);
      const Status cst = Decode(cases[i].frame, cpu, codec);
      EXPECT_EQ(gpu[i].ok(), cst.ok())
          << "case " << i << ": GPU " << gpu[i].ToString() << ", CPU " << cst.ToString();
      if (!cst.ok()) {
        ++failed;
        continue;
      }
      const std::vector<uint8_t> out = batch.Output(i);
      EXPECT_EQ(std::memcmp(out.data(), cpu.data(), cpu.size()), 0)
          << CodecName(codec) << " case " << i << ": GPU bytes differ from the CPU's";
    }
    return failed;
  }

  std::unique_ptr<CudaDecoder> decoder_;
  cudaStream_t stream_ = nullptr;
};

std::vector<Case> Segments(CodecId codec, DType dtype, uint32_t head_dim) {
  std::vector<Case> cases;
  const SegmentInfo info{dtype, head_dim};
  auto add = [&](std::vector<uint8_t> raw, EncodeOptions o = {}) {
    cases.push_back({EncodeOrDie(codec, info, raw, o), raw.size()});
  };
  for (size_t elems : {size_t{head_dim}, size_t{head_dim} * 37, size_t{1} << 17, size_t{1} << 20}) {
    add(KvLikeSegment(elems, dtype, head_dim, elems));
  }
  add(std::vector<uint8_t>(size_t{head_dim} * 2 * 512, 0));
  if (codec == CodecId::kAns) {
    add(RandomBytes(1 << 16, 1));  // stored
    std::vector<uint8_t> all(65536 * 2);
    for (uint32_t v = 0; v < 65536; ++v) Store16(all.data() + 2 * v, static_cast<uint16_t>(v));
    add(all);
    add(KvLikeSegment(12345, dtype, head_dim, 5), {.ans_chunk_elements = 96});
    auto fp8 = KvLikeSegment(50001, DType::kBf16, 128, 6);
    fp8.resize(50001);
    cases.push_back({EncodeOrDie(codec, {DType::kFp8E4m3fn, head_dim}, fp8), fp8.size()});
  } else {
    std::vector<uint8_t> special(size_t{head_dim} * 2 * 4);
    for (size_t i = 0; i < special.size() / 2; ++i) {
      const uint16_t v[] = {0x7f80, 0xff80, 0x7fc0, 0x0001, 0x8000, 0x3f80, 0x0000, 0x4000};
      Store16(special.data() + 2 * i, v[i % 8]);
    }
    add(special);
  }
  return cases;
}

struct CodecCase {
  CodecId codec;
  DType dtype;
  uint32_t head_dim;
};

class CodecCudaMatrixTest : public CodecCudaTest,
                            public ::testing::WithParamInterface<CodecCase> {};

TEST_P(CodecCudaMatrixTest, GpuDecodeGivesTheCpuBytes) {
  const CodecCase& p = GetParam();
  EXPECT_EQ(ExpectSameAsCpu(p.codec, Segments(p.codec, p.dtype, p.head_dim), p.head_dim), 0);
}

TEST_P(CodecCudaMatrixTest, CorruptFramesFailAsOnTheCpu) {
  const CodecCase& p = GetParam();
  const auto raw = KvLikeSegment(size_t{p.head_dim} * 300, p.dtype, p.head_dim, 9);
  const auto good = EncodeOrDie(p.codec, {p.dtype, p.head_dim}, raw, {.ans_chunk_elements = 1024});
  // Unsealed flips: the GPU CRC catches every one and writes nothing.
  std::vector<Case> flipped;
  for (size_t i = 0; i < good.size(); i += std::max<size_t>(1, good.size() / 200)) {
    auto bad = good;
    bad[i] ^= static_cast<uint8_t>(1u << (i % 8));
    flipped.push_back({bad, raw.size()});
  }
  {
    DeviceBatch batch(flipped);
    const auto st = Run(p.codec, batch, p.head_dim);
    for (size_t i = 0; i < flipped.size(); ++i) {
      EXPECT_EQ(st[i].code(), StatusCode::kCorruption) << i;
      const auto out = batch.Output(i);
      EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == kPoison; }))
          << "case " << i << ": a frame that failed its CRC wrote bytes";
    }
  }
  // Sealed mutations reach the codec headers and streams: the GPU must agree
  // with the CPU on which fail and on the bytes of those that decode.
  std::vector<Case> sealed;
  for (size_t i = 0; i < std::min<size_t>(good.size(), 2000); i += 3) {
    if (i >= kFrameCrcOffset && i < kFrameCrcOffset + 4) continue;
    if (i >= 8 && i < 24) continue;  // the sizes: the caller's own, checked below
    auto bad = good;
    bad[i] ^= 0x24;
    ResealFrame(bad);
    sealed.push_back({bad, raw.size()});
  }
  EXPECT_GT(ExpectSameAsCpu(p.codec, sealed, p.head_dim), 0);
  if (p.codec == CodecId::kAns) {
    // Chunk 1 moved by 2 bytes, its size kept: a misaligned u32 load of its
    // lane states would poison the CUDA context; it must be Corruption.
    auto shifted = good;
    const uint8_t* d = shifted.data() + kAnsPlaneDescOffset + kAnsPlaneDescBytes;
    ASSERT_EQ(d[0], kAnsPlaneRans);
    uint8_t* ends = shifted.data() + Load32(d + 12) + kAnsFreqTableBytes;
    ASSERT_GE(Load32(shifted.data() + kAnsChunksOffset), 3u);
    Store32(ends, Load32(ends) + 2);
    Store32(ends + 4, Load32(ends + 4) + 2);
    ResealFrame(shifted);
    EXPECT_EQ(ExpectSameAsCpu(p.codec, {{shifted, raw.size()}}, p.head_dim), 1);
  }
  // Sizes that disagree with the caller's: refused before any write.
  std::vector<Case> one = {{good, raw.size()}};
  DeviceBatch batch(one);
  batch.mutable_frames()[0].out_size -= 2;
  EXPECT_EQ(Run(p.codec, batch, p.head_dim)[0].code(), StatusCode::kCorruption);
  batch.mutable_frames()[0].out_size += 2;
  batch.mutable_frames()[0].frame_size -= 16;
  EXPECT_EQ(Run(p.codec, batch, p.head_dim)[0].code(), StatusCode::kCorruption);
  const CodecId other = p.codec == CodecId::kAns ? CodecId::kFp8 : CodecId::kAns;
  batch.mutable_frames()[0].frame_size += 16;
  EXPECT_EQ(Run(other, batch, p.head_dim)[0].code(), StatusCode::kCorruption);
  EXPECT_TRUE(Run(p.codec, batch, p.head_dim)[0].ok());
}

// An object's segments as one decode group (the GPU decode lane's tasks):
// the stored bytes' CRC32C (the object header's segment CRC, derived on the
// GPU from the frame CRC pass) and the dtype are checked before any write; a
// failure in one segment, a check-only one included, leaves every output of
// the group untouched and fails the others as siblings.
TEST_P(CodecCudaMatrixTest, ObjectChecksGateTheWholeGroup) {
  const CodecCase& p = GetParam();
  std::vector<Case> cases;
  std::vector<uint32_t> crcs;
  for (uint32_t k = 0; k < 3; ++k) {
    const auto raw = KvLikeSegment(size_t{p.head_dim} * (64 + 13 * k), p.dtype, p.head_dim, 20 + k);
    cases.push_back({EncodeOrDie(p.codec, {p.dtype, p.head_dim}, raw), raw.size()});
    crcs.push_back(Crc32c(cases.back().frame));
  }
  DeviceBatch batch(cases);
  auto reset = [&] {
    batch.Poison();
    for (size_t i = 0; i < cases.size(); ++i) {
      DeviceFrame& f = batch.mutable_frames()[i];
      f.segment_crc = crcs[i];
      f.dtype = static_cast<uint8_t>(p.dtype);
      f.param = p.codec == CodecId::kFp8 || p.codec == CodecId::kAns
                    ? std::nullopt
                    : std::optional<uint32_t>(p.head_dim);
      f.check_only = false;
      f.group = 0;
    }
  };
  auto run = [&] {
    EXPECT_TRUE(decoder_->DecodeAsync(p.codec, batch.frames(), p.head_dim, stream_).ok());
    auto r = decoder_->Finish(stream_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::vector<gpu::DecodeResult>(cases.size());
  };
  auto untouched = [&](size_t i) {
    const auto out = batch.Output(i);
    return std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == kPoison; });
  };
  auto same_as_cpu = [&](size_t i) {
    std::vector<uint8_t> cpu(cases[i].decoded);
    EXPECT_TRUE(Decode(cases[i].frame, cpu, p.codec).ok());
    return batch.Output(i) == cpu;
  };
  reset();
  auto r = run();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(r[i].status.ok()) << i << ": " << r[i].status.ToString();
    EXPECT_TRUE(same_as_cpu(i)) << i;
  }
  // A wrong segment CRC in the middle segment.
  reset();
  batch.mutable_frames()[1].segment_crc = crcs[1] ^ 1;
  r = run();
  EXPECT_EQ(r[1].check, gpu::DecodeCheck::kSegmentCrc);
  EXPECT_EQ(r[0].check, gpu::DecodeCheck::kSibling);
  EXPECT_EQ(r[2].check, gpu::DecodeCheck::kSibling);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(r[i].status.code(), StatusCode::kCorruption) << i;
    EXPECT_TRUE(untouched(i)) << "segment " << i << " was written";
  }
  // A check-only segment (not restored) with a wrong CRC stops the others.
  reset();
  batch.mutable_frames()[2].check_only = true;
  batch.mutable_frames()[2].segment_crc = crcs[2] ^ 0x80000000u;
  r = run();
  EXPECT_EQ(r[2].check, gpu::DecodeCheck::kSegmentCrc);
  EXPECT_EQ(r[0].check, gpu::DecodeCheck::kSibling);
  EXPECT_TRUE(untouched(0) && untouched(1));
  // ... and with its right CRC lets them decode, itself unwritten.
  reset();
  batch.mutable_frames()[2].check_only = true;
  r = run();
  EXPECT_TRUE(r[0].status.ok() && r[1].status.ok() && r[2].status.ok());
  EXPECT_TRUE(same_as_cpu(0) && same_as_cpu(1));
  EXPECT_TRUE(untouched(2));
  // Another dtype than the namespace's: a frame check, nothing written.
  reset();
  batch.mutable_frames()[0].dtype = p.dtype == DType::kBf16 ? static_cast<uint8_t>(DType::kFp16)
                                                            : static_cast<uint8_t>(DType::kBf16);
  r = run();
  EXPECT_EQ(r[0].check, gpu::DecodeCheck::kFrame);
  EXPECT_TRUE(untouched(0) && untouched(1) && untouched(2));
  // Own groups: only the failing frame stays unwritten.
  reset();
  for (DeviceFrame& f : batch.mutable_frames()) f.group = gpu::DecodeOp::kOwnGroup;
  batch.mutable_frames()[1].segment_crc = crcs[1] + 1;
  r = run();
  EXPECT_TRUE(r[0].status.ok() && r[2].status.ok());
  EXPECT_EQ(r[1].check, gpu::DecodeCheck::kSegmentCrc);
  EXPECT_TRUE(untouched(1) && same_as_cpu(0) && same_as_cpu(2));
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecCudaMatrixTest,
                         ::testing::Values(CodecCase{CodecId::kAns, DType::kBf16, 128},
                                           CodecCase{CodecId::kAns, DType::kFp16, 128},
                                           CodecCase{CodecId::kFp8, DType::kBf16, 128},
                                           CodecCase{CodecId::kFp8, DType::kFp16, 64},
                                           CodecCase{CodecId::kTurboQuant4, DType::kBf16, 128},
                                           CodecCase{CodecId::kTurboQuant3, DType::kBf16, 128},
                                           CodecCase{CodecId::kTurboQuant4, DType::kFp16, 64},
                                           CodecCase{CodecId::kTurboQuant3, DType::kBf16, 256},
                                           CodecCase{CodecId::kTurboQuant4, DType::kBf16, 32},
                                           CodecCase{CodecId::kTurboQuant3, DType::kBf16, 1024}),
                         [](const auto& info) {
                           std::string n(CodecName(info.param.codec));
                           for (auto& c : n) c = c == '-' ? '_' : c;
                           return n + (info.param.dtype == DType::kBf16 ? "_bf16_" : "_fp16_") +
                                  std::to_string(info.param.head_dim);
                         });

// Encodes raws[i] (all of `info`) on the GPU into buffers of MaxEncodedSize
// and expects the CPU's frames byte for byte, their sizes from Finish; then
// decodes the GPU's frames on the GPU and on the CPU back to raws[i].
void ExpectGpuEncodeGivesCpuFrames(CodecId codec, const SegmentInfo& info,
                                   const std::vector<std::vector<uint8_t>>& raws,
                                   const EncodeOptions& options, cudaStream_t stream) {
  auto enc = CudaEncoder::Create(static_cast<uint32_t>(raws.size()));
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  std::vector<Case> inputs, buffers;
  std::vector<std::vector<uint8_t>> expected;
  for (const auto& r : raws) {
    inputs.push_back({r, r.size()});
    buffers.push_back({std::vector<uint8_t>(MaxEncodedSize(codec, info, r.size()), 0), r.size()});
    expected.push_back(EncodeOrDie(codec, info, r, options));
  }
  DeviceBatch in(inputs), out(buffers);
  // Uninitialised device memory in the frame buffers: every frame byte must be written.
  for (size_t i = 0; i < raws.size(); ++i) {
    ASSERT_EQ(
        cudaMemset(const_cast<uint8_t*>(out.frames()[i].frame), kPoison, buffers[i].frame.size()),
        cudaSuccess);
  }
  std::vector<DeviceSegment> segs;
  for (size_t i = 0; i < raws.size(); ++i) {
    segs.push_back({in.frames()[i].frame, raws[i].size(),
                    const_cast<uint8_t*>(out.frames()[i].frame), buffers[i].frame.size()});
  }
  const Status st = (*enc)->EncodeAsync(codec, info, segs, stream, options);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto sizes = (*enc)->Finish(stream);
  ASSERT_TRUE(sizes.ok()) << sizes.status().ToString();
  ASSERT_EQ(sizes->size(), raws.size());
  std::vector<Case> gpu_frames;
  for (size_t i = 0; i < raws.size(); ++i) {
    ASSERT_EQ((*sizes)[i], expected[i].size())
        << CodecName(codec) << " segment " << i << " (" << raws[i].size() << " bytes)";
    std::vector<uint8_t> got(expected[i].size());
    ASSERT_EQ(cudaMemcpy(got.data(), segs[i].frame, got.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got, expected[i]) << CodecName(codec) << " segment " << i << " (" << raws[i].size()
                                << " bytes): GPU frame differs from the CPU's";
    gpu_frames.push_back({got, raws[i].size()});
  }
  if (!CodecIsLossless(codec)) return;
  // Frames from the GPU decode on both sides.
  auto dec = CudaDecoder::Create(static_cast<uint32_t>(raws.size()));
  ASSERT_TRUE(dec.ok());
  DeviceBatch batch(gpu_frames);
  ASSERT_TRUE((*dec)->DecodeAsync(codec, batch.frames(), info.head_dim, stream).ok());
  auto res = (*dec)->Finish(stream);
  ASSERT_TRUE(res.ok());
  for (size_t i = 0; i < raws.size(); ++i) {
    EXPECT_TRUE((*res)[i].status.ok()) << i << ": " << (*res)[i].status.ToString();
    EXPECT_EQ(batch.Output(i), raws[i]) << "GPU decode of GPU frame " << i;
    std::vector<uint8_t> cpu(raws[i].size());
    EXPECT_TRUE(Decode(gpu_frames[i].frame, cpu, codec).ok());
    EXPECT_EQ(cpu, raws[i]) << "CPU decode of GPU frame " << i;
  }
}

// The GPU encoders write the CPU's frames byte for byte (every codec, bf16
// and fp16, special values, every head_dim).
TEST_P(CodecCudaMatrixTest, GpuEncodeGivesTheCpuFrames) {
  const CodecCase& p = GetParam();
  const SegmentInfo info{p.dtype, p.head_dim};
  const EncodeOptions options{.turboquant_seed = 0x1234abcd5678ull};
  std::vector<std::vector<uint8_t>> raws;
  for (size_t elems : {size_t{p.head_dim}, size_t{p.head_dim} * 37, size_t{1} << 17}) {
    raws.push_back(KvLikeSegment(elems, p.dtype, p.head_dim, elems + 3));
  }
  raws.push_back(std::vector<uint8_t>(size_t{p.head_dim} * 2 * 5, 0));
  std::vector<uint8_t> special(size_t{p.head_dim} * 2 * 4);
  const uint16_t values[] = {0x7f80, 0xff80, 0x7fc0, 0x0001, 0x8000, 0x3f80, 0x0000, 0x4000};
  for (size_t i = 0; i < special.size() / 2; ++i) Store16(special.data() + 2 * i, values[i % 8]);
  raws.push_back(special);
  ExpectGpuEncodeGivesCpuFrames(p.codec, info, raws, options, stream_);
}

// The GPU ans encoder on edge inputs and every frame form (stored: empty,
// tiny, max entropy, 32-element chunks; one raw plane: KV-like; all planes
// coded: all-equal, skewed), every dtype, odd sizes and chunk options.
TEST_F(CodecCudaTest, GpuAnsEncodeGivesTheCpuFramesOnEdgeInputs) {
  for (DType t : {DType::kBf16, DType::kFp16, DType::kFp8E4m3fn}) {
    const size_t eb = DTypeBytes(t);
    std::vector<std::vector<uint8_t>> raws = {
        {},
        std::vector<uint8_t>(eb, 0x3c),
        std::vector<uint8_t>(eb * 100000, 0),
        std::vector<uint8_t>(eb * 40097, 0x7f),
        RandomBytes(eb * 50001, 2),
        Skewed(eb * 77777, 0.02, 3),
        Skewed(eb * 333, 0.3, 4),
    };
    for (size_t elems : {size_t{128}, size_t{12345}, size_t{1} << 17, (size_t{1} << 20) + 3}) {
      auto kv = KvLikeSegment(elems, t == DType::kFp16 ? t : DType::kBf16, 128, elems);
      kv.resize(elems * eb);
      raws.push_back(kv);
    }
    if (t != DType::kFp8E4m3fn) {
      std::vector<uint8_t> all(65536 * 2);
      for (uint32_t v = 0; v < 65536; ++v) Store16(all.data() + 2 * v, static_cast<uint16_t>(v));
      raws.push_back(all);
    }
    for (uint32_t chunk : {0u, 32u, 96u, 2048u, 1u << 20}) {
      SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(t)) + ", chunk " +
                   std::to_string(chunk));
      ExpectGpuEncodeGivesCpuFrames(CodecId::kAns, {t, 128}, raws, {.ans_chunk_elements = chunk},
                                    stream_);
    }
  }
}

TEST_F(CodecCudaTest, GpuAnsEncodeRefusesWhatTheCpuRefuses) {
  auto enc = CudaEncoder::Create(2);
  ASSERT_TRUE(enc.ok());
  uint8_t* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);
  const SegmentInfo bf16{DType::kBf16, 128};
  auto code = [&](const DeviceSegment& s, const SegmentInfo& info, uint32_t chunk = 0) {
    return (*enc)
        ->EncodeAsync(CodecId::kAns, info, {&s, 1}, stream_, {.ans_chunk_elements = chunk})
        .code();
  };
  EXPECT_EQ(code({buf, 3, buf + 4096, 4096}, bf16), StatusCode::kInvalidArgument);     // odd size
  EXPECT_EQ(code({buf, 1000, buf + 4096, 1000}, bf16), StatusCode::kInvalidArgument);  // capacity
  EXPECT_EQ(code({buf + 2, 1000, buf + 4096, 4096}, bf16), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({buf, 1000, buf + 4096, 4096}, bf16, 48), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({buf, 1000, buf + 4096, 4096}, {static_cast<DType>(9), 128}),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*enc)->Finish(stream_).ok());
  cudaFree(buf);
}

// Decoded GB/s of a batch of 64 segments of 4 MiB (KV-like bf16), CRC
// check included, next to a device-to-device copy of the same bytes.
TEST_F(CodecCudaTest, DecodeThroughput) {
  constexpr size_t kSegment = 4 << 20, kCount = 64;
  for (CodecId codec :
       {CodecId::kAns, CodecId::kFp8, CodecId::kTurboQuant4, CodecId::kTurboQuant3}) {
    const auto raw = KvLikeSegment(kSegment / 2, DType::kBf16, 128, 77);
    const Case one{EncodeOrDie(codec, {DType::kBf16, 128}, raw), raw.size()};
    const std::vector<Case> cases(kCount, one);
    DeviceBatch batch(cases);
    ASSERT_TRUE(Run(codec, batch, 128)[0].ok());
    std::vector<uint8_t> cpu(raw.size());
    ASSERT_TRUE(Decode(one.frame, cpu).ok());
    EXPECT_EQ(batch.Output(kCount - 1), cpu);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    constexpr int kIters = 20;
    float ms = 0;
    for (int i = 0; i < kIters; ++i) {
      // DecodeAsync then Finish per batch, as a caller does (Finish's
      // synchronisation is in the time).
      cudaEventRecord(start, stream_);
      ASSERT_TRUE(decoder_->DecodeAsync(codec, batch.frames(), 128, stream_).ok());
      auto st = decoder_->Finish(stream_);
      cudaEventRecord(stop, stream_);
      cudaEventSynchronize(stop);
      ASSERT_TRUE(st.ok());
      for (const gpu::DecodeResult& r : *st) ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      float one_ms = 0;
      cudaEventElapsedTime(&one_ms, start, stop);
      ms += one_ms;
    }
    const double gbs = double(kSegment) * kCount * kIters / (ms * 1e-3) / 1e9;
    // A D2D copy of the decoded bytes, for scale.
    uint8_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, kSegment * kCount), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, kSegment * kCount), cudaSuccess);
    cudaEventRecord(start, stream_);
    for (int i = 0; i < kIters; ++i)
      cudaMemcpyAsync(b, a, kSegment * kCount, cudaMemcpyDeviceToDevice, stream_);
    cudaEventRecord(stop, stream_);
    cudaEventSynchronize(stop);
    float copy_ms = 0;
    cudaEventElapsedTime(&copy_ms, start, stop);
    cudaFree(a);
    cudaFree(b);
    {
      // GPU encode of the same batch, into buffers of MaxEncodedSize, then
      // into the batch's frame buffers for the decode check below.
      auto enc = CudaEncoder::Create(kCount);
      ASSERT_TRUE(enc.ok());
      uint8_t* raw_dev = nullptr;
      ASSERT_EQ(cudaMalloc(&raw_dev, raw.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(raw_dev, raw.data(), raw.size(), cudaMemcpyHostToDevice), cudaSuccess);
      const size_t cap = (MaxEncodedSize(codec, {DType::kBf16, 128}, raw.size()) + 255) / 256 * 256;
      uint8_t* frames_dev = nullptr;
      ASSERT_EQ(cudaMalloc(&frames_dev, cap * kCount), cudaSuccess);
      std::vector<DeviceSegment> segs;
      for (size_t i = 0; i < kCount; ++i) {
        segs.push_back({raw_dev, raw.size(), frames_dev + cap * i, cap});
      }
      float enc_ms = 0;
      for (int i = 0; i < kIters; ++i) {
        cudaEventRecord(start, stream_);
        ASSERT_TRUE((*enc)->EncodeAsync(codec, {DType::kBf16, 128}, segs, stream_).ok());
        auto sizes = (*enc)->Finish(stream_);
        cudaEventRecord(stop, stream_);
        cudaEventSynchronize(stop);
        ASSERT_TRUE(sizes.ok());
        for (uint64_t n : *sizes) ASSERT_EQ(n, one.frame.size());
        float one_ms = 0;
        cudaEventElapsedTime(&one_ms, start, stop);
        enc_ms += one_ms;
      }
      std::vector<uint8_t> first(one.frame.size());
      ASSERT_EQ(cudaMemcpy(first.data(), frames_dev, first.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(first, one.frame) << "GPU-encoded frame differs from the CPU's";
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(cudaMemcpy(const_cast<uint8_t*>(batch.frames()[i].frame), frames_dev + cap * i,
                             one.frame.size(), cudaMemcpyDeviceToDevice),
                  cudaSuccess);
      }
      cudaFree(frames_dev);
      cudaFree(raw_dev);
      ASSERT_TRUE(Run(codec, batch, 128)[0].ok()) << "GPU-encoded frames decode";
      EXPECT_EQ(batch.Output(0), cpu);
      std::printf(
          "GPU %-13s encode: %7.1f GB/s of raw bytes (CRC included); cudaMemcpy D2D %7.1f GB/s\n",
          std::string(CodecName(codec)).c_str(),
          double(kSegment) * kCount * kIters / (enc_ms * 1e-3) / 1e9,
          double(kSegment) * kCount * kIters / (copy_ms * 1e-3) / 1e9);
    }
    std::printf(
        "GPU %-13s decode: %7.1f GB/s of decoded bytes (ratio %.3f, %zu x 4 MiB, CRC "
        "included); cudaMemcpy D2D %7.1f GB/s\n",
        std::string(CodecName(codec)).c_str(), gbs, double(raw.size()) / one.frame.size(), kCount,
        double(kSegment) * kCount * kIters / (copy_ms * 1e-3) / 1e9);
    if (codec == CodecId::kAns) {
      std::printf("ans GPU decode target (>= 100 GB/s): %s\n", gbs >= 100 ? "met" : "NOT met");
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
}

}  // namespace
}  // namespace orbitkv::codec
