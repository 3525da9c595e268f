// CUDA decoders for the codec frames (codec_kernels.h). Layouts and scalar
// conversions come from frame_layout.h / float_bits.h, shared with the CPU
// codecs; compiled with --fmad=false so every float operation rounds as the
// CPU's does.
#include "codec/codec_kernels.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {
namespace {

constexpr uint32_t kCrcPieceBytes = 2048;
constexpr uint32_t kCrcThreads = 128;
constexpr uint32_t kAnsWarps = 8;  // chunks decoded at once per block
constexpr uint32_t kTqWarps = 8;   // vectors decoded at once per block
constexpr uint8_t kCodecAns = 1, kCodecFp8 = 2, kCodecTq4 = 3, kCodecTq3 = 4;

__device__ void Fail(int32_t* status, int32_t code) { atomicMax(status, code); }

// ---- CRC --------------------------------------------------------------------

// grid (pieces / kCrcThreads, count): each thread one 2 KiB piece.
__global__ void FrameCrcKernel(const KernelFrame* frames, const Crc32cTables* tables,
                               uint32_t* crc_acc) {
  __shared__ uint32_t slice[4][256];
  for (uint32_t i = threadIdx.x; i < 4 * 256; i += blockDim.x)
    slice[i / 256][i % 256] = tables->slice[i / 256][i % 256];
  __syncthreads();
  const KernelFrame f = frames[blockIdx.y];
  const uint64_t start = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kCrcPieceBytes;
  uint32_t reg = 0;
  if (start < f.frame_size) {
    const uint64_t end = min(f.frame_size, start + kCrcPieceBytes);
    reg = start == 0 ? 0xffffffffu : 0;
    uint64_t i = start;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(f.frame);
    for (; i + 4 <= end; i += 4) {
      const uint32_t w = i == kFrameCrcOffset ? 0u : __ldg(words + i / 4);
      reg = Crc32cWord(slice, reg, w);
    }
    for (; i < end; ++i) reg = Crc32cByte(slice, reg, f.frame[i]);
    reg = Crc32cShift(*tables, reg, f.frame_size - end);
  }
  for (int off = 16; off > 0; off /= 2) reg ^= __shfl_xor_sync(0xffffffffu, reg, off);
  if ((threadIdx.x & 31) == 0 && reg != 0) atomicXor(&crc_acc[blockIdx.y], reg);
}

// One thread per frame: the prefix against the caller's expectations, the
// frame's own CRC, and the stored bytes' CRC where asked (a check-only frame:
// that alone); the code goes to status[i] and into its verdict.
__global__ void CheckPrefixKernel(uint8_t codec, uint8_t version, const KernelFrame* frames,
                                  uint32_t count, const Crc32cTables* tables,
                                  const uint32_t* crc_acc, int32_t* status, int32_t* verdicts) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const KernelFrame f = frames[i];
  const uint8_t* p = f.frame;
  const bool has_field = f.frame_size >= kFrameCrcOffset + 4;
  int32_t code = kKernelOk;
  if (f.flags & kFrameCheckSegmentCrc) {
    // FrameCrcKernel read the CRC field as zero; the segment CRC covers it.
    const uint32_t reg = has_field
                             ? Crc32cWithWord(*tables, crc_acc[i], Load32(p + kFrameCrcOffset),
                                              kFrameCrcOffset, f.frame_size)
                             : crc_acc[i];
    if (~reg != f.segment_crc) code = kKernelSegmentCrc;
  }
  if (code == kKernelOk && !(f.flags & kFrameCheckOnly)) {
    code = kKernelBadPrefix;
    if (f.frame_size >= kFramePrefixBytes) {
      const uint8_t dtype = p[kPrefixDType];
      const uint64_t elem = dtype == 3 ? 1 : 2;
      const bool ok = Load32(p) == kFrameMagic && p[kPrefixCodec] == codec && codec >= 1 &&
                      codec <= 4 && p[kPrefixVersion] == version && dtype >= 1 && dtype <= 3 &&
                      (f.dtype == 0 || dtype == f.dtype) && (p[kPrefixFlags] & ~1u) == 0 &&
                      Load64(p + kPrefixFrameSize) == f.frame_size &&
                      Load64(p + kPrefixDecodedSize) == f.out_size && f.out_size % elem == 0 &&
                      (!(f.flags & kFrameCheckParam) || Load32(p + kPrefixParam) == f.param);
      if (ok) code = ~crc_acc[i] == Load32(p + kFrameCrcOffset) ? kKernelOk : kKernelCrc;
    }
  }
  status[i] = code;
  if (code != kKernelOk) atomicMax(&verdicts[f.verdict], code);
}

// A decode kernel's frame `fi` is skipped: check-only, or its verdict (its
// own check or another frame's of the same object) failed.
__device__ bool SkipFrame(const KernelFrame* frames, const int32_t* verdicts, uint32_t fi) {
  const KernelFrame& f = frames[fi];
  return (f.flags & kFrameCheckOnly) || verdicts[f.verdict] != kKernelOk;
}

// ---- ans --------------------------------------------------------------------

struct AnsPlane {
  uint8_t mode;
  uint32_t data_off, data_size, table_off;
};

