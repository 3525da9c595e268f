// AVX2 rANS chunk coders (ans_chunk.h): the 32 lanes as four vectors of
// eight states. Decoding, per step, each vector gathers its table entries,
// advances, and refills the lanes below 2^16 from the next words of the
// stream in lane order (a movemask, a popcount and a permutation table),
// exactly as the scalar decoder does lane by lane. Encoding, per step from the
// last, vectors 3..0 each gather their symbols' records, store the low words
// of the lanes that renormalise (compressed by a shuffle table, lanes
// ascending, just below the words already written) and advance with an exact
// division by multiplication, exactly as the scalar encoder does lanes
// 31..0. Compiled for AVX2 through function attributes; callers check
// CodecAvx2Enabled() first.
#include <immintrin.h>

#include <array>

#include "codec/ans_chunk.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {
namespace {

// kRank[m][i]: the index among the set bits of m of lane i's word.
struct RankTable {
  alignas(32) uint32_t v[256][8];
  constexpr RankTable() : v() {
    for (int m = 0; m < 256; ++m) {
      int rank = 0;
      for (int i = 0; i < 8; ++i) {
        v[m][i] = (m >> i) & 1 ? rank++ : 0;
      }
    }
  }
};
constexpr RankTable kRank;

// kTop[m]: the pshufb control that puts the 16-bit slots of m's set bits,
// ascending, in the top popcount(m) of eight slots (the others zero).
struct TopTable {
  alignas(16) uint8_t v[256][16];
  constexpr TopTable() : v() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int i = 0; i < 8; ++i) k += (m >> i) & 1;
      for (int i = 0; i < 16; ++i) v[m][i] = 0x80;
      int slot = 8 - k;
      for (int i = 0; i < 8; ++i) {
        if ((m >> i) & 1) {
          v[m][2 * slot] = static_cast<uint8_t>(2 * i);
          v[m][2 * slot + 1] = static_cast<uint8_t>(2 * i + 1);
          ++slot;
        }
      }
    }
  }
};
constexpr TopTable kTop;

}  // namespace

