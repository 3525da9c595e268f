// Bit-exact scalar conversions between fp32 and the 16- and 8-bit KV element
// types (bf16, fp16, fp8 e4m3fn), shared by the CPU codecs and the CUDA
// kernels so that both produce the same bytes. Pure functions; C++17-clean
// (nvcc compiles .cu files as C++17).
//
// Rounding is round-to-nearest-even everywhere. FloatToE4m3fn reproduces
// PyTorch's `.to(torch.float8_e4m3fn)` (c10 fp8e4m3fn_from_fp32_value):
// magnitudes that round above 448 -- everything from 464 up, +-Inf and NaN --
// become the e4m3fn NaN 0x7f with the input's sign bit; there is no saturation.
// E4m3fnToFloat turns both NaNs into 0xffffffff, as PyTorch does.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OKV_HD __host__ __device__ __forceinline__
#else
#define OKV_HD inline
#endif

namespace orbitkv::codec {

OKV_HD float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
OKV_HD uint32_t FloatToBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

// The one NaN the 16-bit conversions give (all bits set, in bf16 and fp16
// alike): PyTorch's result for an e4m3fn NaN, and one pattern whatever NaN
// payload the arithmetic produced (the GPU's differ from the CPU's), so the
// CPU and CUDA decoders give the same bytes.
inline constexpr uint16_t kHalf16Nan = 0xffff;

OKV_HD float Bf16ToFloat(uint16_t h) { return BitsToFloat(uint32_t{h} << 16); }

// Every NaN becomes kHalf16Nan; everything else rounds to nearest even.
OKV_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kHalf16Nan;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

OKV_HD float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // Inf, NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in fp32.
  const float mag = static_cast<float>(mant) * BitsToFloat(0x33800000u);  // 2^-24
  return BitsToFloat(sign | FloatToBits(mag));
}

// Overflow gives Inf; every NaN becomes kHalf16Nan.
OKV_HD uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kHalf16Nan;
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536
  if (a < 0x38800000u) {
    // Below the smallest normal 2^-14: adding 0.5 (ulp 2^-24 there) rounds the
    // magnitude to a multiple of 2^-24 in hardware, nearest even.
    const float sum = BitsToFloat(a) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatToBits(sum) - 0x3f000000u));
  }
  uint32_t r = a - (112u << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline constexpr uint8_t kE4m3fnNan = 0x7f;
inline constexpr float kE4m3fnMax = 448.0f;

OKV_HD float E4m3fnToFloat(uint8_t b) {
  const uint32_t sign = uint32_t{b & 0x80u} << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  // NaN as PyTorch gives it (all bits set, whatever the sign).
  if (exp == 0xf && mant == 0x7) return BitsToFloat(0xffffffffu);
  if (exp != 0) return BitsToFloat(sign | ((exp + 120u) << 23) | (mant << 20));
  const float mag = static_cast<float>(mant) * BitsToFloat(0x3b000000u);  // 2^-9
  return BitsToFloat(sign | FloatToBits(mag));
}

OKV_HD uint8_t FloatToE4m3fn(float f) {
  const uint32_t u = FloatToBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x43f00000u) return static_cast<uint8_t>(sign | kE4m3fnNan);  // >= 480, Inf, NaN
  if (a < 0x3c800000u) {
    // Below the smallest normal 2^-6: 2^14 has ulp 2^-9, the e4m3 subnormal
    // step, so the hardware addition rounds to nearest even; the carry into
    // the exponent gives 0x08 (2^-6) correctly.
    const uint32_t sum = FloatToBits(BitsToFloat(a) + BitsToFloat(141u << 23));
    return static_cast<uint8_t>(sign | (sum - (141u << 23)));
  }
  // Rebias the exponent (127 -> 7) and drop 20 mantissa bits, nearest even;
  // [464, 480) carries into 0x7f, the NaN pattern, as PyTorch's does.
  uint32_t r = a - (120u << 23);
  r += 0x7ffffu + ((r >> 20) & 1u);
  return static_cast<uint8_t>(sign | (r >> 20));
}

// e4m3fn(x / scale), the fp8 encoder's step. A NaN x keeps its sign: the
// x86 division (and so PyTorch on the CPU) passes the NaN's sign through,
// the GPU's division returns a positive canonical NaN.
OKV_HD uint8_t ScaledToE4m3fn(float x, float scale) {
  if (x != x) return static_cast<uint8_t>(((FloatToBits(x) >> 24) & 0x80u) | kE4m3fnNan);
  return FloatToE4m3fn(x / scale);
}

}  // namespace orbitkv::codec