// The ans header checks of ans.cc's DecodeWith and ParsePlane (all but the
// frequency sums, which the table build checks).
__device__ bool ParseAnsHeader(const KernelFrame& f, uint32_t* planes, uint32_t* chunk,
                               uint32_t* chunks, AnsPlane* plane) {
  const uint8_t* p = f.frame;
  if (f.frame_size < kAnsHeaderBytes) return false;
  *planes = p[kAnsPlanesOffset];
  const uint32_t elem = p[kPrefixDType] == 3 ? 1 : 2;
  if (*planes != elem || p[kAnsLanesOffset] != kAnsLanes ||
      Load16(p + kAnsProbBitsOffset) != kAnsProbBits) {
    return false;
  }
  *chunk = Load32(p + kPrefixParam);
  if (*chunk == 0 || *chunk % kAnsLanes != 0 || *chunk > kAnsMaxChunkElements) return false;
  const uint64_t elems = f.out_size / *planes;
  *chunks = Load32(p + kAnsChunksOffset);
  if (*chunks != (elems + *chunk - 1) / *chunk) return false;
  for (uint32_t k = 0; k < kAnsMaxPlanes; ++k) {
    const uint8_t* d = p + kAnsPlaneDescOffset + kAnsPlaneDescBytes * k;
    if (k >= *planes) {
      for (uint32_t b = 0; b < kAnsPlaneDescBytes; ++b) {
        if (d[b] != 0) return false;
      }
      continue;
    }
    AnsPlane& pl = plane[k];
    pl.mode = d[0];
    pl.data_off = Load32(d + 4);
    pl.data_size = Load32(d + 8);
    pl.table_off = Load32(d + 12);
    if (d[1] != 0 || d[2] != 0 || d[3] != 0 || pl.data_off % 4 != 0 ||
        pl.data_off < kAnsHeaderBytes || uint64_t{pl.data_off} + pl.data_size > f.frame_size) {
      return false;
    }
    if (pl.mode == kAnsPlaneRaw) {
      if (pl.data_size != elems) return false;
    } else if (pl.mode == kAnsPlaneRans) {
      if (pl.table_off < kAnsHeaderBytes ||
          uint64_t{pl.table_off} + kAnsFreqTableBytes + 4 * uint64_t{*chunks} > f.frame_size) {
        return false;
      }
    } else {
      return false;
    }
  }
  return true;
}

// Fills table[slot] from the plane's frequencies; false unless they sum to
// 4096. Called by the whole block.
__device__ bool BuildAnsTable(const uint8_t* freq, uint32_t* table, uint32_t* cum) {
  // cum[s] = sum of freq[0, s): a serial scan by one warp is plenty (256).
  if (threadIdx.x < 32) {
    uint32_t running = 0;
    for (uint32_t base = 0; base < 256; base += 32) {
      const uint32_t f = Load16(freq + 2 * (base + threadIdx.x));
      uint32_t incl = f;
      for (int off = 1; off < 32; off *= 2) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
        if (static_cast<int>(threadIdx.x) >= off) incl += v;
      }
      cum[base + threadIdx.x] = running + incl - f;
      running += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (threadIdx.x == 0) cum[256] = running;
  }
  __syncthreads();
  const bool ok = cum[256] == kAnsProbScale;
  if (ok) {
    for (uint32_t slot = threadIdx.x; slot < kAnsProbScale; slot += blockDim.x) {
      // The last s with cum[s] <= slot (zero-frequency symbols share cum).
      uint32_t lo = 0, hi = 256;
      while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (cum[mid] <= slot)
          lo = mid;
        else
          hi = mid;
      }
      table[slot] = AnsTableEntry(lo, cum[lo + 1] - cum[lo], slot - cum[lo]);
    }
  }
  __syncthreads();
  return ok;
}

// One lane's rANS stream position in a warp: the warp shares `pos`.
struct WarpStream {
  const uint16_t* words;
  uint32_t nwords;
  uint32_t pos;
  uint32_t state;
  bool ok;
};

__device__ __forceinline__ uint8_t AnsStep(WarpStream& s, const uint32_t* table, bool active,
                                           uint32_t lane_lt) {
  const uint32_t e = table[s.state & (kAnsProbScale - 1)];
  uint32_t x = AnsDecodeStep(s.state, e);
  const bool need = active && x < kAnsStateLow;
  const uint32_t mask = __ballot_sync(0xffffffffu, need);
  if (need) {
    const uint32_t at = s.pos + __popc(mask & lane_lt);
    if (at < s.nwords) {
      x = (x << 16) | __ldg(s.words + at);
    } else {
      s.ok = false;
    }
  }
  s.pos += __popc(mask);
  if (active) s.state = x;
  return static_cast<uint8_t>(e);
}

// grid (blocks, count), kAnsWarps warps: block b decodes chunks b*8+w,
// (b+gridDim.x)*8+w, ...
__global__ void __launch_bounds__(kAnsWarps * 32)
    AnsDecodeKernel(const KernelFrame* frames, int32_t* status, const int32_t* verdicts) {
  __shared__ uint32_t table[kAnsMaxPlanes][kAnsProbScale];
  __shared__ uint32_t cum[257];
  const uint32_t fi = blockIdx.y;
  if (SkipFrame(frames, verdicts, fi)) return;
  const KernelFrame f = frames[fi];
  const uint8_t* p = f.frame;
  if (p[kPrefixFlags] & kFrameFlagStored) {
    if (f.frame_size != kFramePrefixBytes + f.out_size) {
      if (blockIdx.x == 0 && threadIdx.x == 0) Fail(&status[fi], kKernelBadHeader);
      return;
    }
    const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
    for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < f.out_size;
         i += stride) {
      f.out[i] = p[kFramePrefixBytes + i];
    }
    return;
  }
  uint32_t planes, chunk, chunks;
  AnsPlane plane[kAnsMaxPlanes];
  if (!ParseAnsHeader(f, &planes, &chunk, &chunks, plane)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) Fail(&status[fi], kKernelBadHeader);
    return;
  }
  if (uint64_t{blockIdx.x} * kAnsWarps >= chunks) return;