__attribute__((target("avx2,popcnt"))) uint32_t AnsEncodeChunkAvx2(const uint8_t* sym, uint32_t n,
                                                                   const AnsPlaneCoder& coder,
                                                                   uint32_t* state,
                                                                   uint16_t* words_end) {
  for (uint32_t j = 0; j < kAnsLanes; ++j) state[j] = kAnsStateLow;
  uint16_t* w = words_end;
  const uint32_t full = n / kAnsLanes;
  // The partial last step comes first, lane by lane.
  AnsEncodeLanesScalar(sym + size_t{full} * kAnsLanes, n % kAnsLanes, coder, state, &w);
  __m256i x[4];
  for (int g = 0; g < 4; ++g) {
    x[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state + 8 * g));
  }
  const auto* rec = reinterpret_cast<const long long*>(coder.record);
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  const __m256i mask12 = _mm256_set1_epi32(0xfff);
  const __m256i mask13 = _mm256_set1_epi32(0x1fff);
  const __m256i mask4 = _mm256_set1_epi32(0xf);
  const __m256i scale = _mm256_set1_epi32(kAnsProbScale);
  for (uint32_t t = full; t-- > 0;) {
    const uint8_t* s = sym + size_t{t} * kAnsLanes;
#pragma GCC unroll 4
    for (int g = 4; g-- > 0;) {
      // Records of lanes 0, 1, 4, 5 and 2, 3, 6, 7: one shuffle_ps per field
      // then gives lane order. Eight scalar loads beat two 64-bit gathers
      // here (AMD Zen 3).
      const uint8_t* sg = s + 8 * g;
      const __m256 ra =
          _mm256_castsi256_ps(_mm256_setr_epi64x(rec[sg[0]], rec[sg[1]], rec[sg[4]], rec[sg[5]]));
      const __m256 rb =
          _mm256_castsi256_ps(_mm256_setr_epi64x(rec[sg[2]], rec[sg[3]], rec[sg[6]], rec[sg[7]]));
      const __m256i magic = _mm256_castps_si256(_mm256_shuffle_ps(ra, rb, 0x88));
      const __m256i packed = _mm256_castps_si256(_mm256_shuffle_ps(ra, rb, 0xdd));
      const __m256i f = _mm256_and_si256(_mm256_srli_epi32(packed, 12), mask13);
      __m256i v = x[g];
      // x >= f << 20, i.e. (x >> 20) >= f (both below 2^13).
      // keep: no renormalisation, x < f << 20, i.e. (x >> 20) < f (both below 2^13).
      const __m256i keep = _mm256_cmpgt_epi32(f, _mm256_srli_epi32(v, 20));
      const uint32_t m =
          ~static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(keep))) & 0xffu;
      // Branch-free (m is often 0 on skewed planes): eight slots stored, the
      // popcount(m) top ones kept.
      const __m256i lo = _mm256_and_si256(v, low16);
      const __m128i w8 =
          _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(lo, lo), 0x08));
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(w - 8),
          _mm_shuffle_epi8(w8, _mm_load_si128(reinterpret_cast<const __m128i*>(kTop.v[m]))));
      w -= __builtin_popcount(m);
      v = _mm256_blendv_epi8(_mm256_srli_epi32(v, 16), v, keep);
      // q = floor(v / f) (AnsDivide), then v + cum + q * (4096 - f).
      const __m256i t_even = _mm256_srli_epi64(_mm256_mul_epu32(v, magic), 32);
      const __m256i t_odd =
          _mm256_mul_epu32(_mm256_srli_epi64(v, 32), _mm256_srli_epi64(magic, 32));
      const __m256i th = _mm256_blend_epi32(t_even, t_odd, 0xaa);
      const __m256i sh1 = _mm256_srli_epi32(packed, 29);
      const __m256i sh2 = _mm256_and_si256(_mm256_srli_epi32(packed, 25), mask4);
      const __m256i q = _mm256_srlv_epi32(
          _mm256_add_epi32(th, _mm256_srlv_epi32(_mm256_sub_epi32(v, th), sh1)), sh2);
      const __m256i cum = _mm256_and_si256(packed, mask12);
      x[g] = _mm256_add_epi32(_mm256_add_epi32(v, cum),
                              _mm256_mullo_epi32(q, _mm256_sub_epi32(scale, f)));
    }
  }
  for (int g = 0; g < 4; ++g) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(state + 8 * g), x[g]);
  }
  return static_cast<uint32_t>(words_end - w);
}

__attribute__((target("avx2"))) void AnsSplitPlanesAvx2(const uint8_t* raw, size_t n, uint8_t* lo,
                                                        uint8_t* hi, uint32_t* count_lo,
                                                        uint32_t* count_hi) {
  // Per 128-bit half: the eight low bytes, then the eight high bytes.
  const __m256i order = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                         4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  // Eight tables per plane (one per byte of a 64-bit word), as AnsCountSymbols.
  uint32_t c[2][8][256] = {};
  const auto count = [](uint32_t(&t)[8][256], uint64_t x) {
    ++t[0][x & 0xff];
    ++t[1][(x >> 8) & 0xff];
    ++t[2][(x >> 16) & 0xff];
    ++t[3][(x >> 24) & 0xff];
    ++t[4][(x >> 32) & 0xff];
    ++t[5][(x >> 40) & 0xff];
    ++t[6][(x >> 48) & 0xff];
    ++t[7][x >> 56];
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + 2 * i)),
                            order),
        0xd8);
    const __m128i l = _mm256_castsi256_si128(v);
    const __m128i h = _mm256_extracti128_si256(v, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + i), l);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + i), h);
    count(c[0], static_cast<uint64_t>(_mm_cvtsi128_si64(l)));
    count(c[0], static_cast<uint64_t>(_mm_extract_epi64(l, 1)));
    count(c[1], static_cast<uint64_t>(_mm_cvtsi128_si64(h)));
    count(c[1], static_cast<uint64_t>(_mm_extract_epi64(h, 1)));
  }
  for (int s = 0; s < 256; ++s) {
    for (int k = 0; k < 8; ++k) {
      count_lo[s] += c[0][k][s];
      count_hi[s] += c[1][k][s];
    }
  }
  AnsSplitPlanesScalar(raw + 2 * i, n - i, lo + i, hi + i, count_lo, count_hi);
}

