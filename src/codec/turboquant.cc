// TurboQuant-MSE (Zandieh et al., arXiv:2504.19874, Algorithm 1) for KV head
// vectors, frame_layout.h "TurboQuant": the norm kept in fp32, the unit
// vector rotated by a seeded two-round randomised Hadamard transform (in
// place of the paper's dense random rotation: O(d log d), and two rounds so
// that sparse inputs spread too), then each coordinate quantised to the
// nearest centroid of the Lloyd-Max codebook for the coordinate distribution.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "codec/codec_internal.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {
namespace {

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

struct Codebook {
  std::vector<float> centroids;
  double distortion = 0;
};

// Lloyd-Max on a fine midpoint grid of the density, with prefix sums so each
// iteration costs O(levels).
Codebook ComputeCodebook(uint32_t dim, uint32_t bits) {
  const int levels = 1 << bits;
  const double sigma = 1.0 / std::sqrt(double(dim));
  const double lim = std::min(1.0, 12.0 * sigma);
  constexpr int kGrid = 1 << 16;
  const double step = 2 * lim / kGrid;
  std::vector<double> t(kGrid), w0(kGrid + 1, 0), w1(kGrid + 1, 0), w2(kGrid + 1, 0);
  const double expo = (double(dim) - 3) / 2;
  for (int i = 0; i < kGrid; ++i) {
    t[i] = -lim + (i + 0.5) * step;
    const double w = std::exp(expo * std::log1p(-t[i] * t[i]));
    w0[i + 1] = w0[i] + w;
    w1[i + 1] = w1[i] + w * t[i];
    w2[i + 1] = w2[i] + w * t[i] * t[i];
  }
  // Grid cells [lo, hi) whose midpoints lie at or below / above x.
  auto cell = [&](double x) {
    const double k = std::ceil((x + lim) / step - 0.5);
    return static_cast<int>(std::clamp(k, 0.0, double(kGrid)));
  };
  std::vector<double> c(levels);
  for (int k = 0; k < levels; ++k) c[k] = (-3 + 6 * (k + 0.5) / levels) * sigma;
  std::vector<int> edge(levels + 1);
  for (int iter = 0; iter < 2000; ++iter) {
    edge[0] = 0;
    edge[levels] = kGrid;
    for (int k = 1; k < levels; ++k) edge[k] = cell((c[k - 1] + c[k]) / 2);
    double moved = 0;
    for (int k = 0; k < levels; ++k) {
      const double mass = w0[edge[k + 1]] - w0[edge[k]];
      if (mass <= 0) continue;
      const double next = (w1[edge[k + 1]] - w1[edge[k]]) / mass;
      moved = std::max(moved, std::fabs(next - c[k]));
      c[k] = next;
    }
    if (moved < 1e-12 * sigma) break;
  }
  Codebook cb;
  double err = 0;
  for (int k = 0; k < levels; ++k) {
    const double m0 = w0[edge[k + 1]] - w0[edge[k]], m1 = w1[edge[k + 1]] - w1[edge[k]],
                 m2 = w2[edge[k + 1]] - w2[edge[k]];
    err += m2 - 2 * c[k] * m1 + c[k] * c[k] * m0;
    cb.centroids.push_back(static_cast<float>(c[k]));
  }
  cb.distortion = dim * err / w0[kGrid];
  return cb;
}

const Codebook& CachedCodebook(uint32_t dim, uint32_t bits) {
  static std::mutex mu;
  static std::map<std::pair<uint32_t, uint32_t>, Codebook> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dim, bits});
  if (it == cache.end()) it = cache.emplace(std::pair{dim, bits}, ComputeCodebook(dim, bits)).first;
  return it->second;  // map nodes are stable
}

// Eight floats (the GCC/Clang vector extension: two SSE registers on x86-64
// by default, one AVX2 register in the avx2 clones below; NEON on arm64).
// Element-wise operations on them round exactly as the scalar ones do, so the
// vector loops give the scalar reference's bytes (and the CUDA kernels',
// which follow the same operation order); no FMA is ever formed
// (-ffp-contract=off, and the clones do not enable it).
using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));
using U8 = uint32_t __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(ORBITKV_CODEC_NO_CLONES) && !defined(__SANITIZE_THREAD__)
// An AVX2 and a baseline version, chosen at load time by the CPU (ifunc);
// -DORBITKV_CODEC_NO_CLONES builds the baseline alone (to compare bytes).
// Not under TSan: its runtime is not up when the ifunc resolvers run at load,
// and every binary linking the codec crashed before main.
#define OKV_TQ_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define OKV_TQ_CLONES
#endif