#pragma unroll
  for (uint32_t k = 0; k < kAnsMaxPlanes && k < planes; ++k) {
    if (plane[k].mode != kAnsPlaneRans) continue;
    if (!BuildAnsTable(p + plane[k].table_off, table[k], cum)) {
      if (threadIdx.x == 0) Fail(&status[fi], kKernelBadHeader);
      return;
    }
  }
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const uint32_t lane_lt = (1u << lane) - 1;
  const uint64_t elems = f.out_size / planes;
  for (uint64_t c = uint64_t{blockIdx.x} * kAnsWarps + warp; c < chunks;
       c += uint64_t{gridDim.x} * kAnsWarps) {
    const uint64_t first = c * chunk;
    const uint32_t n = static_cast<uint32_t>(min(uint64_t{chunk}, elems - first));
    WarpStream s[kAnsMaxPlanes];
    const uint8_t* raw[kAnsMaxPlanes] = {nullptr, nullptr};
    bool bounds_ok = true;
#pragma unroll
    for (uint32_t k = 0; k < kAnsMaxPlanes && k < planes; ++k) {
      const AnsPlane& pl = plane[k];
      const uint8_t* data = p + pl.data_off;
      if (pl.mode == kAnsPlaneRaw) {
        raw[k] = data + first;
        continue;
      }
      const uint8_t* ends = p + pl.table_off + kAnsFreqTableBytes;
      const uint32_t begin = c == 0 ? 0 : Load32(ends + 4 * (c - 1));
      const uint32_t end = Load32(ends + 4 * c);
      // Aligned ends: the lane states are read as u32 (a misaligned load
      // would poison the CUDA context).
      if (end > pl.data_size || begin > end || end - begin < kAnsStatesBytes || begin % 4 != 0 ||
          end % 4 != 0) {
        bounds_ok = false;
        break;
      }
      const uint8_t* stream = data + begin;
      s[k].state = __ldg(reinterpret_cast<const uint32_t*>(stream) + lane);
      s[k].words = reinterpret_cast<const uint16_t*>(stream + kAnsStatesBytes);
      s[k].nwords = (end - begin - kAnsStatesBytes) / 2;
      s[k].pos = 0;
      s[k].ok = true;
    }
    if (!bounds_ok) {
      if (lane == 0) Fail(&status[fi], kKernelBadStream);
      continue;
    }
    const uint32_t steps = (n + 31) / 32;
    for (uint32_t t = 0; t < steps; ++t) {
      const uint32_t i = t * 32 + lane;
      const bool active = i < n;
      uint32_t v = 0;
#pragma unroll
      for (uint32_t k = 0; k < kAnsMaxPlanes && k < planes; ++k) {
        const uint32_t b = plane[k].mode == kAnsPlaneRaw ? (active ? raw[k][i] : 0u)
                                                         : AnsStep(s[k], table[k], active, lane_lt);
        v |= b << (8 * k);
      }
      if (!active) continue;
      if (planes == 2) {
        reinterpret_cast<uint16_t*>(f.out)[first + i] = static_cast<uint16_t>(v);
      } else {
        f.out[first + i] = static_cast<uint8_t>(v);
      }
    }
    bool ok = true;
#pragma unroll
    for (uint32_t k = 0; k < kAnsMaxPlanes && k < planes; ++k) {
      if (plane[k].mode != kAnsPlaneRans) continue;
      const uint32_t bytes = (kAnsStatesBytes + 2 * s[k].pos + 3) / 4 * 4;
      ok =
          ok && s[k].ok && s[k].state == kAnsStateLow && bytes == kAnsStatesBytes + 2 * s[k].nwords;
    }
    if (!__all_sync(0xffffffffu, ok) && lane == 0) Fail(&status[fi], kKernelBadStream);
  }
}

// ---- fp8 --------------------------------------------------------------------

__global__ void Fp8DecodeKernel(const KernelFrame* frames, int32_t* status,
                                const int32_t* verdicts) {
  const uint32_t fi = blockIdx.y;
  if (SkipFrame(frames, verdicts, fi)) return;
  const KernelFrame f = frames[fi];
  const uint8_t* p = f.frame;
  const uint32_t group = Load32(p + kPrefixParam);
  const uint64_t elems = f.out_size / 2;
  const uint8_t dtype = p[kPrefixDType];
  if (dtype == 3 || p[kPrefixFlags] != 0 || group == 0 || elems > f.frame_size ||
      f.frame_size != kFp8ScalesOffset + 4 * ((elems + group - 1) / group) + elems) {
    if (blockIdx.x == 0 && threadIdx.x == 0) Fail(&status[fi], kKernelBadHeader);
    return;
  }
  const bool bf16 = dtype == 1;
  const uint64_t groups = (elems + group - 1) / group;
  const uint8_t* scales = p + kFp8ScalesOffset;
  const uint8_t* payload = scales + 4 * groups;
  uint16_t* out = reinterpret_cast<uint16_t*>(f.out);
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  // Four elements per thread: one aligned u32 of payload, one u64 store.
  for (uint64_t q = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; q * 4 < elems; q += stride) {
    const uint64_t i0 = q * 4;
    if (i0 + 4 <= elems) {
      const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(payload) + q);
      uint64_t packed = 0;
      for (int k = 0; k < 4; ++k) {
        const float scale =
            BitsToFloat(__ldg(reinterpret_cast<const uint32_t*>(scales) + (i0 + k) / group));
        const uint16_t h =
            FloatToHalf16(E4m3fnToFloat(static_cast<uint8_t>(w >> (8 * k))) * scale, bf16);
        packed |= uint64_t{h} << (16 * k);
      }
      reinterpret_cast<uint64_t*>(out)[q] = packed;
    } else {
      for (uint64_t i = i0; i < elems; ++i) {
        const float scale = BitsToFloat(Load32(scales + 4 * (i / group)));
        out[i] = FloatToHalf16(E4m3fnToFloat(payload[i]) * scale, bf16);
      }
    }
  }
}

