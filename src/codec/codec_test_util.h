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
