// fp8 codec (frame_layout.h "fp8"): e4m3fn with an fp32 scale per group of
// head_dim elements. The scale is max(amax / 448, FLT_MIN) over the group's
// finite magnitudes (FLT_MIN keeps all-zero and tiny groups finite), so
// finite inputs never reach the e4m3fn NaN; +-Inf and NaN inputs become NaN.
// The loops here are the scalar reference; where CodecAvx2Enabled() each
// group runs through fp8_avx2.cc instead, with the same bytes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "codec/codec_internal.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {
namespace {

uint64_t Groups(uint64_t elems, uint32_t group) { return (elems + group - 1) / group; }

float ElementAt(const uint8_t* raw, uint64_t i, bool bf16) {
  return Half16ToFloat(Load16(raw + 2 * i), bf16);
}

}  // namespace

float Fp8GroupScale(float amax) {
  return std::max(amax / kE4m3fnMax, std::numeric_limits<float>::min());
}

size_t Fp8MaxEncodedSize(const SegmentInfo& info, size_t raw_bytes) {
  const uint64_t elems = raw_bytes / DTypeBytes(info.dtype);
  const uint32_t group = std::max<uint32_t>(info.head_dim, 1);
  return kFp8ScalesOffset + 4 * Groups(elems, group) + elems;
}

Result<size_t> Fp8Encode(const SegmentInfo& info, std::span<const uint8_t> raw,
                         std::span<uint8_t> out) {
  if (info.dtype == DType::kFp8E4m3fn) {
    return Status::InvalidArgument("fp8: the segment is fp8 already (use ans or none)");
  }
  if (info.head_dim == 0) return Status::InvalidArgument("fp8: head_dim (group size) is 0");
  const bool bf16 = info.dtype == DType::kBf16;
  const uint32_t group = info.head_dim;
  const uint64_t elems = raw.size() / 2;
  const uint64_t groups = Groups(elems, group);
  const size_t size = Fp8MaxEncodedSize(info, raw.size());
  uint8_t* o = out.data();
  WritePrefix(o, CodecId::kFp8, info.dtype, 0, raw.size(), size, group);
  uint8_t* payload = o + kFp8ScalesOffset + 4 * groups;
  const bool avx2 = CodecAvx2Enabled();
  for (uint64_t g = 0; g < groups; ++g) {
    const uint64_t first = g * group, last = std::min<uint64_t>(elems, first + group);
    const uint8_t* in = raw.data() + 2 * first;
    if (avx2) {
      const float scale = Fp8GroupScale(Fp8GroupAmaxAvx2(in, last - first, bf16));
      Store32(o + kFp8ScalesOffset + 4 * g, FloatToBits(scale));
      Fp8EncodeGroupAvx2(in, last - first, bf16, scale, payload + first);
      continue;
    }
    float amax = 0.0f;
    for (uint64_t i = first; i < last; ++i) {
      const float a = std::fabs(ElementAt(raw.data(), i, bf16));
      if (a <= std::numeric_limits<float>::max()) amax = std::max(amax, a);
    }
    const float scale = Fp8GroupScale(amax);
    Store32(o + kFp8ScalesOffset + 4 * g, FloatToBits(scale));
    for (uint64_t i = first; i < last; ++i) {
      payload[i] = ScaledToE4m3fn(ElementAt(raw.data(), i, bf16), scale);
    }
  }
  return size;
}

Status Fp8Decode(const FrameInfo& fi, std::span<const uint8_t> frame, std::span<uint8_t> out) {
  if (fi.dtype == DType::kFp8E4m3fn || fi.flags != 0 || fi.param == 0) {
    return Status::Corruption("fp8 frame: bad dtype, flags or group size");
  }
  const bool bf16 = fi.dtype == DType::kBf16;
  const uint64_t elems = fi.decoded_size / 2;
  if (elems > fi.frame_size) return Status::Corruption("fp8 frame: more elements than bytes");
  const uint64_t groups = Groups(elems, fi.param);
  if (fi.frame_size != kFp8ScalesOffset + 4 * groups + elems) {
    return Status::Corruption("fp8 frame: size does not match its element and group counts");
  }
  const uint8_t* f = frame.data();
  const uint8_t* payload = f + kFp8ScalesOffset + 4 * groups;
  const bool avx2 = CodecAvx2Enabled();
  for (uint64_t g = 0; g < groups; ++g) {
    const float scale = BitsToFloat(Load32(f + kFp8ScalesOffset + 4 * g));
    const uint64_t first = g * fi.param, last = std::min<uint64_t>(elems, first + fi.param);
    if (avx2) {
      Fp8DecodeGroupAvx2(payload + first, last - first, bf16, scale, out.data() + 2 * first);
      continue;
    }
    for (uint64_t i = first; i < last; ++i) {
      Store16(out.data() + 2 * i, FloatToHalf16(E4m3fnToFloat(payload[i]) * scale, bf16));
    }
  }
  return Status::OK();
}

}  // namespace orbitkv::codec::internal