// ---- TurboQuant -------------------------------------------------------------

// In-warp Walsh-Hadamard transform of d = 32 * R values, lane l holding
// coordinates l*R .. l*R+R-1: the CPU's butterflies, operand for operand.
template <int R>
__device__ __forceinline__ void WarpFwht(float (&v)[R], uint32_t lane) {
  for (int h = 1; h < R; h *= 2) {
    for (int r = 0; r < R; ++r) {
      if ((r & h) == 0) {
        const float a = v[r], b = v[r + h];
        v[r] = a + b;
        v[r + h] = a - b;
      }
    }
  }
  for (int m = 1; m < 32; m *= 2) {
    const bool lower = (lane & m) == 0;
    for (int r = 0; r < R; ++r) {
      const float other = __shfl_xor_sync(0xffffffffu, v[r], m);
      v[r] = lower ? v[r] + other : other - v[r];
    }
  }
}

template <int R>
__global__ void __launch_bounds__(kTqWarps * 32)
    TurboQuantDecodeKernel(uint32_t bits, const KernelFrame* frames, int32_t* status,
                           const int32_t* verdicts) {
  constexpr uint32_t d = 32 * R;
  const uint32_t fi = blockIdx.y;
  if (SkipFrame(frames, verdicts, fi)) return;
  const KernelFrame f = frames[fi];
  const uint8_t* p = f.frame;
  const uint32_t levels = 1u << bits;
  const uint64_t vectors = f.frame_size >= kTqCodebookOffset ? Load32(p + kTqVectorsOffset) : 0;
  const uint64_t size =
      kTqCodebookOffset + 4 * uint64_t{levels} + 4 * vectors + vectors * d * bits / 8;
  if (f.frame_size < kTqCodebookOffset || p[kPrefixDType] == 3 || p[kPrefixFlags] != 0 ||
      Load32(p + kPrefixParam) != d || p[kTqBitsOffset] != bits ||
      p[kTqRoundsOffset] != kTqRounds || p[34] != 0 || p[35] != 0 ||
      vectors * d * 2 != f.out_size || size != f.frame_size) {
    if (blockIdx.x == 0 && threadIdx.x == 0) Fail(&status[fi], kKernelBadHeader);
    return;
  }
  const bool bf16 = p[kPrefixDType] == 1;
  const uint64_t seed = Load64(p + kTqSeedOffset);
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  __shared__ float c[16];
  if (threadIdx.x < levels)
    c[threadIdx.x] = BitsToFloat(Load32(p + kTqCodebookOffset + 4 * threadIdx.x));
  __syncthreads();
  bool neg0[R], neg1[R];
  for (int r = 0; r < R; ++r) {
    neg0[r] = TurboQuantSignNegative(seed, 0, lane * R + r);
    neg1[r] = TurboQuantSignNegative(seed, 1, lane * R + r);
  }
  const uint8_t* norms = p + kTqCodebookOffset + 4 * levels;
  const uint8_t* packed = norms + 4 * vectors;
  const uint32_t vec_bytes = d * bits / 8;
  const float inv_d = 1.0f / static_cast<float>(d);
  for (uint64_t n = uint64_t{blockIdx.x} * kTqWarps + warp; n < vectors;
       n += uint64_t{gridDim.x} * kTqWarps) {
    const uint8_t* src = packed + n * vec_bytes;
    float v[R];
    for (int r = 0; r < R; ++r) {
      const uint32_t bit = (lane * R + r) * bits;
      uint32_t word = src[bit / 8];
      if ((bit % 8) + bits > 8) word |= uint32_t{src[bit / 8 + 1]} << 8;
      v[r] = c[(word >> (bit % 8)) & (levels - 1)];
    }
    WarpFwht<R>(v, lane);
    for (int r = 0; r < R; ++r) v[r] = FlipSign(v[r], neg1[r]);
    WarpFwht<R>(v, lane);
    const float norm = BitsToFloat(Load32(norms + 4 * n));
    uint16_t* dst = reinterpret_cast<uint16_t*>(f.out) + n * d + lane * R;
    for (int r = 0; r < R; ++r) {
      const float u = FlipSign(v[r], neg0[r]) * inv_d;
      dst[r] = FloatToHalf16(u * norm, bf16);
    }
  }
}

// ---- GPU encoders (fp8, TurboQuant) -----------------------------------------

