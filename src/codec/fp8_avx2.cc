// AVX2 halves of the fp8 codec (codec_internal.h): a group's finite amax,
// e4m3fn(x / scale) and dtype(e4m3fn * scale), eight elements per vector, the
// conversions of float_bits.h done on the bit patterns lane by lane (the same
// integer steps and the same IEEE division, multiplication and additions), so
// every byte is the scalar loop's. Tails shorter than a vector take the
// scalar functions. Compiled for AVX2 through function attributes; callers
// check CodecAvx2Enabled() first.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "codec/codec_internal.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {
namespace {

#define OKV_AVX2 __attribute__((target("avx2"), always_inline)) inline

OKV_AVX2 __m256i Set(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

// a ? b : c per 32-bit lane (a all ones or zero).
OKV_AVX2 __m256i Select(__m256i a, __m256i b, __m256i c) { return _mm256_blendv_epi8(c, b, a); }

// Eight bf16/fp16 elements as fp32 bit patterns (Bf16ToFloat, Fp16ToFloat).
OKV_AVX2 __m256i Half16ToFloatBits(const uint8_t* p, bool bf16) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if (bf16) return _mm256_slli_epi32(h, 16);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, Set(0x8000)), 16);
  const __m256i exp = _mm256_and_si256(_mm256_srli_epi32(h, 10), Set(0x1f));
  const __m256i mant13 = _mm256_slli_epi32(_mm256_and_si256(h, Set(0x3ff)), 13);
  const __m256i normal =
      _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(exp, Set(112)), 23), mant13);
  const __m256i infnan = _mm256_or_si256(Set(0x7f800000u), mant13);
  // mant * 2^-24, exact in fp32.
  const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(
      _mm256_cvtepi32_ps(_mm256_srli_epi32(mant13, 13)), _mm256_castsi256_ps(Set(0x33800000u))));
  const __m256i mag = Select(_mm256_cmpeq_epi32(exp, Set(0x1f)), infnan,
                             Select(_mm256_cmpeq_epi32(exp, _mm256_setzero_si256()), sub, normal));
  return _mm256_or_si256(sign, mag);
}

// FloatToE4m3fn of eight fp32 bit patterns; the results in the lanes' low bytes.
OKV_AVX2 __m256i FloatBitsToE4m3fn(__m256i u) {
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), Set(0x80));
  const __m256i a = _mm256_and_si256(u, Set(0x7fffffffu));
  const __m256i big = _mm256_cmpgt_epi32(a, Set(0x43efffffu));    // >= 480, Inf, NaN
  const __m256i small = _mm256_cmpgt_epi32(Set(0x3c800000u), a);  // below 2^-6
  const __m256i k141 = Set(141u << 23);
  const __m256i sub = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(k141))), k141);
  __m256i r = _mm256_sub_epi32(a, Set(120u << 23));
  r = _mm256_add_epi32(
      r, _mm256_add_epi32(Set(0x7ffff), _mm256_and_si256(_mm256_srli_epi32(r, 20), Set(1))));
  const __m256i normal = _mm256_srli_epi32(r, 20);
  return _mm256_or_si256(sign, Select(big, Set(kE4m3fnNan), Select(small, sub, normal)));
}

// E4m3fnToFloat of eight bytes, as fp32 bit patterns.
OKV_AVX2 __m256i E4m3fnToFloatBits(const uint8_t* p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, Set(0x80)), 24);
  const __m256i exp = _mm256_and_si256(_mm256_srli_epi32(b, 3), Set(0xf));
  const __m256i mant = _mm256_and_si256(b, Set(7));
  const __m256i normal = _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(exp, Set(120)), 23),
                                         _mm256_slli_epi32(mant, 20));
  const __m256i sub = _mm256_castps_si256(
      _mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_castsi256_ps(Set(0x3b000000u))));  // 2^-9
  const __m256i mag =
      _mm256_or_si256(sign, Select(_mm256_cmpeq_epi32(exp, _mm256_setzero_si256()), sub, normal));
  const __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(b, Set(0x7f)), Set(0x7f));
  return _mm256_or_si256(mag, nan);  // NaN: all bits set
}