// Internal helpers, always inlined: a 32-byte vector passed or returned between
// functions of different targets (the AVX2 and default clones) changes ABI
// (-Wpsabi); an out-of-line LoadV in a -O0 build crashed the AVX2 clone.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
template <typename V, typename T>
inline __attribute__((always_inline)) V LoadV(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V, typename T>
inline __attribute__((always_inline)) void StoreV(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// In-place unnormalised Walsh-Hadamard transform; the butterfly order is the
// CUDA decoder's (each stage's a + b, a - b on the same operands). d is a
// power of two >= 32: stages h = 1, 2, 4 run inside each group of eight (the
// operands shuffled into place), later ones eight butterflies at once.
inline __attribute__((always_inline)) void Fwht(float* v, uint32_t d) {
  for (uint32_t i = 0; i < d; i += 8) {
    F8 x = LoadV<F8>(v + i);
    F8 a = __builtin_shufflevector(x, x, 0, 0, 2, 2, 4, 4, 6, 6);
    F8 b = __builtin_shufflevector(x, x, 1, 1, 3, 3, 5, 5, 7, 7);
    x = __builtin_shufflevector(a + b, a - b, 0, 9, 2, 11, 4, 13, 6, 15);
    a = __builtin_shufflevector(x, x, 0, 1, 0, 1, 4, 5, 4, 5);
    b = __builtin_shufflevector(x, x, 2, 3, 2, 3, 6, 7, 6, 7);
    x = __builtin_shufflevector(a + b, a - b, 0, 1, 10, 11, 4, 5, 14, 15);
    a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 0, 1, 2, 3);
    b = __builtin_shufflevector(x, x, 4, 5, 6, 7, 4, 5, 6, 7);
    StoreV(v + i, __builtin_shufflevector(a + b, a - b, 0, 1, 2, 3, 12, 13, 14, 15));
  }
  for (uint32_t h = 8; h < d; h *= 2) {
    for (uint32_t i = 0; i < d; i += 2 * h) {
      for (uint32_t j = i; j < i + h; j += 8) {
        const F8 a = LoadV<F8>(v + j), b = LoadV<F8>(v + j + h);
        StoreV(v + j, a + b);
        StoreV(v + j + h, a - b);
      }
    }
  }
}

// The sign bits of one round, hashed once per frame, as float sign masks
// (0x80000000 where the coordinate is negated).
std::vector<uint32_t> Signs(uint32_t d, uint64_t seed, uint32_t round) {
  std::vector<uint32_t> neg(d);
  for (uint32_t k = 0; k < d; ++k)
    neg[k] = TurboQuantSignNegative(seed, round, k) ? 0x80000000u : 0;
  return neg;
}

// FlipSign of each coordinate (d a multiple of 8).
inline __attribute__((always_inline)) void ApplySigns(float* v, const uint32_t* neg, uint32_t d) {
  for (uint32_t k = 0; k < d; k += 8) StoreV(v + k, LoadV<U8>(v + k) ^ LoadV<U8>(neg + k));
}

// Packs d indices of `bits` bits, little-endian bit order: index k occupies
// bits [k * bits, (k + 1) * bits) of dst (dst zeroed for the generic form).
void PackIndices(const uint8_t* q, uint32_t d, uint32_t bits, uint8_t* dst) {
  if (bits == 4) {
    for (uint32_t k = 0; k < d; k += 2) dst[k / 2] = static_cast<uint8_t>(q[k] | q[k + 1] << 4);
  } else if (bits == 3) {
    for (uint32_t k = 0; k < d; k += 8) {  // eight indices, three bytes
      uint32_t w = 0;
      for (uint32_t j = 0; j < 8; ++j) w |= uint32_t{q[k + j]} << (3 * j);
      uint8_t* o = dst + k / 8 * 3;
      o[0] = static_cast<uint8_t>(w);
      o[1] = static_cast<uint8_t>(w >> 8);
      o[2] = static_cast<uint8_t>(w >> 16);
    }
  } else {
    for (uint32_t k = 0; k < d; ++k) {
      const uint32_t bit = k * bits;
      // An index straddles at most two bytes (bits <= 8).
      const uint32_t word = uint32_t{q[k]} << (bit % 8);
      dst[bit / 8] |= static_cast<uint8_t>(word);
      if ((bit % 8) + bits > 8) dst[bit / 8 + 1] |= static_cast<uint8_t>(word >> 8);
    }
  }
}

// Encodes `vectors` head vectors of d elements at x: norms (fp32) and packed
// indices (zeroed by the caller). One function per target (OKV_TQ_CLONES).
OKV_TQ_CLONES void EncodeVectors(const uint8_t* x, uint64_t vectors, uint32_t d, uint32_t bits,
                                 bool bf16, const std::vector<float>& boundary,
                                 const uint32_t* neg0, const uint32_t* neg1, uint8_t* norms,
                                 uint8_t* packed) {
  const size_t vec_bytes = size_t{d} * bits / 8;
  const F8 scale = F8{} + 1.0f / static_cast<float>(d);
  std::vector<float> v(d);
  std::vector<uint8_t> q(d);
  for (uint64_t n = 0; n < vectors; ++n, x += 2 * size_t{d}) {
    for (uint32_t k = 0; k < d; ++k) v[k] = Half16ToFloat(Load16(x + 2 * k), bf16);
    double ss = 0;  // in element order: the norm's bits depend on it
    for (uint32_t k = 0; k < d; ++k) ss += double(v[k]) * double(v[k]);
    float norm = static_cast<float>(std::sqrt(ss));
    if (!std::isfinite(norm)) norm = std::numeric_limits<float>::quiet_NaN();
    Store32(norms + 4 * n, FloatToBits(norm));
    if (norm > 0 && std::isfinite(norm)) {
      const F8 nv = F8{} + norm;
      for (uint32_t k = 0; k < d; k += 8) StoreV(&v[k], LoadV<F8>(&v[k]) / nv);
    } else {
      std::fill(v.begin(), v.end(), 0.0f);
    }
    ApplySigns(v.data(), neg0, d);
    Fwht(v.data(), d);
    ApplySigns(v.data(), neg1, d);
    Fwht(v.data(), d);
    // The index is the number of boundaries below y / d (NaN: none).
    for (uint32_t k = 0; k < d; k += 8) {
      const F8 y = LoadV<F8>(&v[k]) * scale;
      I8 idx = {};
      for (float b : boundary) idx -= y > (F8{} + b);  // true is -1
      for (uint32_t j = 0; j < 8; ++j) q[k + j] = static_cast<uint8_t>(idx[j]);
    }
    PackIndices(q.data(), d, bits, packed + n * vec_bytes);
  }
}

// Decodes `vectors` head vectors into out (bf16 or fp16): centroid c[index],
// the inverse rotation, times norm / d.
OKV_TQ_CLONES void DecodeVectors(const uint8_t* packed, const uint8_t* norms, uint64_t vectors,
                                 uint32_t d, uint32_t bits, bool bf16, const float* c,
                                 const uint32_t* neg0, const uint32_t* neg1, uint8_t* out) {
  const size_t vec_bytes = size_t{d} * bits / 8;
  const float inv_d = 1.0f / static_cast<float>(d);
  const uint32_t mask = (1u << bits) - 1;
  std::vector<float> v(d);
  for (uint64_t n = 0; n < vectors; ++n) {
    const uint8_t* src = packed + n * vec_bytes;
    for (uint32_t k = 0; k < d; ++k) {
      const uint32_t bit = k * bits;
      uint32_t word = src[bit / 8];
      if ((bit % 8) + bits > 8) word |= uint32_t{src[bit / 8 + 1]} << 8;
      v[k] = c[(word >> (bit % 8)) & mask];
    }
    Fwht(v.data(), d);
    ApplySigns(v.data(), neg1, d);
    Fwht(v.data(), d);
    const float norm = BitsToFloat(Load32(norms + 4 * n));
    uint8_t* dst = out + n * d * 2;
    for (uint32_t k = 0; k < d; ++k) {
      const float u = BitsToFloat(FloatToBits(v[k]) ^ neg0[k]) * inv_d;
      Store16(dst + 2 * k, FloatToHalf16(u * norm, bf16));
    }
  }
}

size_t FrameSize(uint32_t bits, uint64_t vectors, uint32_t dim) {
  return kTqCodebookOffset + 4 * (size_t{1} << bits) + 4 * vectors + vectors * dim * bits / 8;
}

Status Bad(const std::string& what) { return Status::Corruption("turboquant frame: " + what); }

}  // namespace