// One warp per group: amax over the finite magnitudes (a max is exact in any
// order), the scale, then e4m3fn(x / scale), as fp8.cc.
__global__ void Fp8EncodeKernel(bool bf16, uint32_t group, const KernelSegment* segments) {
  const KernelSegment s = segments[blockIdx.y];
  const uint64_t elems = s.raw_size / 2;
  const uint64_t groups = (elems + group - 1) / group;
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(s.raw);
  uint8_t* scales = s.frame + kFp8ScalesOffset;
  uint8_t* payload = scales + 4 * groups;
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t warps = uint64_t{gridDim.x} * (blockDim.x / 32);
  for (uint64_t g = uint64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; g < groups;
       g += warps) {
    const uint64_t first = g * group, last = min(elems, first + group);
    float amax = 0.0f;
    for (uint64_t i = first + lane; i < last; i += 32) {
      const float a = fabsf(Half16ToFloat(raw[i], bf16));
      if (a <= 3.402823466e38f) amax = fmaxf(amax, a);
    }
    for (int off = 16; off > 0; off /= 2)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float scale = fmaxf(amax / kE4m3fnMax, 1.175494351e-38f);  // FLT_MIN
    if (lane == 0) reinterpret_cast<uint32_t*>(scales)[g] = FloatToBits(scale);
    for (uint64_t i = first + lane; i < last; i += 32) {
      payload[i] = ScaledToE4m3fn(Half16ToFloat(raw[i], bf16), scale);
    }
  }
}

// One warp per vector, lane l holding coordinates l*R .. l*R+R-1: the norm
// summed in double in coordinate order by lane 0 (the CPU's order), then the
// CPU's rotation and nearest-centroid indices, packed by byte.
template <int R>
__global__ void __launch_bounds__(kTqWarps * 32)
    TurboQuantEncodeKernel(uint32_t bits, bool bf16, uint64_t seed, const float* codebook,
                           const KernelSegment* segments) {
  constexpr uint32_t d = 32 * R;
  __shared__ float vals[kTqWarps][d];
  __shared__ uint8_t idx[kTqWarps][d];
  __shared__ float bound[15];
  const uint32_t levels = 1u << bits;
  if (threadIdx.x + 1 < levels)
    bound[threadIdx.x] = (codebook[threadIdx.x] + codebook[threadIdx.x + 1]) * 0.5f;
  __syncthreads();
  const KernelSegment s = segments[blockIdx.y];
  const uint64_t vectors = s.raw_size / 2 / d;
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  bool neg0[R], neg1[R];
  for (int r = 0; r < R; ++r) {
    neg0[r] = TurboQuantSignNegative(seed, 0, lane * R + r);
    neg1[r] = TurboQuantSignNegative(seed, 1, lane * R + r);
  }
  uint8_t* norms = s.frame + kTqCodebookOffset + 4 * levels;
  uint8_t* packed = norms + 4 * vectors;
  const uint32_t vec_bytes = d * bits / 8;
  const float inv_d = 1.0f / static_cast<float>(d);
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(s.raw);
  for (uint64_t n = uint64_t{blockIdx.x} * kTqWarps + warp; n < vectors;
       n += uint64_t{gridDim.x} * kTqWarps) {
    float v[R];
    for (int r = 0; r < R; ++r) {
      v[r] = Half16ToFloat(raw[n * d + lane * R + r], bf16);
      vals[warp][lane * R + r] = v[r];
    }
    __syncwarp();
    float norm = 0.0f;
    if (lane == 0) {
      double ss = 0;
      for (uint32_t k = 0; k < d; ++k) ss += double(vals[warp][k]) * double(vals[warp][k]);
      norm = static_cast<float>(sqrt(ss));
      if (!isfinite(norm)) norm = BitsToFloat(0x7fc00000u);  // std::numeric_limits quiet_NaN
      reinterpret_cast<uint32_t*>(norms)[n] = FloatToBits(norm);
    }
    norm = __shfl_sync(0xffffffffu, norm, 0);
    const bool scaled = norm > 0 && isfinite(norm);
    for (int r = 0; r < R; ++r) v[r] = FlipSign(scaled ? v[r] / norm : 0.0f, neg0[r]);
    WarpFwht<R>(v, lane);
    for (int r = 0; r < R; ++r) v[r] = FlipSign(v[r], neg1[r]);
    WarpFwht<R>(v, lane);
    for (int r = 0; r < R; ++r) {
      const float y = v[r] * inv_d;
      uint32_t q = 0;
      for (uint32_t k = 0; k + 1 < levels; ++k) q += y > bound[k] ? 1 : 0;
      idx[warp][lane * R + r] = static_cast<uint8_t>(q);
    }
    __syncwarp();
    // Byte j holds bits [8j, 8j + 8) of the vector's little-endian bit string.
    for (uint32_t j = lane; j < vec_bytes; j += 32) {
      uint32_t byte = 0;
      for (uint32_t k = 8 * j / bits; k <= (8 * j + 7) / bits && k < d; ++k) {
        const int shift = static_cast<int>(k * bits) - static_cast<int>(8 * j);
        byte |= shift >= 0 ? uint32_t{idx[warp][k]} << shift : uint32_t{idx[warp][k]} >> -shift;
      }
      packed[n * vec_bytes + j] = static_cast<uint8_t>(byte);
    }
    __syncwarp();
  }
}

__global__ void StoreCrcKernel(const KernelFrame* frames, uint32_t count, const uint32_t* crc_acc) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) {
    reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(frames[i].frame))[kFrameCrcOffset / 4] =
        ~crc_acc[i];
  }
}

// ---- GPU ans encoder (ans_encode.h describes the passes) --------------------

constexpr uint32_t kAnsEncWarps = 8;

