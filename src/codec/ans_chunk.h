// rANS chunk decoders of the ans codec (frame_layout.h "ans"): the portable
// scalar one and an AVX2 one (ans_avx2.cc, built with -mavx2, called only
// where the CPU has AVX2). Both decode one chunk stream of one byte plane
// into n symbols and give the same bytes; both return false for a stream
// that is malformed (too short, words left over, final states not 2^16)
// without reading past stream[0, stream_bytes). Internal to src/codec.
#pragma once

#include <cstddef>
#include <cstdint>

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

// A chunk decoded in full: every lane back at the encoder's initial state and
// every word (and only the padding after them) consumed.
inline bool AnsChunkFinished(const uint32_t* state, size_t words_read, size_t stream_bytes) {
  for (uint32_t j = 0; j < kAnsLanes; ++j) {
    if (state[j] != kAnsStateLow) return false;
  }
  return (kAnsStatesBytes + 2 * words_read + 3) / 4 * 4 == stream_bytes;
}

}  // namespace orbitkv::codec::internal