const std::vector<float>& TurboQuantCodebook(uint32_t dim, uint32_t bits) {
  return CachedCodebook(dim, bits).centroids;
}
double TurboQuantCodebookDistortion(uint32_t dim, uint32_t bits) {
  return CachedCodebook(dim, bits).distortion;
}

size_t TurboQuantMaxEncodedSize(uint32_t bits, const SegmentInfo& info, size_t raw_bytes) {
  const uint32_t dim = std::max<uint32_t>(info.head_dim, 1);
  return FrameSize(bits, raw_bytes / DTypeBytes(info.dtype) / dim, dim);
}

Status TurboQuantCheckShape(const SegmentInfo& info, uint64_t raw_bytes) {
  const uint32_t d = info.head_dim;
  if (info.dtype == DType::kFp8E4m3fn) {
    return Status::InvalidArgument("turboquant: fp8 segments are not quantised further");
  }
  if (!IsPowerOfTwo(d) || d < kTqMinDim || d > kTqMaxDim) {
    return Status::InvalidArgument("turboquant: head_dim " + std::to_string(d) +
                                   " is not a power of two in [32, 1024]");
  }
  if (raw_bytes % (2 * uint64_t{d}) != 0) {
    return Status::InvalidArgument("turboquant: segment of " + std::to_string(raw_bytes / 2) +
                                   " elements is not a whole number of head_dim " +
                                   std::to_string(d) + " vectors");
  }
  return Status::OK();
}