// grid (blocks, count), 256 threads: per-plane byte histograms.
__global__ void AnsHistogramKernel(const AnsEncodeJob* jobs) {
  __shared__ uint32_t hist[kAnsMaxPlanes * 256];
  for (uint32_t i = threadIdx.x; i < kAnsMaxPlanes * 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const AnsEncodeJob& job = jobs[blockIdx.y];
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t b = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; b < job.raw_size;
       b += stride) {
    const uint32_t plane = job.planes == 2 ? static_cast<uint32_t>(b & 1) : 0;
    atomicAdd(&hist[plane * 256 + job.raw[b]], 1u);
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < job.planes * 256; i += blockDim.x) {
    if (hist[i] != 0) atomicAdd(&job.counts[i], hist[i]);
  }
}

// grid (count), one thread per plane: the frequency tables.
__global__ void AnsTableKernel(AnsEncodeJob* jobs) {
  const AnsEncodeJob& job = jobs[blockIdx.x];
  const uint64_t elems = job.raw_size / job.planes;
  if (threadIdx.x < job.planes && elems > 0) {
    AnsBuildEncTable(job.counts + 256 * threadIdx.x, elems, &job.tables[threadIdx.x]);
  }
}

// The job's tables and reciprocals in shared memory. Called by the whole block.
__device__ void LoadAnsEncTables(const AnsEncodeJob& job, AnsEncTable* t, uint64_t (*rcp)[256]) {
  for (uint32_t i = threadIdx.x; i < job.planes * 256; i += blockDim.x) {
    const uint32_t p = i / 256, s = i % 256;
    t[p].freq[s] = job.tables[p].freq[s];
    t[p].cum[s] = job.tables[p].cum[s];
    rcp[p][s] = AnsReciprocal(job.tables[p].freq[s]);
  }
  __syncthreads();
}

// One warp encodes chunk c of plane p: with stream == nullptr it only counts
// the words; otherwise it writes the chunk's stream (`total` words, as
// counted) at stream. Returns the words.
__device__ uint32_t AnsEncodeChunkWarp(const AnsEncodeJob& job, uint32_t p, uint32_t c,
                                       const AnsEncTable& t, const uint64_t* rcp, uint8_t* stream,
                                       uint32_t total) {
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t elems = job.raw_size / job.planes;
  const uint64_t first = uint64_t{c} * job.chunk;
  const uint32_t n = AnsChunkLength(elems, job.chunk, c);
  uint8_t* words = stream == nullptr ? nullptr : stream + kAnsStatesBytes;
  uint32_t x = kAnsStateLow, emitted = 0;
  for (uint32_t step = (n + kAnsLanes - 1) / kAnsLanes; step-- > 0;) {
    const uint32_t i = step * kAnsLanes + lane;
    const bool active = i < n;
    const uint8_t s = active ? job.raw[(first + i) * job.planes + p] : 0;
    const bool renorm = active && AnsRenorm(x, t.freq[s]);
    const uint32_t mask = __ballot_sync(0xffffffffu, renorm);
    if (active) AnsEncodeLane(&x, s, renorm, mask, lane, emitted, t, rcp, words, total);
    emitted += __popc(mask);
  }
  if (stream != nullptr) {
    Store32(stream + 4 * lane, x);
    if (lane == 0 && total % 2 != 0) Store16(words + 2 * total, 0);
  }
  return emitted;
}

// grid (blocks, count), kAnsEncWarps warps: words[item] for item = p * chunks + c.
__global__ void __launch_bounds__(kAnsEncWarps * 32) AnsCountKernel(const AnsEncodeJob* jobs) {
  __shared__ AnsEncTable t[kAnsMaxPlanes];
  __shared__ uint64_t rcp[kAnsMaxPlanes][256];
  const AnsEncodeJob& job = jobs[blockIdx.y];
  const uint64_t items = uint64_t{job.planes} * job.chunks;
  if (uint64_t{blockIdx.x} * kAnsEncWarps >= items) return;
  LoadAnsEncTables(job, t, rcp);
  for (uint64_t item = uint64_t{blockIdx.x} * kAnsEncWarps + threadIdx.x / 32; item < items;
       item += uint64_t{gridDim.x} * kAnsEncWarps) {
    const uint32_t p = static_cast<uint32_t>(item / job.chunks);
    const uint32_t c = static_cast<uint32_t>(item % job.chunks);
    const uint32_t w = AnsEncodeChunkWarp(job, p, c, t[p], rcp[p], nullptr, 0);
    if ((threadIdx.x & 31) == 0) job.words[item] = w;
  }
}

