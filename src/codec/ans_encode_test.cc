// The CUDA ans encoder's passes (codec_kernels.cu over codec/ans_encode.h),
// emulated on the CPU block by block and warp by warp with the same
// __host__ __device__ functions: histograms, tables, the word-count pass (a
// ballot per step), the layout and header, the write pass (each word at its
// final place), the CRC; the frames must be the CPU encoder's byte for byte,
// with every frame byte written (the buffer starts poisoned, as device memory
// is uninitialised). Inputs: empty, single elements, all-equal, max entropy,
// KV-like, skewed and random shapes, odd sizes, every dtype, chunk options,
// and every frame form (stored, one raw plane, all planes coded).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "codec/ans_encode.h"
#include "codec/codec.h"
#include "codec/codec_test_util.h"

namespace orbitkv::codec {
namespace {

using internal::AnsEncTable;
using internal::AnsFrameLayout;
using testing::EncodeOrDie;
using testing::KvLikeSegment;
using testing::RandomBytes;
using testing::Skewed;

constexpr uint8_t kPoison = 0xcd;

// What codec_kernels.h's AnsEncodeJob holds, with host scratch.
struct Job {
  const uint8_t* raw;
  uint64_t raw_size;
  uint8_t* frame;
  uint32_t planes, chunk, chunks;
  uint8_t dtype;
  uint32_t counts[kAnsMaxPlanes * 256] = {};
  AnsEncTable tables[kAnsMaxPlanes] = {};
  std::vector<uint32_t> words;
  AnsFrameLayout layout{};
};

// AnsEncodeChunkWarp with the 32 lanes run in lockstep.
uint32_t EmulateChunkWarp(const Job& job, uint32_t p, uint32_t c, const AnsEncTable& t,
                          const uint64_t* rcp, uint8_t* stream, uint32_t total) {
  const uint64_t elems = job.raw_size / job.planes;
  const uint64_t first = uint64_t{c} * job.chunk;
  const uint32_t n = internal::AnsChunkLength(elems, job.chunk, c);
  uint8_t* words = stream == nullptr ? nullptr : stream + kAnsStatesBytes;
  uint32_t x[kAnsLanes];
  std::fill(x, x + kAnsLanes, kAnsStateLow);
  uint32_t emitted = 0;
  for (uint32_t step = (n + kAnsLanes - 1) / kAnsLanes; step-- > 0;) {
    bool active[kAnsLanes], renorm[kAnsLanes];
    uint8_t sym[kAnsLanes];
    uint32_t mask = 0;  // __ballot_sync
    for (uint32_t lane = 0; lane < kAnsLanes; ++lane) {
      const uint32_t i = step * kAnsLanes + lane;
      active[lane] = i < n;
      sym[lane] = active[lane] ? job.raw[(first + i) * job.planes + p] : 0;
      renorm[lane] = active[lane] && internal::AnsRenorm(x[lane], t.freq[sym[lane]]);
      mask |= uint32_t{renorm[lane]} << lane;
    }
    for (uint32_t lane = 0; lane < kAnsLanes; ++lane) {
      if (active[lane]) {
        internal::AnsEncodeLane(&x[lane], sym[lane], renorm[lane], mask, lane, emitted, t, rcp,
                                words, total);
      }
    }
    emitted += internal::AnsPopcount(mask);
  }
  if (stream != nullptr) {
    for (uint32_t lane = 0; lane < kAnsLanes; ++lane) Store32(stream + 4 * lane, x[lane]);
    if (total % 2 != 0) Store16(words + 2 * total, 0);
  }
  return emitted;
}

void LoadRcp(const Job& job, uint64_t (*rcp)[256]) {
  for (uint32_t p = 0; p < job.planes; ++p) {
    for (int s = 0; s < 256; ++s) rcp[p][s] = internal::AnsReciprocal(job.tables[p].freq[s]);
  }
}

// The whole GPU pipeline for one segment; returns the frame.
std::vector<uint8_t> EmulateGpuEncode(DType dtype, const std::vector<uint8_t>& raw,
                                      uint32_t chunk_option) {
  Job job;
  job.raw = raw.data();
  job.raw_size = raw.size();
  job.planes = static_cast<uint32_t>(DTypeBytes(dtype));
  job.dtype = static_cast<uint8_t>(dtype);
  const uint64_t elems = raw.size() / job.planes;
  job.chunk = internal::AnsChunkElements(elems, chunk_option);
  job.chunks = internal::AnsChunkCount(elems, job.chunk);
  job.words.assign(uint64_t{job.planes} * job.chunks, 0);
  std::vector<uint8_t> frame(MaxEncodedSize(CodecId::kAns, {dtype, 128}, raw.size()), kPoison);
  job.frame = frame.data();

  // AnsHistogramKernel, AnsTableKernel.
  for (uint64_t b = 0; b < raw.size(); ++b) {
    ++job.counts[(job.planes == 2 ? (b & 1) : 0) * 256 + raw[b]];
  }
  for (uint32_t p = 0; p < job.planes && elems > 0; ++p) {
    internal::AnsBuildEncTable(job.counts + 256 * p, elems, &job.tables[p]);
  }
  uint64_t rcp[kAnsMaxPlanes][256] = {};
  LoadRcp(job, rcp);
  // AnsCountKernel.
  for (uint64_t item = 0; item < job.words.size(); ++item) {
    const auto p = static_cast<uint32_t>(item / job.chunks);
    const auto c = static_cast<uint32_t>(item % job.chunks);
    job.words[item] = EmulateChunkWarp(job, p, c, job.tables[p], rcp[p], nullptr, 0);
  }
  // AnsLayoutKernel.
  uint64_t coded[kAnsMaxPlanes] = {};
  for (uint64_t item = 0; item < job.words.size(); ++item) {
    coded[item / job.chunks] += internal::AnsStreamBytes(job.words[item]);
  }
  job.layout = internal::AnsPlanFrame(job.planes, elems, job.chunks, coded, raw.size());
  const AnsFrameLayout& l = job.layout;
  const uint16_t* freq[kAnsMaxPlanes] = {job.tables[0].freq, job.tables[1].freq};
  internal::AnsWriteHeader(job.frame, l, kAnsFormatVersion, job.dtype, raw.size(), job.chunk,
                           job.chunks, freq);
  if (!l.stored) {
    for (uint32_t p = 0; p < job.planes; ++p) {
      if (l.mode[p] != kAnsPlaneRans) continue;
      uint32_t running = 0;
      for (uint32_t c = 0; c < job.chunks; ++c) {
        running += internal::AnsStreamBytes(job.words[uint64_t{p} * job.chunks + c]);
        Store32(job.frame + l.table_off[p] + kAnsFreqTableBytes + 4 * uint64_t{c}, running);
      }
    }
  }
  // AnsWriteKernel.
  if (l.stored) {
    std::copy(raw.begin(), raw.end(), job.frame + kFramePrefixBytes);
  } else {
    for (uint64_t item = 0; item < job.words.size(); ++item) {
      const auto p = static_cast<uint32_t>(item / job.chunks);
      const auto c = static_cast<uint32_t>(item % job.chunks);
      uint8_t* data = job.frame + l.data_off[p];
      const uint64_t first = uint64_t{c} * job.chunk;
      if (l.mode[p] == kAnsPlaneRaw) {
        const uint32_t n = internal::AnsChunkLength(elems, job.chunk, c);
        for (uint32_t i = 0; i < n; ++i) data[first + i] = raw[(first + i) * job.planes + p];
        if (c + 1 == job.chunks) {
          for (uint64_t i = elems; i < internal::AnsAlign4(elems); ++i) data[i] = 0;
        }
        continue;
      }
      const uint8_t* ends = job.frame + l.table_off[p] + kAnsFreqTableBytes;
      const uint32_t begin = c == 0 ? 0 : Load32(ends + 4 * (uint64_t{c} - 1));
      EmulateChunkWarp(job, p, c, job.tables[p], rcp[p], data + begin, job.words[item]);
    }
  }
  frame.resize(l.frame_size);
  // FrameCrcKernel, StoreCrcKernel.
  Store32(frame.data() + kFrameCrcOffset, FrameCrc(frame));
  return frame;
}

enum class Form { kStored, kOneRawPlane, kAllCoded };

Form FormOf(const std::vector<uint8_t>& frame) {
  if (frame[kPrefixFlags] & kFrameFlagStored) return Form::kStored;
  for (uint32_t p = 0; p < frame[kAnsPlanesOffset]; ++p) {
    if (frame[kAnsPlaneDescOffset + kAnsPlaneDescBytes * p] == kAnsPlaneRaw) {
      return Form::kOneRawPlane;
    }
  }
  return Form::kAllCoded;
}

// The emulated GPU frame against the CPU's; returns its form.
Form ExpectCpuFrame(DType dtype, const std::vector<uint8_t>& raw, uint32_t chunk = 0) {
  const std::vector<uint8_t> cpu =
      EncodeOrDie(CodecId::kAns, {dtype, 128}, raw, {.ans_chunk_elements = chunk});
  const std::vector<uint8_t> gpu = EmulateGpuEncode(dtype, raw, chunk);
  EXPECT_EQ(gpu.size(), cpu.size()) << raw.size() << " bytes, chunk " << chunk;
  if (gpu.size() == cpu.size()) {
    const auto diff = std::mismatch(gpu.begin(), gpu.end(), cpu.begin());
    EXPECT_TRUE(diff.first == gpu.end())
        << raw.size() << " bytes, chunk " << chunk << ": first difference at byte "
        << (diff.first - gpu.begin()) << " of " << gpu.size();
  }
  std::vector<uint8_t> back(raw.size(), kPoison);
  EXPECT_TRUE(Decode(gpu, back, CodecId::kAns).ok());
  EXPECT_EQ(back, raw);
  return FormOf(cpu);
}

TEST(AnsGpuEncodeEmulationTest, QuotientIsTheDivision) {
  std::mt19937_64 rng(1);
  for (uint32_t f = 1; f <= kAnsProbScale; ++f) {
    const uint64_t rcp = internal::AnsReciprocal(f);
    for (uint32_t x : {0u, 1u, f - 1, f, 0xffffffffu, 0xfffffffeu, static_cast<uint32_t>(rng())}) {
      ASSERT_EQ(internal::AnsQuotient(x, rcp), x / f) << x << " / " << f;
    }
  }
}

TEST(AnsGpuEncodeEmulationTest, EdgeInputs) {
  for (DType t : {DType::kBf16, DType::kFp16, DType::kFp8E4m3fn}) {
    const size_t eb = DTypeBytes(t);
    EXPECT_EQ(ExpectCpuFrame(t, {}), Form::kStored);
    EXPECT_EQ(ExpectCpuFrame(t, std::vector<uint8_t>(eb, 0x3c)), Form::kStored);
    // All-equal: every lane stays at its initial state, no words.
    EXPECT_EQ(ExpectCpuFrame(t, std::vector<uint8_t>(eb * 100000, 0)), Form::kAllCoded);
    EXPECT_EQ(ExpectCpuFrame(t, std::vector<uint8_t>(eb * 40097, 0x7f), 2048), Form::kAllCoded);
    // 128 bytes of lane states per 32 elements: never smaller than stored.
    EXPECT_EQ(ExpectCpuFrame(t, std::vector<uint8_t>(eb * 4097, 0x7f), 32), Form::kStored);
    // Maximum entropy: stored.
    EXPECT_EQ(ExpectCpuFrame(t, RandomBytes(eb * 50001, 2)), Form::kStored);
    EXPECT_EQ(ExpectCpuFrame(t, Skewed(eb * 77777, 0.02, 3)), Form::kAllCoded);
  }
}

TEST(AnsGpuEncodeEmulationTest, KvLikeSegmentsEveryChunkOption) {
  for (DType t : {DType::kBf16, DType::kFp16}) {
    for (size_t elems : {size_t{128}, size_t{12345}, size_t{1} << 17, (size_t{1} << 20) + 3}) {
      for (uint32_t chunk : {0u, 32u, 96u, 2048u, 1u << 20}) {
        if (chunk == 32 && elems > 20000) continue;  // 32-element chunks only cost states
        const Form f = ExpectCpuFrame(t, KvLikeSegment(elems, t, 128, elems + chunk), chunk);
        if (elems >= 12345 && chunk >= 2048) {
          EXPECT_EQ(f, Form::kOneRawPlane) << elems << "/" << chunk;
        }
      }
    }
  }
}

TEST(AnsGpuEncodeEmulationTest, EveryFrameFormAndOddSizes) {
  int forms[3] = {};
  std::mt19937_64 rng(4);
  for (int i = 0; i < 160; ++i) {
    const DType t = static_cast<DType>(1 + rng() % 3);
    const size_t eb = DTypeBytes(t);
    const size_t elems = i % 20 == 0 ? rng() % 400000 : rng() % 9000;
    std::vector<uint8_t> raw;
    switch (rng() % 4) {
      case 0:
        raw = RandomBytes(elems * eb, rng());
        break;
      case 1:
        raw = Skewed(elems * eb, 0.05 + 0.5 * (rng() % 100) / 100.0, rng());
        break;
      case 2:  // a random low plane, a skewed high one
        raw = Skewed(elems * eb, 0.3, rng());
        for (size_t k = 0; k < raw.size(); k += eb) raw[k] = static_cast<uint8_t>(rng());
        break;
      default:
        raw = KvLikeSegment(elems, DType::kBf16, 128, rng());
        raw.resize(elems * eb);
    }
    const uint32_t chunk = rng() % 3 == 0 ? 32 * (1 + rng() % 300) : 0;
    ++forms[static_cast<int>(ExpectCpuFrame(t, raw, chunk))];
  }
  EXPECT_GT(forms[0], 0) << "stored";
  EXPECT_GT(forms[1], 0) << "one raw plane";
  EXPECT_GT(forms[2], 0) << "all planes coded";
}

}  // namespace
}  // namespace orbitkv::codec
