// The ans encoder's arithmetic and frame layout (format: frame_layout.h
// "ans"), as __host__ __device__ functions shared by the CPU encoder
// (ans.cc), the CUDA encoder (codec_kernels.cu) and the CPU emulation of the
// CUDA encoder's grid (ans_encode_test.cc), so all three write the same bytes.
//
// The CUDA encoder runs in passes: a histogram per plane; the frequency
// table (AnsBuildEncTable); one warp per (plane, chunk) counting the chunk's
// renormalisation words; one block per frame laying the frame out from those
// counts (AnsPlanFrame, AnsWriteHeader, chunk_end prefix sums); one warp per
// (plane, chunk) encoding again and writing each word at its final place.
// A chunk's 32 lanes are independent but share one word stream: encoding runs
// steps from last to first and lanes 31..0 within a step, and the stream holds
// the words reversed, so the word lane j emits at a step goes to position
// total - 1 - (words emitted at later steps + words of lanes above j at this
// step), which a warp gets from a ballot (AnsEncodeLane). Pure functions;
// C++17-clean (nvcc). Internal to src/codec.
#pragma once

#include <cstdint>

#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {

OKV_HD uint32_t AnsPopcount(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(v));
#else
  return static_cast<uint32_t>(__builtin_popcount(v));
#endif
}

OKV_HD uint64_t AnsAlign4(uint64_t v) { return (v + 3) / 4 * 4; }

// Elements per chunk: `requested`, or by segment size when 0: enough chunks
// to spread one segment over 32 GPU warps, none so small that the 128 bytes
// of lane states per chunk weigh.
OKV_HD uint32_t AnsChunkElements(uint64_t elems, uint32_t requested) {
  if (requested != 0) return requested;
  const uint64_t per32 = (elems + 31) / 32;
  const uint64_t rounded = (per32 + 31) / 32 * 32;
  return static_cast<uint32_t>(rounded < 2048 ? 2048 : (rounded > 8192 ? 8192 : rounded));
}

OKV_HD uint32_t AnsChunkCount(uint64_t elems, uint32_t chunk) {
  return static_cast<uint32_t>((elems + chunk - 1) / chunk);
}

// Symbols in chunk c.
OKV_HD uint32_t AnsChunkLength(uint64_t elems, uint32_t chunk, uint32_t c) {
  const uint64_t first = uint64_t{c} * chunk;
  const uint64_t left = elems - first;
  return static_cast<uint32_t>(left < chunk ? left : chunk);
}

// A chunk stream's bytes: the lane states, `words` words, zero padding to 4.
OKV_HD uint32_t AnsStreamBytes(uint32_t words) {
  return static_cast<uint32_t>(AnsAlign4(kAnsStatesBytes + 2 * uint64_t{words}));
}

// A plane's encoding table: freq[s] sums to kAnsProbScale, every present
// symbol >= 1; cum[s] = sum of freq[0, s).
struct AnsEncTable {
  uint16_t freq[256];
  uint32_t cum[256];
};

// Scales a histogram (count[256], summing to total > 0) to kAnsProbScale.
OKV_HD void AnsNormalizeFrequencies(const uint32_t* count, uint64_t total, uint16_t* freq) {
  int64_t sum = 0;
  int biggest = 0;
  for (int s = 0; s < 256; ++s) {
    freq[s] = 0;
    if (count[s] == 0) continue;
    uint64_t f = uint64_t{count[s]} * kAnsProbScale / total;
    if (f < 1) f = 1;
    freq[s] = static_cast<uint16_t>(f);
    sum += static_cast<int64_t>(f);
    if (count[s] > count[biggest]) biggest = s;
  }
  if (sum < kAnsProbScale) {
    freq[biggest] = static_cast<uint16_t>(freq[biggest] + (kAnsProbScale - sum));
  }
  while (sum > kAnsProbScale) {
    // Take from the largest frequencies first (least relative cost).
    int top = -1;
    for (int s = 0; s < 256; ++s) {
      if (freq[s] > 1 && (top < 0 || freq[s] > freq[top])) top = s;
    }
    const int64_t sixteenth = freq[top] / 16 < 1 ? 1 : freq[top] / 16;
    const int64_t take = sum - kAnsProbScale < sixteenth ? sum - kAnsProbScale : sixteenth;
    freq[top] = static_cast<uint16_t>(freq[top] - take);
    sum -= take;
  }
}

OKV_HD void AnsBuildEncTable(const uint32_t* count, uint64_t total, AnsEncTable* t) {
  AnsNormalizeFrequencies(count, total, t->freq);
  t->cum[0] = 0;
  for (int s = 1; s < 256; ++s) t->cum[s] = t->cum[s - 1] + t->freq[s - 1];
}

// floor(x / f) = Quotient(x, Reciprocal(f)) for every x < 2^32 and f <= 4096:
// the reciprocal overshoots 2^44 / f by at most 1, so the quotient gains less
// than x / 2^44 < 2^-12 <= 1 / f, too little to reach the next integer.
OKV_HD uint64_t AnsReciprocal(uint32_t f) { return f == 0 ? 0 : (uint64_t{1} << 44) / f + 1; }
// (x * rcp) >> 44 in 64-bit arithmetic: rcp = hi * 2^32 + lo (hi < 2^13), and
// the low 32 bits of x * lo cannot carry past bit 44 of the sum.
OKV_HD uint32_t AnsQuotient(uint32_t x, uint64_t rcp) {
  const uint64_t hi = uint64_t{x} * (rcp >> 32);
  const uint64_t lo = uint64_t{x} * (rcp & 0xffffffffu);
  return static_cast<uint32_t>((hi + (lo >> 32)) >> 12);
}