// grid (count), 256 threads: the layout from the word counts, the header and
// the chunk_end tables (inclusive prefix sums of the stream sizes).
constexpr uint32_t kAnsLayoutThreads = 256;
__global__ void __launch_bounds__(kAnsLayoutThreads)
    AnsLayoutKernel(uint8_t version, AnsEncodeJob* jobs, KernelFrame* frames, uint64_t* sizes) {
  using Scan = cub::BlockScan<uint32_t, kAnsLayoutThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ unsigned long long coded[kAnsMaxPlanes];
  __shared__ AnsFrameLayout layout;
  AnsEncodeJob& job = jobs[blockIdx.x];
  if (threadIdx.x < kAnsMaxPlanes) coded[threadIdx.x] = 0;
  __syncthreads();
  for (uint32_t p = 0; p < job.planes; ++p) {
    unsigned long long mine = 0;
    for (uint32_t c = threadIdx.x; c < job.chunks; c += blockDim.x) {
      mine += AnsStreamBytes(job.words[uint64_t{p} * job.chunks + c]);
    }
    if (mine != 0) atomicAdd(&coded[p], mine);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t sums[kAnsMaxPlanes] = {coded[0], coded[1]};
    layout = AnsPlanFrame(job.planes, job.raw_size / job.planes, job.chunks, sums, job.raw_size);
    const uint16_t* freq[kAnsMaxPlanes] = {job.tables[0].freq, job.tables[1].freq};
    AnsWriteHeader(job.frame, layout, version, job.dtype, job.raw_size, job.chunk, job.chunks,
                   freq);
    job.layout = layout;
    frames[blockIdx.x].frame_size = layout.frame_size;
    sizes[blockIdx.x] = layout.frame_size;
  }
  __syncthreads();
  if (layout.stored) return;
  for (uint32_t p = 0; p < job.planes; ++p) {
    if (layout.mode[p] != kAnsPlaneRans) continue;
    uint8_t* ends = job.frame + layout.table_off[p] + kAnsFreqTableBytes;
    uint32_t running = 0;
    for (uint32_t base = 0; base < job.chunks; base += blockDim.x) {
      const uint32_t c = base + threadIdx.x;
      const uint32_t bytes =
          c < job.chunks ? AnsStreamBytes(job.words[uint64_t{p} * job.chunks + c]) : 0;
      uint32_t inclusive = 0, tile = 0;
      Scan(scan).InclusiveSum(bytes, inclusive, tile);
      if (c < job.chunks) Store32(ends + 4 * uint64_t{c}, running + inclusive);
      running += tile;
      __syncthreads();  // scan storage reuse
    }
  }
}

// grid (blocks, count), kAnsEncWarps warps: the plane data (streams, raw
// planes and their padding), or the raw bytes of a stored frame.
__global__ void __launch_bounds__(kAnsEncWarps * 32) AnsWriteKernel(const AnsEncodeJob* jobs) {
  __shared__ AnsEncTable t[kAnsMaxPlanes];
  __shared__ uint64_t rcp[kAnsMaxPlanes][256];
  const AnsEncodeJob& job = jobs[blockIdx.y];
  const AnsFrameLayout& l = job.layout;
  if (l.stored) {
    const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
    for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < job.raw_size;
         i += stride) {
      job.frame[kFramePrefixBytes + i] = job.raw[i];
    }
    return;
  }
  const uint64_t items = uint64_t{job.planes} * job.chunks;
  if (uint64_t{blockIdx.x} * kAnsEncWarps >= items) return;
  LoadAnsEncTables(job, t, rcp);
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t elems = job.raw_size / job.planes;
  for (uint64_t item = uint64_t{blockIdx.x} * kAnsEncWarps + threadIdx.x / 32; item < items;
       item += uint64_t{gridDim.x} * kAnsEncWarps) {
    const uint32_t p = static_cast<uint32_t>(item / job.chunks);
    const uint32_t c = static_cast<uint32_t>(item % job.chunks);
    uint8_t* data = job.frame + l.data_off[p];
    const uint64_t first = uint64_t{c} * job.chunk;
    if (l.mode[p] == kAnsPlaneRaw) {
      const uint32_t n = AnsChunkLength(elems, job.chunk, c);
      for (uint32_t i = lane; i < n; i += 32)
        data[first + i] = job.raw[(first + i) * job.planes + p];
      if (c + 1 == job.chunks && elems + lane < AnsAlign4(elems)) data[elems + lane] = 0;
      continue;
    }
    const uint8_t* ends = job.frame + l.table_off[p] + kAnsFreqTableBytes;
    const uint32_t begin = c == 0 ? 0 : Load32(ends + 4 * (uint64_t{c} - 1));
    AnsEncodeChunkWarp(job, p, c, t[p], rcp[p], data + begin, job.words[item]);
  }
}

uint32_t GridX(uint64_t work_units, uint64_t per_block) {
  const uint64_t blocks = (work_units + per_block - 1) / per_block;
  return static_cast<uint32_t>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

}  // namespace

cudaError_t LaunchEncode(uint8_t codec, bool bf16, uint32_t head_dim, uint64_t seed,
                         const float* codebook, const KernelSegment* segments,
                         const KernelFrame* frames_for_crc, uint32_t count, uint64_t max_raw_size,
                         uint64_t max_frame_size, const Crc32cTables* tables, uint32_t* crc_acc,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count > 65535) return cudaErrorInvalidValue;
  const uint64_t vectors = max_raw_size / (2 * uint64_t{head_dim});
  if (codec == kCodecFp8) {
    const dim3 grid(GridX(vectors + 1, 8 * 8), count);
    Fp8EncodeKernel<<<grid, 256, 0, stream>>>(bf16, head_dim, segments);
  } else if (codec == kCodecTq4 || codec == kCodecTq3) {
    const uint32_t bits = codec == kCodecTq4 ? 4 : 3;
    const dim3 grid(GridX(vectors, kTqWarps * 4), count);
    const uint32_t threads = kTqWarps * 32;
    switch (head_dim) {
#define OKV_TQ_ENCODE(R)                                                                           \
  case 32 * R:                                                                                     \
    TurboQuantEncodeKernel<R><<<grid, threads, 0, stream>>>(bits, bf16, seed, codebook, segments); \
    break;
      OKV_TQ_ENCODE(1)
      OKV_TQ_ENCODE(2)
      OKV_TQ_ENCODE(4)
      OKV_TQ_ENCODE(8)
      OKV_TQ_ENCODE(16)
      OKV_TQ_ENCODE(32)
#undef OKV_TQ_ENCODE
      default:
        return cudaErrorInvalidValue;
    }
  } else {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaMemsetAsync(crc_acc, 0, sizeof(uint32_t) * count, stream);
  if (err != cudaSuccess) return err;
  const dim3 crc_grid(GridX(max_frame_size, uint64_t{kCrcPieceBytes} * kCrcThreads), count);
  FrameCrcKernel<<<crc_grid, kCrcThreads, 0, stream>>>(frames_for_crc, tables, crc_acc);
  StoreCrcKernel<<<(count + 127) / 128, 128, 0, stream>>>(frames_for_crc, count, crc_acc);
  return cudaGetLastError();
}

