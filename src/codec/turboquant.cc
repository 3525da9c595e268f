// TurboQuant-MSE (Zandieh et al., arXiv:2504.19874, Algorithm 1) for KV head
// vectors, frame_layout.h "TurboQuant": the norm kept in fp32, the unit
// vector rotated by a seeded two-round randomised Hadamard transform (in
// place of the paper's dense random rotation: O(d log d), and two rounds so
// that sparse inputs spread too), then each coordinate quantised to the
// nearest centroid of the Lloyd-Max codebook for the coordinate distribution.
#include <algorithm>
#include <cmath>
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

// In-place unnormalised Walsh-Hadamard transform; the butterfly order is the
// CUDA decoder's (each stage's a + b, a - b on the same operands).
void Fwht(float* v, uint32_t d) {
  for (uint32_t h = 1; h < d; h *= 2) {
    for (uint32_t i = 0; i < d; i += 2 * h) {
      for (uint32_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
}

// The sign bits of one round, hashed once per frame.
std::vector<uint8_t> Signs(uint32_t d, uint64_t seed, uint32_t round) {
  std::vector<uint8_t> neg(d);
  for (uint32_t k = 0; k < d; ++k) neg[k] = TurboQuantSignNegative(seed, round, k);
  return neg;
}

void ApplySigns(float* v, const std::vector<uint8_t>& neg) {
  for (size_t k = 0; k < neg.size(); ++k) v[k] = FlipSign(v[k], neg[k] != 0);
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
  const size_t vec_bytes = size_t{d} * bits / 8;
  std::fill(packed, packed + vectors * vec_bytes, 0);
  const float inv_d = 1.0f / static_cast<float>(d);
  const std::vector<uint8_t> neg0 = Signs(d, options.turboquant_seed, 0);
  const std::vector<uint8_t> neg1 = Signs(d, options.turboquant_seed, 1);
  std::vector<float> v(d);
  for (uint64_t n = 0; n < vectors; ++n) {
    const uint8_t* x = raw.data() + n * d * 2;
    double ss = 0;
    for (uint32_t k = 0; k < d; ++k) {
      v[k] = Half16ToFloat(Load16(x + 2 * k), bf16);
      ss += double(v[k]) * double(v[k]);
    }
    float norm = static_cast<float>(std::sqrt(ss));
    if (!std::isfinite(norm)) norm = std::numeric_limits<float>::quiet_NaN();
    Store32(norms + 4 * n, FloatToBits(norm));
    const bool scale = norm > 0 && std::isfinite(norm);
    for (uint32_t k = 0; k < d; ++k) v[k] = scale ? v[k] / norm : 0.0f;
    ApplySigns(v.data(), neg0);
    Fwht(v.data(), d);
    ApplySigns(v.data(), neg1);
    Fwht(v.data(), d);
    uint8_t* dst = packed + n * vec_bytes;
    for (uint32_t k = 0; k < d; ++k) {
      const float y = v[k] * inv_d;
      uint32_t idx = 0;
      for (float b : boundary) idx += y > b ? 1 : 0;
      const uint32_t bit = k * bits;
      // An index straddles at most two bytes (bits <= 8).
      const uint32_t word = idx << (bit % 8);
      dst[bit / 8] |= static_cast<uint8_t>(word);
      if ((bit % 8) + bits > 8) dst[bit / 8 + 1] |= static_cast<uint8_t>(word >> 8);
    }
  }
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
  const size_t vec_bytes = size_t{d} * bits / 8;
  const bool bf16 = fi.dtype == DType::kBf16;
  const float inv_d = 1.0f / static_cast<float>(d);
  const uint32_t mask = levels - 1;
  const std::vector<uint8_t> neg0 = Signs(d, seed, 0);
  const std::vector<uint8_t> neg1 = Signs(d, seed, 1);
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
    ApplySigns(v.data(), neg1);
    Fwht(v.data(), d);
    const float norm = BitsToFloat(Load32(norms + 4 * n));
    uint8_t* dst = out.data() + n * d * 2;
    for (uint32_t k = 0; k < d; ++k) {
      const float u = FlipSign(v[k], neg0[k] != 0) * inv_d;
      Store16(dst + 2 * k, FloatToHalf16(u * norm, bf16));
    }
  }
  return Status::OK();
}

}  // namespace orbitkv::codec::internal