__attribute__((target("avx2,popcnt"))) bool AnsDecodeChunkAvx2(const uint32_t* table,
                                                               const uint8_t* stream,
                                                               size_t stream_bytes, uint32_t n,
                                                               uint8_t* sym) {
  const uint8_t* words = stream + kAnsStatesBytes;
  const size_t nwords = (stream_bytes - kAnsStatesBytes) / 2;
  size_t pos = 0;
  __m256i x[4];
  for (int g = 0; g < 4; ++g) {
    x[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(stream + 32 * g));
  }
  const __m256i slot_mask = _mm256_set1_epi32(kAnsProbScale - 1);
  const __m256i byte_mask = _mm256_set1_epi32(0xff);
  const __m256i freq_mask = _mm256_set1_epi32(0xfff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const uint32_t full = n / kAnsLanes;
  for (uint32_t t = 0; t < full; ++t) {
    __m256i s[4];
    for (int g = 0; g < 4; ++g) {
      const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table),
                                               _mm256_and_si256(x[g], slot_mask), 4);
      s[g] = _mm256_and_si256(e, byte_mask);
      const __m256i freq =
          _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), freq_mask), one);
      __m256i v = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x[g], kAnsProbBits)),
                                   _mm256_srli_epi32(e, 20));
      const __m256i need = _mm256_cmpeq_epi32(_mm256_srli_epi32(v, 16), zero);
      const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(need)));
      if (m != 0) {
        const uint32_t k = static_cast<uint32_t>(__builtin_popcount(m));
        if (pos + k > nwords) return false;
        __m128i w16;
        if (pos + 8 <= nwords) {
          w16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(words + 2 * pos));
        } else {
          alignas(16) uint16_t tmp[8] = {};
          for (uint32_t i = 0; i < k; ++i) tmp[i] = Load16(words + 2 * (pos + i));
          w16 = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
        }
        const __m256i w = _mm256_permutevar8x32_epi32(
            _mm256_cvtepu16_epi32(w16),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(kRank.v[m])));
        v = _mm256_blendv_epi8(v, _mm256_or_si256(_mm256_slli_epi32(v, 16), w), need);
        pos += k;
      }
      x[g] = v;
    }
    const __m256i a = _mm256_packus_epi32(s[0], s[1]);
    const __m256i b = _mm256_packus_epi32(s[2], s[3]);
    const __m256i c = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sym + size_t{t} * kAnsLanes), c);
  }
  alignas(32) uint32_t state[kAnsLanes];
  for (int g = 0; g < 4; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(state + 8 * g), x[g]);
  // The partial last step, lane by lane.
  return AnsDecodeLanes(table, state, n % kAnsLanes, words, nwords, &pos, sym + full * kAnsLanes) &&
         AnsChunkFinished(state, pos, stream_bytes);
}

__attribute__((target("avx2"))) void AnsJoinPlanesAvx2(const uint8_t* lo, const uint8_t* hi,
                                                       size_t n, uint8_t* out) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + i));
    // Per 128-bit half: elements 0-7 and 16-23 (low), 8-15 and 24-31 (high).
    const __m256i l = _mm256_unpacklo_epi8(a, b);
    const __m256i h = _mm256_unpackhi_epi8(a, b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm256_permute2x128_si256(l, h, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 32),
                        _mm256_permute2x128_si256(l, h, 0x31));
  }
  AnsJoinPlanesScalar(lo + i, hi + i, n - i, out + 2 * i);
}

}  // namespace orbitkv::codec::internal