cudaError_t LaunchAnsEncode(uint8_t version, AnsEncodeJob* jobs, KernelFrame* frames_for_crc,
                            uint64_t* sizes, uint32_t count, uint64_t max_raw_size,
                            uint64_t max_items, const Crc32cTables* tables, uint32_t* crc_acc,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count > 65535) return cudaErrorInvalidValue;
  AnsHistogramKernel<<<dim3(GridX(max_raw_size, 256 * 16), count), 256, 0, stream>>>(jobs);
  AnsTableKernel<<<count, 32, 0, stream>>>(jobs);
  const dim3 chunk_grid(GridX(max_items, kAnsEncWarps), count);
  AnsCountKernel<<<chunk_grid, kAnsEncWarps * 32, 0, stream>>>(jobs);
  AnsLayoutKernel<<<count, kAnsLayoutThreads, 0, stream>>>(version, jobs, frames_for_crc, sizes);
  // Wide enough for stored frames' copies too.
  const dim3 write_grid(std::max(GridX(max_items, kAnsEncWarps),
                                 GridX(max_raw_size, uint64_t{kAnsEncWarps} * 32 * 16)),
                        count);
  AnsWriteKernel<<<write_grid, kAnsEncWarps * 32, 0, stream>>>(jobs);
  cudaError_t err = cudaMemsetAsync(crc_acc, 0, sizeof(uint32_t) * count, stream);
  if (err != cudaSuccess) return err;
  const dim3 crc_grid(
      GridX(kFramePrefixBytes + max_raw_size, uint64_t{kCrcPieceBytes} * kCrcThreads), count);
  FrameCrcKernel<<<crc_grid, kCrcThreads, 0, stream>>>(frames_for_crc, tables, crc_acc);
  StoreCrcKernel<<<(count + 127) / 128, 128, 0, stream>>>(frames_for_crc, count, crc_acc);
  return cudaGetLastError();
}

cudaError_t LaunchCheckAndDecode(uint8_t codec, uint8_t version, const KernelFrame* frames,
                                 uint32_t count, uint64_t max_frame_size, uint64_t max_out_size,
                                 uint32_t head_dim, const Crc32cTables* tables, uint32_t* crc_acc,
                                 int32_t* status, int32_t* verdicts, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (count > 65535) return cudaErrorInvalidValue;
  cudaError_t err = cudaMemsetAsync(crc_acc, 0, sizeof(uint32_t) * count, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(verdicts, 0, sizeof(int32_t) * count, stream);
  if (err != cudaSuccess) return err;
  const dim3 crc_grid(GridX(max_frame_size, uint64_t{kCrcPieceBytes} * kCrcThreads), count);
  FrameCrcKernel<<<crc_grid, kCrcThreads, 0, stream>>>(frames, tables, crc_acc);
  CheckPrefixKernel<<<(count + 127) / 128, 128, 0, stream>>>(codec, version, frames, count, tables,
                                                             crc_acc, status, verdicts);
  switch (codec) {
    case kCodecAns: {
      // Chunks are at least 32 elements; 8 KiB of output per warp is the
      // default chunk's size (a grid larger than the chunks exits early).
      const dim3 grid(GridX(max_out_size, uint64_t{kAnsWarps} * 8192), count);
      AnsDecodeKernel<<<grid, kAnsWarps * 32, 0, stream>>>(frames, status, verdicts);
      break;
    }
    case kCodecFp8: {
      const dim3 grid(GridX(max_out_size / 2, 256 * 4 * 8), count);
      Fp8DecodeKernel<<<grid, 256, 0, stream>>>(frames, status, verdicts);
      break;
    }
    case kCodecTq4:
    case kCodecTq3: {
      const uint32_t bits = codec == kCodecTq4 ? 4 : 3;
      const dim3 grid(GridX(max_out_size / (2 * uint64_t{head_dim}), kTqWarps * 4), count);
      const uint32_t threads = kTqWarps * 32;
      switch (head_dim) {
        case 32:
          TurboQuantDecodeKernel<1><<<grid, threads, 0, stream>>>(bits, frames, status, verdicts);
          break;
        case 64:
          TurboQuantDecodeKernel<2><<<grid, threads, 0, stream>>>(bits, frames, status, verdicts);
          break;
        case 128:
          TurboQuantDecodeKernel<4><<<grid, threads, 0, stream>>>(bits, frames, status, verdicts);
          break;
        case 256:
          TurboQuantDecodeKernel<8><<<grid, threads, 0, stream>>>(bits, frames, status, verdicts);
          break;
        case 512:
          TurboQuantDecodeKernel<16><<<grid, threads, 0, stream>>>(bits, frames, status, verdicts);
          break;
        case 1024:
          TurboQuantDecodeKernel<32><<<grid, threads, 0, stream>>>(bits, frames, status, verdicts);
          break;
        default:
          return cudaErrorInvalidValue;
      }
      break;
    }
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace orbitkv::codec::internal