size_t WriteTurboQuantHeader(uint32_t bits, const SegmentInfo& info, uint64_t raw_bytes,
                             uint64_t seed, uint8_t* o) {
  const uint32_t d = info.head_dim;
  const uint64_t vectors = raw_bytes / 2 / d;
  const uint32_t levels = 1u << bits;
  WritePrefix(o, bits == 4 ? CodecId::kTurboQuant4 : CodecId::kTurboQuant3, info.dtype, 0,
              raw_bytes, FrameSize(bits, vectors, d), d);
  o[kTqBitsOffset] = static_cast<uint8_t>(bits);
  o[kTqRoundsOffset] = kTqRounds;
  o[34] = o[35] = 0;
  Store32(o + kTqVectorsOffset, static_cast<uint32_t>(vectors));
  Store64(o + kTqSeedOffset, seed);
  const std::vector<float>& c = TurboQuantCodebook(d, bits);
  for (uint32_t k = 0; k < levels; ++k) Store32(o + kTqCodebookOffset + 4 * k, FloatToBits(c[k]));
  return kTqCodebookOffset + 4 * levels;
}

Result<size_t> TurboQuantEncode(uint32_t bits, const SegmentInfo& info,
                                std::span<const uint8_t> raw, std::span<uint8_t> out,
                                const EncodeOptions& options) {
  ORBITKV_RETURN_IF_ERROR(TurboQuantCheckShape(info, raw.size()));
  const uint32_t d = info.head_dim;
  const bool bf16 = info.dtype == DType::kBf16;
  const uint64_t vectors = raw.size() / 2 / d;
  const uint32_t levels = 1u << bits;
  const size_t size = FrameSize(bits, vectors, d);
  uint8_t* o = out.data();
  WriteTurboQuantHeader(bits, info, raw.size(), options.turboquant_seed, o);
  const std::vector<float>& c = TurboQuantCodebook(d, bits);
  std::vector<float> boundary(levels - 1);
  for (uint32_t k = 0; k + 1 < levels; ++k) boundary[k] = (c[k] + c[k + 1]) * 0.5f;

  uint8_t* norms = o + kTqCodebookOffset + 4 * levels;
  uint8_t* packed = norms + 4 * vectors;
  std::fill(packed, packed + vectors * (size_t{d} * bits / 8), 0);
  const std::vector<uint32_t> neg0 = Signs(d, options.turboquant_seed, 0);
  const std::vector<uint32_t> neg1 = Signs(d, options.turboquant_seed, 1);
  EncodeVectors(raw.data(), vectors, d, bits, bf16, boundary, neg0.data(), neg1.data(), norms,
                packed);
  return size;
}

Status TurboQuantDecode(uint32_t bits, const FrameInfo& fi, std::span<const uint8_t> frame,
                        std::span<uint8_t> out) {
  const uint8_t* f = frame.data();
  const uint32_t d = fi.param;
  if (fi.dtype == DType::kFp8E4m3fn || fi.flags != 0) return Bad("bad dtype or flags");
  if (!IsPowerOfTwo(d) || d < kTqMinDim || d > kTqMaxDim) return Bad("bad head_dim");
  if (frame.size() < kTqCodebookOffset) return Bad("shorter than its header");
  if (f[kTqBitsOffset] != bits || f[kTqRoundsOffset] != kTqRounds || f[34] != 0 || f[35] != 0) {
    return Bad("bits, rounds or reserved bytes do not match the codec");
  }
  const uint64_t vectors = Load32(f + kTqVectorsOffset);
  if (vectors * d * 2 != fi.decoded_size || FrameSize(bits, vectors, d) != fi.frame_size) {
    return Bad("sizes do not match the vector count");
  }
  const uint64_t seed = Load64(f + kTqSeedOffset);
  const uint32_t levels = 1u << bits;
  float c[16];
  for (uint32_t k = 0; k < levels; ++k) c[k] = BitsToFloat(Load32(f + kTqCodebookOffset + 4 * k));
  const uint8_t* norms = f + kTqCodebookOffset + 4 * levels;
  const uint8_t* packed = norms + 4 * vectors;
  const bool bf16 = fi.dtype == DType::kBf16;
  const std::vector<uint32_t> neg0 = Signs(d, seed, 0);
  const std::vector<uint32_t> neg1 = Signs(d, seed, 1);
  DecodeVectors(packed, norms, vectors, d, bits, bf16, c, neg0.data(), neg1.data(), out.data());
  return Status::OK();
}

}  // namespace orbitkv::codec::internal
