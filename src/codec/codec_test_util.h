// Test inputs for the codec tests, benchmark and fuzz seeds: KV-like bf16/fp16
// segments (normal values with per-channel scales, like a real K cache) and
// frame helpers. Deterministic for a given seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/float_bits.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::testing {

// `elems` elements of `dtype` (bf16/fp16), head vectors of head_dim with a
// per-channel scale in [0.05, 4) and a few 20x outlier channels.
inline std::vector<uint8_t> KvLikeSegment(size_t elems, DType dtype, uint32_t head_dim,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> channel(head_dim);
  for (auto& c : channel) c = 0.05f + 3.95f * unit(rng) * unit(rng);
  for (uint32_t k = 0; k < head_dim; k += 29) channel[k] *= 20.0f;
  std::vector<uint8_t> out(elems * 2);
  for (size_t i = 0; i < elems; ++i) {
    const float v = normal(rng) * channel[i % head_dim];
    Store16(out.data() + 2 * i, FloatToHalf16(v, dtype == DType::kBf16));
  }
  return out;
}

// KV-like elements from an integer hash only (no <random> distributions, whose
// output may differ between standard libraries): each value a sum of four
// uniforms in (-1, 1) times a per-channel scale in [1/16, 4), every 29th channel
// 20x, and with `specials` one element in 97 NaN, +-Inf, a denormal or +-0. The
// same bytes on every host, so encoded frames can be pinned (codec_test).
inline std::vector<uint8_t> HashedKvSegment(size_t elems, DType dtype, uint32_t head_dim,
                                            uint64_t seed, bool specials) {
  const bool bf16 = dtype == DType::kBf16;
  std::vector<uint8_t> out(elems * 2);
  for (size_t i = 0; i < elems; ++i) {
    const uint64_t c = i % head_dim;
    const uint64_t hc = SplitMix64(seed * 0x100000001b3ull + c);
    float scale = 0.0625f + static_cast<float>(hc >> 40) * (3.9375f / 16777216.0f);
    if (c % 29 == 0) scale *= 20.0f;
    const uint64_t h = SplitMix64(seed ^ (0xa0761d6478bd642full * (i + 1)));
    float v = 0;
    for (int k = 0; k < 4; ++k) {
      v += static_cast<float>((h >> (16 * k)) & 0xffff) * (2.0f / 65536.0f) - 1.0f;
    }
    uint16_t bits = FloatToHalf16(v * scale, bf16);
    if (specials && h % 97 == 0) {
      const uint16_t special[2][6] = {{0x7fc0, 0x7f80, 0xff80, 0x0001, 0x0000, 0x8000},
                                      {0x7e00, 0x7c00, 0xfc00, 0x0001, 0x0000, 0x8000}};
      bits = special[bf16 ? 0 : 1][(h >> 8) % 6];
    }
    Store16(out.data() + 2 * i, bits);
  }
  return out;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// Bytes that follow a geometric law of ratio q, capped at 255 (many rare
// symbols: the ans frequency normalisation's take-back loop runs).
inline std::vector<uint8_t> Skewed(size_t n, double q, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::geometric_distribution<int> g(q);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(std::min(g(rng), 255));
  return out;
}

// Rewrites the frame's CRC so that a deliberately altered frame reaches the
// codec's own checks.
inline void ResealFrame(std::vector<uint8_t>& frame) {
  if (frame.size() >= kFramePrefixBytes) Store32(frame.data() + kFrameCrcOffset, FrameCrc(frame));
}

inline std::vector<uint8_t> EncodeOrDie(CodecId id, const SegmentInfo& info,
                                        const std::vector<uint8_t>& raw,
                                        const EncodeOptions& options = {}) {
  std::vector<uint8_t> frame(MaxEncodedSize(id, info, raw.size()));
  Result<size_t> n = Encode(id, info, raw, frame, options);
  if (!n.ok()) std::abort();
  frame.resize(*n);
  return frame;
}

}  // namespace orbitkv::codec::testing
