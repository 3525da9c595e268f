// Byte layout of the codec frames below the common prefix (codec/codec.h),
// shared by the CPU codecs and the CUDA decoder: offsets, constants and
// little-endian loads/stores. C++17-clean (nvcc). Changing anything here is a
// format change: bump that codec's version in codec.h.
#pragma once

#include <cstdint>

#include "codec/float_bits.h"

namespace orbitkv::codec {

OKV_HD uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
OKV_HD uint32_t Load32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
OKV_HD uint64_t Load64(const uint8_t* p) { return Load32(p) | (uint64_t{Load32(p + 4)} << 32); }
OKV_HD void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
OKV_HD void Store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
OKV_HD void Store64(uint8_t* p, uint64_t v) {
  Store32(p, static_cast<uint32_t>(v));
  Store32(p + 4, static_cast<uint32_t>(v >> 32));
}

// The prefix (codec.h documents it).
inline constexpr uint32_t kFramePrefixBytes = 32;
inline constexpr uint32_t kFrameCrcOffset = 28;
inline constexpr uint32_t kFrameMagic = 0x43564b4fu;  // "OKVC" read little-endian
inline constexpr uint8_t kFrameFlagStored = 1;
inline constexpr uint32_t kPrefixCodec = 4;
inline constexpr uint32_t kPrefixVersion = 5;
inline constexpr uint32_t kPrefixDType = 6;
inline constexpr uint32_t kPrefixFlags = 7;
inline constexpr uint32_t kPrefixDecodedSize = 8;
inline constexpr uint32_t kPrefixFrameSize = 16;
inline constexpr uint32_t kPrefixParam = 24;

// The prefix with its CRC field zero (the encoders seal it last).
OKV_HD void WriteFramePrefix(uint8_t* out, uint8_t codec, uint8_t version, uint8_t dtype,
                             uint8_t flags, uint64_t decoded_size, uint64_t frame_size,
                             uint32_t param) {
  Store32(out, kFrameMagic);
  out[kPrefixCodec] = codec;
  out[kPrefixVersion] = version;
  out[kPrefixDType] = dtype;
  out[kPrefixFlags] = flags;
  Store64(out + kPrefixDecodedSize, decoded_size);
  Store64(out + kPrefixFrameSize, frame_size);
  Store32(out + kPrefixParam, param);
  Store32(out + kFrameCrcOffset, 0);
}

// ---- ans (version 1) --------------------------------------------------------
// One byte plane per element byte (plane p holds byte p of every element:
// bf16/fp16 plane 0 = low byte, plane 1 = sign/exponent byte). Each plane is
// cut into chunks of `param` elements; within a chunk, lane j (of 32) codes
// elements j, j+32, j+64, ... with its own 32-bit rANS state; all lanes share
// the chunk's stream of 16-bit words. A chunk's stream: 32 final encoder
// states (u32, lane order), then the renormalisation words in decode order
// (per step, lanes ascending), zero-padded to a multiple of 4 bytes.
//   [32]      planes u8 (= element bytes)     [33] lanes u8 (= 32)
//   [34, 36)  probability bits u16 (= 12)     [36, 40) chunks u32
//   [40 + 16p, 56 + 16p) plane p of 2: mode u8 (0 raw, 1 rANS), 3 zero bytes,
//             data offset u32, data size u32 (from the frame start), table
//             offset u32 (rANS: u16 freq[256] summing to 4096, then u32
//             chunk_end[chunks], stream ends relative to the data offset)
// A raw plane's data is its bytes in element order.
inline constexpr uint32_t kAnsLanes = 32;
inline constexpr uint32_t kAnsProbBits = 12;
inline constexpr uint32_t kAnsProbScale = 1u << kAnsProbBits;
inline constexpr uint32_t kAnsStateLow = 1u << 16;  // states live in [2^16, 2^32)
inline constexpr uint32_t kAnsMaxPlanes = 2;
inline constexpr uint32_t kAnsPlanesOffset = 32;
inline constexpr uint32_t kAnsLanesOffset = 33;
inline constexpr uint32_t kAnsProbBitsOffset = 34;
inline constexpr uint32_t kAnsChunksOffset = 36;
inline constexpr uint32_t kAnsPlaneDescOffset = 40;
inline constexpr uint32_t kAnsPlaneDescBytes = 16;
inline constexpr uint32_t kAnsHeaderBytes =
    kAnsPlaneDescOffset + kAnsMaxPlanes * kAnsPlaneDescBytes;
inline constexpr uint32_t kAnsFreqTableBytes = 256 * 2;
inline constexpr uint32_t kAnsStatesBytes = kAnsLanes * 4;
inline constexpr uint8_t kAnsPlaneRaw = 0;
inline constexpr uint8_t kAnsPlaneRans = 1;
inline constexpr uint32_t kAnsMaxChunkElements = 1u << 20;

// A decode table entry: symbol (8 bits), freq - 1 (12 bits), slot - cum (12 bits).
OKV_HD uint32_t AnsTableEntry(uint32_t sym, uint32_t freq, uint32_t bias) {
  return sym | ((freq - 1) << 8) | (bias << 20);
}
// One decode step of a state given its table entry; returns the new state
// (before renormalisation).
OKV_HD uint32_t AnsDecodeStep(uint32_t x, uint32_t entry) {
  const uint32_t freq = ((entry >> 8) & 0xfffu) + 1;
  return freq * (x >> kAnsProbBits) + (entry >> 20);
}

// ---- fp8 (version 1) --------------------------------------------------------
//   [32, 32 + 4 * groups)  fp32 scale per group of `param` elements (the last
//                          group may be shorter)
//   then one e4m3fn byte per element: e4m3fn(float(x) / scale)
// Decoding gives round_to_dtype(float(e4m3fn) * scale).
inline constexpr uint32_t kFp8ScalesOffset = 32;

// ---- TurboQuant (version 1) -------------------------------------------------
//   [32] bits u8 (3 or 4)    [33] rounds u8 (= 2)    [34, 36) zero
//   [36, 40) vectors u32     [40, 48) seed u64
//   [48, 48 + 4 * 2^bits)    codebook: fp32 centroids, ascending
//   then fp32 norm per vector, then the indices: per vector head_dim * bits
//   bits, index k at bits [k * bits, (k + 1) * bits) of the vector's bytes
//   read as one little-endian bit string.
// Vector x: u = x / |x|; y = H D2 H D1 u / d (H the unnormalised
// Walsh-Hadamard matrix, Dr = diag(TurboQuantSign(seed, r, k))); index k is
// the nearest centroid of y_k. Decoding: u' = D1 H D2 H c[idx] / d, x' = |x| u'.
inline constexpr uint32_t kTqBitsOffset = 32;
inline constexpr uint32_t kTqRoundsOffset = 33;
inline constexpr uint32_t kTqVectorsOffset = 36;
inline constexpr uint32_t kTqSeedOffset = 40;
inline constexpr uint32_t kTqCodebookOffset = 48;
inline constexpr uint32_t kTqRounds = 2;
inline constexpr uint32_t kTqMinDim = 32;
inline constexpr uint32_t kTqMaxDim = 1024;

// splitmix64: the sign of coordinate k in round r is bit 0 of the hash.
OKV_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
OKV_HD bool TurboQuantSignNegative(uint64_t seed, uint32_t round, uint32_t k) {
  return (SplitMix64(seed ^ (uint64_t{round} << 32 | k)) & 1) != 0;
}
OKV_HD float FlipSign(float v, bool negative) {
  return negative ? BitsToFloat(FloatToBits(v) ^ 0x80000000u) : v;
}

// Element conversions by dtype (bf16 / fp16), the same on CPU and GPU.
OKV_HD float Half16ToFloat(uint16_t h, bool bf16) { return bf16 ? Bf16ToFloat(h) : Fp16ToFloat(h); }
OKV_HD uint16_t FloatToHalf16(float f, bool bf16) { return bf16 ? FloatToBf16(f) : FloatToFp16(f); }

}  // namespace orbitkv::codec