// FloatToBf16 / FloatToFp16 of eight fp32 bit patterns, in the lanes' low halves.
OKV_AVX2 __m256i FloatBitsToHalf16(__m256i u, bool bf16) {
  const __m256i a = _mm256_and_si256(u, Set(0x7fffffffu));
  const __m256i nan = _mm256_cmpgt_epi32(a, Set(0x7f800000u));
  if (bf16) {
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(
            u, _mm256_add_epi32(Set(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), Set(1)))),
        16);
    return Select(nan, Set(kHalf16Nan), r);
  }
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), Set(0x8000));
  const __m256i inf = _mm256_cmpgt_epi32(a, Set(0x477fefffu));    // rounds to >= 65536
  const __m256i small = _mm256_cmpgt_epi32(Set(0x38800000u), a);  // below 2^-14
  const __m256i sub = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(0.5f))),
      Set(0x3f000000u));
  __m256i r = _mm256_sub_epi32(a, Set(112u << 23));
  r = _mm256_add_epi32(
      r, _mm256_add_epi32(Set(0xfff), _mm256_and_si256(_mm256_srli_epi32(r, 13), Set(1))));
  const __m256i mag = Select(inf, Set(0x7c00), Select(small, sub, _mm256_srli_epi32(r, 13)));
  return Select(nan, Set(kHalf16Nan), _mm256_or_si256(sign, mag));
}

}  // namespace

__attribute__((target("avx2"))) float Fp8GroupAmaxAvx2(const uint8_t* raw, size_t n, bool bf16) {
  // |x| orders as its magnitude bits; finite: below the Inf pattern.
  const __m256i limit = _mm256_set1_epi16(static_cast<int16_t>(bf16 ? 0x7f80 : 0x7c00));
  const __m256i abs = _mm256_set1_epi16(0x7fff);
  __m256i m = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + 2 * i)), abs);
    m = _mm256_max_epu16(m, _mm256_and_si256(a, _mm256_cmpgt_epi16(limit, a)));
  }
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  float amax = Half16ToFloat(*std::max_element(lanes, lanes + 16), bf16);
  for (; i < n; ++i) {
    const float a = std::fabs(Half16ToFloat(Load16(raw + 2 * i), bf16));
    if (a <= std::numeric_limits<float>::max()) amax = std::max(amax, a);
  }
  return amax;
}

__attribute__((target("avx2"))) void Fp8EncodeGroupAvx2(const uint8_t* raw, size_t n, bool bf16,
                                                        float scale, uint8_t* payload) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = Half16ToFloatBits(raw + 2 * i, bf16);
    const __m256 x = _mm256_castsi256_ps(u);
    __m256i e = FloatBitsToE4m3fn(_mm256_castps_si256(_mm256_div_ps(x, s)));
    // A NaN keeps its own sign (ScaledToE4m3fn).
    const __m256i nan_e =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 24), Set(0x80)), Set(kE4m3fnNan));
    e = Select(_mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)), nan_e, e);
    const __m256i p16 = _mm256_packus_epi32(e, e);
    const __m256i p8 = _mm256_packus_epi16(p16, p16);
    _mm_storel_epi64(
        reinterpret_cast<__m128i*>(payload + i),
        _mm_unpacklo_epi32(_mm256_castsi256_si128(p8), _mm256_extracti128_si256(p8, 1)));
  }
  for (; i < n; ++i) payload[i] = ScaledToE4m3fn(Half16ToFloat(Load16(raw + 2 * i), bf16), scale);
}

__attribute__((target("avx2"))) void Fp8DecodeGroupAvx2(const uint8_t* payload, size_t n, bool bf16,
                                                        float scale, uint8_t* out) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_castsi256_ps(E4m3fnToFloatBits(payload + i)), s);
    const __m256i h = FloatBitsToHalf16(_mm256_castps_si256(x), bf16);
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(out + 2 * i),
        _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08)));
  }
  for (; i < n; ++i) {
    Store16(out + 2 * i, FloatToHalf16(E4m3fnToFloat(payload[i]) * scale, bf16));
  }
}

}  // namespace orbitkv::codec::internal
