// AVX2 rANS chunk decoder (ans_chunk.h): the 32 lanes as four vectors of
// eight states; per step, each vector gathers its table entries, advances,
// and refills the lanes below 2^16 from the next words of the stream in lane
// order (a movemask, a popcount and a permutation table), exactly as the
// scalar decoder does lane by lane. Compiled for AVX2 through function
// attributes; callers check AnsAvx2Available() first.
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

}  // namespace

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

}  // namespace orbitkv::codec::internal