// Whether a lane in state x renormalises (emits its low 16 bits) before
// coding a symbol of frequency f.
OKV_HD bool AnsRenorm(uint32_t x, uint32_t f) {
  return uint64_t{x} >= (uint64_t{f} << (32 - kAnsProbBits));
}

// The state after coding symbol s from x (already renormalised):
// (x / f) * 4096 + x % f + cum, without the division.
OKV_HD uint32_t AnsEncodeStep(uint32_t x, uint32_t f, uint32_t cum, uint64_t rcp) {
  return x + cum + AnsQuotient(x, rcp) * (kAnsProbScale - f);
}

// Lane `lane`'s part of one step of a chunk encode, once the warp knows
// `mask` (bit j: lane j renormalises at this step) and `emitted` (the words
// of the steps after this one). With words != nullptr (the chunk stream's
// word area, `total` words), the lane's word goes to its place.
OKV_HD void AnsEncodeLane(uint32_t* x, uint8_t s, bool renorm, uint32_t mask, uint32_t lane,
                          uint32_t emitted, const AnsEncTable& t, const uint64_t* rcp,
                          uint8_t* words, uint32_t total) {
  uint32_t v = *x;
  if (renorm) {
    if (words != nullptr) {
      const uint32_t e = emitted + AnsPopcount((mask >> lane) >> 1);
      Store16(words + 2 * (total - 1 - e), static_cast<uint16_t>(v));
    }
    v >>= 16;
  }
  *x = AnsEncodeStep(v, t.freq[s], t.cum[s], rcp[s]);
}

// Where everything of a non-stored frame goes, from the planes' coded sizes.
struct AnsFrameLayout {
  uint64_t frame_size;  // the whole frame, stored form included
  uint32_t stored;      // 1: the stored form (prefix + raw bytes)
  uint32_t planes;
  uint8_t mode[kAnsMaxPlanes];
  uint32_t data_off[kAnsMaxPlanes];
  uint32_t data_size[kAnsMaxPlanes];
  uint32_t table_off[kAnsMaxPlanes];  // 0 for a raw plane
  uint32_t tables_end;                // first byte after the tables
};

// coded[p]: the sum of plane p's chunk stream bytes (AnsStreamBytes). A plane
// whose coded data and tables would not be smaller than the plane is raw; a
// frame that would not be smaller than the stored form is stored.
OKV_HD AnsFrameLayout AnsPlanFrame(uint32_t planes, uint64_t elems, uint32_t chunks,
                                   const uint64_t* coded, uint64_t raw_size) {
  AnsFrameLayout l{};
  l.planes = planes;
  uint64_t at = kAnsHeaderBytes;
  if (elems > 0) {
    for (uint32_t p = 0; p < planes; ++p) {
      const uint64_t table = kAnsFreqTableBytes + 4 * uint64_t{chunks};
      if (coded[p] + table >= elems) {
        l.mode[p] = kAnsPlaneRaw;
        l.data_size[p] = static_cast<uint32_t>(elems);
      } else {
        l.mode[p] = kAnsPlaneRans;
        l.data_size[p] = static_cast<uint32_t>(coded[p]);
        l.table_off[p] = static_cast<uint32_t>(at);
        at += table;
      }
    }
    l.tables_end = static_cast<uint32_t>(at);
    at = AnsAlign4(at);
    for (uint32_t p = 0; p < planes; ++p) {
      l.data_off[p] = static_cast<uint32_t>(at);
      at += AnsAlign4(l.data_size[p]);
    }
  }
  l.stored = at >= kFramePrefixBytes + raw_size ? 1 : 0;
  l.frame_size = l.stored ? kFramePrefixBytes + raw_size : at;
  return l;
}

// Writes the prefix (CRC zero) and, unless stored, the ans header, plane
// descriptors, frequency tables and the padding after the tables: all but the
// chunk_end tables and the plane data. freq[p]: plane p's table (rANS planes).
OKV_HD void AnsWriteHeader(uint8_t* o, const AnsFrameLayout& l, uint8_t version, uint8_t dtype,
                           uint64_t raw_size, uint32_t chunk, uint32_t chunks,
                           const uint16_t* const* freq) {
  constexpr uint8_t kAnsCodecId = 1;  // CodecId::kAns
  WriteFramePrefix(o, kAnsCodecId, version, dtype, l.stored ? kFrameFlagStored : 0, raw_size,
                   l.frame_size, chunk);
  if (l.stored) return;
  o[kAnsPlanesOffset] = static_cast<uint8_t>(l.planes);
  o[kAnsLanesOffset] = kAnsLanes;
  Store16(o + kAnsProbBitsOffset, kAnsProbBits);
  Store32(o + kAnsChunksOffset, chunks);
  for (uint32_t i = kAnsPlaneDescOffset; i < kAnsHeaderBytes; ++i) o[i] = 0;
  for (uint32_t p = 0; p < l.planes; ++p) {
    uint8_t* d = o + kAnsPlaneDescOffset + kAnsPlaneDescBytes * p;
    d[0] = l.mode[p];
    Store32(d + 4, l.data_off[p]);
    Store32(d + 8, l.data_size[p]);
    Store32(d + 12, l.table_off[p]);
    if (l.mode[p] == kAnsPlaneRans) {
      for (uint32_t s = 0; s < 256; ++s) Store16(o + l.table_off[p] + 2 * s, freq[p][s]);
    }
  }
  const uint32_t data_start = l.planes > 0 ? l.data_off[0] : l.tables_end;
  for (uint32_t i = l.tables_end; i < data_start; ++i) o[i] = 0;
}

}  // namespace orbitkv::codec::internal
