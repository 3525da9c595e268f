// rANS chunk coders of the ans codec (frame_layout.h "ans"), each in a
// portable scalar form and an AVX2 form (ans_avx2.cc, AVX2 through function
// attributes, called only where AnsAvx2Enabled()); the two give the same bytes.
// Decoders: one chunk stream of one byte plane into n symbols; false for a
// stream that is malformed (too short, words left over, final states not
// 2^16) without reading past stream[0, stream_bytes). Encoders: n symbols into
// the 32 final lane states and the chunk's renormalisation words in stream
// (decode) order; the plane histogram and the byte-plane split the encoder
// starts from. Internal to src/codec.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codec/ans_encode.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {

// table: 4096 entries (AnsTableEntry). REQUIRES: stream_bytes >= 128 and a
// multiple of 4; n in [1, kAnsMaxChunkElements].
using AnsChunkDecoder = bool (*)(const uint32_t* table, const uint8_t* stream, size_t stream_bytes,
                                 uint32_t n, uint8_t* sym);
bool AnsDecodeChunkScalar(const uint32_t* table, const uint8_t* stream, size_t stream_bytes,
                          uint32_t n, uint8_t* sym);
bool AnsDecodeChunkAvx2(const uint32_t* table, const uint8_t* stream, size_t stream_bytes,
                        uint32_t n, uint8_t* sym);

// A plane's encoder tables: the reference table and reciprocals (the scalar
// encoder's and the GPU's arithmetic, ans_encode.h) and, for the AVX2
// encoder, one 64-bit record per symbol: the low word the Granlund-Montgomery
// multiplier of freq (AnsDivMagic), the high word cum (bits 0-11), freq
// (12-24), the second shift (25-28) and the first shift (29).
struct AnsPlaneCoder {
  AnsEncTable table;
  uint64_t rcp[256];
  alignas(32) uint64_t record[256];
};
// Builds the coder from a histogram (count[256] summing to total > 0).
void AnsBuildPlaneCoder(const uint32_t* count, uint64_t total, AnsPlaneCoder* coder);

// floor(x / d) = (t + ((x - t) >> sh1)) >> sh2 with t = (x * magic) >> 32, for
// every x < 2^32 and 1 <= d <= 4096 (Granlund and Montgomery 1994, fig. 4.1:
// l = ceil(log2 d), magic = floor(2^32 (2^l - d) / d) + 1, sh1 = min(l, 1),
// sh2 = max(l - 1, 0)).
struct AnsDivMagic {
  uint32_t magic, sh1, sh2;
};
AnsDivMagic AnsMakeDivMagic(uint32_t d);
inline uint32_t AnsDivide(uint32_t x, const AnsDivMagic& m) {
  const uint32_t t = static_cast<uint32_t>((uint64_t{x} * m.magic) >> 32);
  return (t + ((x - t) >> m.sh1)) >> m.sh2;
}

// Encodes one chunk of n symbols (1 <= n <= kAnsMaxChunkElements): steps last
// to first, lanes 31..0 within a step (the order the decoder undoes). The
// words go below words_end, in stream order, ending at words_end; returns
// their count. state[32] receives the final lane states. REQUIRES: room for
// n + 8 words below words_end (the AVX2 encoder stores 8 at a time).
uint32_t AnsEncodeChunkScalar(const uint8_t* sym, uint32_t n, const AnsPlaneCoder& coder,
                              uint32_t* state, uint16_t* words_end);
uint32_t AnsEncodeChunkAvx2(const uint8_t* sym, uint32_t n, const AnsPlaneCoder& coder,
                            uint32_t* state, uint16_t* words_end);

// count[256] += the histogram of sym[0, n).
void AnsCountSymbols(const uint8_t* sym, size_t n, uint32_t* count);
// Splits n 16-bit elements into their low bytes (lo) and high bytes (hi),
// adding each plane's histogram to count_lo / count_hi (the AVX2 form counts
// from the registers it stores, so the planes are read once).
void AnsSplitPlanesScalar(const uint8_t* raw, size_t n, uint8_t* lo, uint8_t* hi,
                          uint32_t* count_lo, uint32_t* count_hi);
void AnsSplitPlanesAvx2(const uint8_t* raw, size_t n, uint8_t* lo, uint8_t* hi, uint32_t* count_lo,
                        uint32_t* count_hi);
// The inverse: n 16-bit elements from their low and high bytes.
void AnsJoinPlanesScalar(const uint8_t* lo, const uint8_t* hi, size_t n, uint8_t* out);
void AnsJoinPlanesAvx2(const uint8_t* lo, const uint8_t* hi, size_t n, uint8_t* out);

// A lower bound on the bytes of a plane's chunk streams (sum of
// AnsStreamBytes) that the encoder would write for a plane of this histogram
// and chunking, from the histogram alone (ans.cc derives it). The encoder
// takes the raw form without coding when this bound already reaches it.
uint64_t AnsCodedBytesLowerBound(const uint32_t* count, const AnsEncTable& table, uint64_t elems,
                                 uint32_t chunk);

// One step of `lanes` lanes (ascending), refilling from words[*pos...]: the
// scalar decoder's loop body and the AVX2 decoder's partial last step.
// Returns false when the stream runs out of words.
inline bool AnsDecodeLanes(const uint32_t* table, uint32_t* state, uint32_t lanes,
                           const uint8_t* words, size_t nwords, size_t* pos, uint8_t* sym) {
  for (uint32_t j = 0; j < lanes; ++j) {
    const uint32_t e = table[state[j] & (kAnsProbScale - 1)];
    sym[j] = static_cast<uint8_t>(e);
    uint32_t x = AnsDecodeStep(state[j], e);
    if (x < kAnsStateLow) {
      if (*pos >= nwords) return false;
      x = (x << 16) | Load16(words + 2 * (*pos)++);
    }
    state[j] = x;
  }
  return true;
}

// The lanes [0, lanes) of one encode step, lanes descending, in the scalar
// reference arithmetic (ans_encode.h); *w moves down by the words written.
// Writes w[-1] for every lane (a lane that does not renormalise leaves it to
// be overwritten), so one word of room below the last one is needed.
inline void AnsEncodeLanesScalar(const uint8_t* sym, uint32_t lanes, const AnsPlaneCoder& coder,
                                 uint32_t* state, uint16_t** w) {
  uint16_t* p = *w;
  for (uint32_t j = lanes; j-- > 0;) {
    const uint8_t s = sym[j];
    const uint32_t f = coder.table.freq[s];
    uint32_t x = state[j];
    const bool renorm = AnsRenorm(x, f);
    p[-1] = static_cast<uint16_t>(x);  // branch-free: renormalisation is a coin flip
    p -= renorm;
    x = renorm ? x >> 16 : x;
    state[j] = AnsEncodeStep(x, f, coder.table.cum[s], coder.rcp[s]);
  }
  *w = p;
}

// A chunk decoded in full: every lane back at the encoder's initial state and
// every word (and only the padding after them) consumed.
inline bool AnsChunkFinished(const uint32_t* state, size_t words_read, size_t stream_bytes) {
  for (uint32_t j = 0; j < kAnsLanes; ++j) {
    if (state[j] != kAnsStateLow) return false;
  }
  return (kAnsStatesBytes + 2 * words_read + 3) / 4 * 4 == stream_bytes;
}

}  // namespace orbitkv::codec::internal
