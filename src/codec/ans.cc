// ans codec: encoder, frame validation and the scalar decoder (frame_layout.h
// documents the format).
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec/ans_chunk.h"
#include "codec/ans_encode.h"
#include "codec/codec_internal.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::internal {
namespace {

struct EncodedPlane {
  uint8_t mode = kAnsPlaneRaw;
  std::vector<uint8_t> table;  // rANS: freq[256] u16 then chunk_end[chunks] u32
  std::vector<uint8_t> data;   // rANS: the chunk streams (a raw plane is its symbols)
};

// Codes one plane, or returns it raw where coding would not make it smaller:
// at once when the histogram's bound proves that, else as soon as the streams
// written plus 128 bytes per chunk still to come reach it (the rule
// AnsPlanFrame applies to the full coded size, so the choice is the same).
EncodedPlane EncodePlane(const uint8_t* sym, const uint32_t* count, uint64_t n, uint32_t chunk,
                         uint32_t chunks, bool avx2) {
  EncodedPlane plane;
  const uint64_t tables = kAnsFreqTableBytes + 4 * uint64_t{chunks};
  AnsPlaneCoder coder;
  AnsBuildPlaneCoder(count, n, &coder);
  if (AnsCodedBytesLowerBound(count, coder.table, n, chunk) + tables >= n) return plane;
  plane.table.resize(tables);
  for (int s = 0; s < 256; ++s) Store16(plane.table.data() + 2 * s, coder.table.freq[s]);
  plane.data.reserve(n);
  const auto encode = avx2 ? AnsEncodeChunkAvx2 : AnsEncodeChunkScalar;
  std::vector<uint16_t> words(size_t{chunk} + 8);
  uint32_t state[kAnsLanes];
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint32_t len = AnsChunkLength(n, chunk, c);
    uint16_t* end = words.data() + words.size();
    const uint32_t nw = encode(sym + uint64_t{c} * chunk, len, coder, state, end);
    const size_t at = plane.data.size();
    plane.data.resize(at + AnsStreamBytes(nw), 0);
    uint8_t* p = plane.data.data() + at;
    for (uint32_t j = 0; j < kAnsLanes; ++j) Store32(p + 4 * j, state[j]);
    p += kAnsStatesBytes;
    const uint16_t* first = end - nw;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(p, first, 2 * size_t{nw});
    } else {
      for (uint32_t k = 0; k < nw; ++k) Store16(p + 2 * k, first[k]);
    }
    Store32(plane.table.data() + kAnsFreqTableBytes + 4 * c,
            static_cast<uint32_t>(plane.data.size()));
    // Every chunk stream holds at least its lane states.
    if (plane.data.size() + tables + uint64_t{kAnsStatesBytes} * (chunks - 1 - c) >= n) {
      return EncodedPlane{};
    }
  }
  plane.mode = kAnsPlaneRans;
  return plane;
}

// Lower bound on one lane's words W from Phi = log2(x) + 16 * (words so far):
// Phi starts at 16 (x = 2^16) and ends below 32 + 16 W. Coding s (freq f, cum
// c; M = 4096) from x: x' = floor(x/f) M + x mod f + c >= x M / f - g with
// g = max(0, (f - 1)(M - f) / f - c), so Phi gains at least log2(M / f) minus
// loss = -log2(1 - g f / (x M)). Without renormalisation before it x >= 2^16:
// eps = -log2(1 - g f / (2^16 M)). With it (x >= f 2^20, x -> floor(x / 2^16)
// >= 16 f), the shift loses at most -log2(1 - 1 / (16 f)) and the step at
// most -log2(1 - g / (16 M)): delta. Summed over L lanes with symbols:
// 16 W > I - 16 L - E - D(W), I = sum of log2(M / f), E = sum of eps, and
// D(W) the largest sum of (delta - eps) over W renormalisations, at most
// count[s] of them before symbol s. 16 W + D(W) grows with W, so W is at
// least where it reaches the right side; the stream bytes are at least
// 128 per chunk plus 2 W. Double arithmetic with margins far above its error.
uint64_t AnsWordsLowerBound(const uint32_t* count, const AnsEncTable& t, uint64_t lanes) {
  constexpr double kM = kAnsProbScale;
  struct Piece {
    double extra;  // delta - eps, bits
    uint32_t count;
  };
  std::array<Piece, 256> pieces;
  size_t np = 0;
  double info = 0, eps_sum = 0;
  for (int s = 0; s < 256; ++s) {
    if (count[s] == 0) continue;
    const double f = t.freq[s];
    const double g = std::max(0.0, (f - 1) * (kM - f) / f - t.cum[s]);
    const double eps = -std::log2(1 - g * f / (65536 * kM));
    const double delta = -std::log2(1 - 1 / (16 * f)) - std::log2(1 - g / (16 * kM));
    info += count[s] * (kAnsProbBits - std::log2(f));
    eps_sum += count[s] * eps;
    pieces[np++] = {delta - eps, count[s]};
  }
  std::sort(pieces.begin(), pieces.begin() + np,
            [](const Piece& a, const Piece& b) { return a.extra > b.extra; });
  double budget =
      info * (1 - 1e-9) - 16.0 * static_cast<double>(lanes) - eps_sum * (1 + 1e-9) - 1e-3;
  uint64_t words = 0;
  for (size_t k = 0; k < np && budget > 0; ++k) {
    const double slope = 16 + pieces[k].extra * (1 + 1e-9) + 1e-12;
    const double span = pieces[k].count * slope;
    if (budget >= span) {
      words += pieces[k].count;
      budget -= span;
    } else {
      words += static_cast<uint64_t>(budget / slope);
      budget = 0;
    }
  }
  return words;
}

}  // namespace

AnsDivMagic AnsMakeDivMagic(uint32_t d) {
  const uint32_t l = d <= 1 ? 0 : 32 - static_cast<uint32_t>(__builtin_clz(d - 1));
  const uint64_t magic = ((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1;
  return {static_cast<uint32_t>(magic), std::min(l, 1u), l == 0 ? 0 : l - 1};
}

void AnsBuildPlaneCoder(const uint32_t* count, uint64_t total, AnsPlaneCoder* coder) {
  AnsBuildEncTable(count, total, &coder->table);
  for (int s = 0; s < 256; ++s) {
    const uint32_t f = coder->table.freq[s];
    coder->rcp[s] = AnsReciprocal(f);
    if (f == 0) {
      coder->record[s] = 0;  // never looked up
      continue;
    }
    const AnsDivMagic m = AnsMakeDivMagic(f);
    const uint32_t hi = coder->table.cum[s] | (f << 12) | (m.sh2 << 25) | (m.sh1 << 29);
    coder->record[s] = m.magic | (uint64_t{hi} << 32);
  }
}

uint32_t AnsEncodeChunkScalar(const uint8_t* sym, uint32_t n, const AnsPlaneCoder& coder,
                              uint32_t* state, uint16_t* words_end) {
  std::fill(state, state + kAnsLanes, kAnsStateLow);
  uint16_t* w = words_end;
  for (uint32_t t = (n + kAnsLanes - 1) / kAnsLanes; t-- > 0;) {
    AnsEncodeLanesScalar(sym + size_t{t} * kAnsLanes, std::min(kAnsLanes, n - t * kAnsLanes), coder,
                         state, &w);
  }
  return static_cast<uint32_t>(words_end - w);
}

void AnsCountSymbols(const uint8_t* sym, size_t n, uint32_t* count) {
  // Eight tables, one per byte of a 64-bit load, so that runs of one symbol
  // do not serialise on one counter.
  uint32_t c[8][256] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t v[2];
    std::memcpy(v, sym + i, 16);
    for (uint64_t x : v) {
      ++c[0][x & 0xff];
      ++c[1][(x >> 8) & 0xff];
      ++c[2][(x >> 16) & 0xff];
      ++c[3][(x >> 24) & 0xff];
      ++c[4][(x >> 32) & 0xff];
      ++c[5][(x >> 40) & 0xff];
      ++c[6][(x >> 48) & 0xff];
      ++c[7][x >> 56];
    }
  }
  for (; i < n; ++i) ++c[0][sym[i]];
  for (int s = 0; s < 256; ++s) {
    for (const auto& t : c) count[s] += t[s];
  }
}

void AnsSplitPlanesScalar(const uint8_t* raw, size_t n, uint8_t* lo, uint8_t* hi,
                          uint32_t* count_lo, uint32_t* count_hi) {
  for (size_t i = 0; i < n; ++i) {
    lo[i] = raw[2 * i];
    hi[i] = raw[2 * i + 1];
  }
  AnsCountSymbols(lo, n, count_lo);
  AnsCountSymbols(hi, n, count_hi);
}

void AnsJoinPlanesScalar(const uint8_t* lo, const uint8_t* hi, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = lo[i];
    out[2 * i + 1] = hi[i];
  }
}

uint64_t AnsCodedBytesLowerBound(const uint32_t* count, const AnsEncTable& table, uint64_t elems,
                                 uint32_t chunk) {
  if (elems == 0) return 0;
  const uint32_t chunks = AnsChunkCount(elems, chunk);
  const uint64_t lanes = elems / chunk * kAnsLanes + std::min<uint64_t>(elems % chunk, kAnsLanes);
  return uint64_t{kAnsStatesBytes} * chunks + 2 * AnsWordsLowerBound(count, table, lanes);
}

size_t AnsMaxEncodedSize(const SegmentInfo&, size_t raw_bytes) {
  return kFramePrefixBytes + raw_bytes;  // the stored fallback bounds every frame
}

Result<size_t> AnsEncode(const SegmentInfo& info, std::span<const uint8_t> raw,
                         std::span<uint8_t> out, const EncodeOptions& options) {
  const uint32_t planes = static_cast<uint32_t>(DTypeBytes(info.dtype));
  const uint64_t elems = raw.size() / planes;
  const uint32_t chunk = AnsChunkElements(elems, options.ans_chunk_elements);
  if (chunk % kAnsLanes != 0 || chunk > kAnsMaxChunkElements) {
    return Status::InvalidArgument("ans: chunk elements must be a multiple of 32 up to 2^20, not " +
                                   std::to_string(chunk));
  }
  const uint32_t chunks = AnsChunkCount(elems, chunk);
  const bool avx2 = CodecAvx2Enabled();
  std::vector<EncodedPlane> coded(planes);
  const uint8_t* sym[kAnsMaxPlanes] = {};
  uint32_t count[kAnsMaxPlanes][256] = {};
  std::unique_ptr<uint8_t[]> split;
  size_t size = kAnsHeaderBytes;
  if (elems > 0) {
    if (planes == 1) {
      sym[0] = raw.data();
      AnsCountSymbols(raw.data(), elems, count[0]);
    } else {
      split.reset(new uint8_t[2 * elems]);
      sym[0] = split.get();
      sym[1] = split.get() + elems;
      (avx2 ? AnsSplitPlanesAvx2 : AnsSplitPlanesScalar)(raw.data(), elems, split.get(),
                                                         split.get() + elems, count[0], count[1]);
    }
    for (uint32_t p = 0; p < planes; ++p) {
      coded[p] = EncodePlane(sym[p], count[p], elems, chunk, chunks, avx2);
      size += coded[p].table.size();
    }
    size = AnsAlign4(size);
    for (const EncodedPlane& c : coded) {
      size += AnsAlign4(c.mode == kAnsPlaneRaw ? elems : c.data.size());
    }
  }
  uint8_t* o = out.data();
  if (size >= kFramePrefixBytes + raw.size()) {
    WritePrefix(o, CodecId::kAns, info.dtype, kFrameFlagStored, raw.size(),
                kFramePrefixBytes + raw.size(), chunk);
    std::copy(raw.begin(), raw.end(), o + kFramePrefixBytes);
    return kFramePrefixBytes + raw.size();
  }
  WritePrefix(o, CodecId::kAns, info.dtype, 0, raw.size(), size, chunk);
  o[kAnsPlanesOffset] = static_cast<uint8_t>(planes);
  o[kAnsLanesOffset] = kAnsLanes;
  Store16(o + kAnsProbBitsOffset, kAnsProbBits);
  Store32(o + kAnsChunksOffset, chunks);
  std::fill(o + kAnsPlaneDescOffset, o + kAnsHeaderBytes, 0);
  size_t at = kAnsHeaderBytes;
  std::array<size_t, kAnsMaxPlanes> table_at{};
  for (uint32_t p = 0; p < planes; ++p) {
    table_at[p] = coded[p].table.empty() ? 0 : at;
    std::copy(coded[p].table.begin(), coded[p].table.end(), o + at);
    at += coded[p].table.size();
  }
  std::fill(o + at, o + AnsAlign4(at), 0);
  at = AnsAlign4(at);
  for (uint32_t p = 0; p < planes; ++p) {
    const bool is_raw = coded[p].mode == kAnsPlaneRaw;
    const uint8_t* data = is_raw ? sym[p] : coded[p].data.data();
    const size_t data_size = is_raw ? elems : coded[p].data.size();
    uint8_t* d = o + kAnsPlaneDescOffset + kAnsPlaneDescBytes * p;
    d[0] = coded[p].mode;
    Store32(d + 4, static_cast<uint32_t>(at));
    Store32(d + 8, static_cast<uint32_t>(data_size));
    Store32(d + 12, static_cast<uint32_t>(table_at[p]));
    std::copy(data, data + data_size, o + at);
    std::fill(o + at + data_size, o + AnsAlign4(at + data_size), 0);
    at = AnsAlign4(at + data_size);
  }
  return at;
}

bool AnsDecodeChunkScalar(const uint32_t* table, const uint8_t* stream, size_t stream_bytes,
                          uint32_t n, uint8_t* sym) {
  uint32_t state[kAnsLanes];
  for (uint32_t j = 0; j < kAnsLanes; ++j) state[j] = Load32(stream + 4 * j);
  const uint8_t* words = stream + kAnsStatesBytes;
  const size_t nwords = (stream_bytes - kAnsStatesBytes) / 2;
  size_t pos = 0;
  for (uint32_t t = 0; t * kAnsLanes < n; ++t) {
    const uint32_t lanes = std::min(kAnsLanes, n - t * kAnsLanes);
    if (!AnsDecodeLanes(table, state, lanes, words, nwords, &pos, sym + t * kAnsLanes)) {
      return false;
    }
  }
  return AnsChunkFinished(state, pos, stream_bytes);
}

namespace {

struct PlaneView {
  uint8_t mode = kAnsPlaneRaw;
  const uint8_t* data = nullptr;
  uint32_t data_size = 0;
  const uint8_t* chunk_end = nullptr;
  std::vector<uint32_t> table;
};

Status Bad(const std::string& what) { return Status::Corruption("ans frame: " + what); }

Status ParsePlane(std::span<const uint8_t> frame, uint32_t p, uint32_t chunks, uint64_t elems,
                  PlaneView* v) {
  const uint8_t* d = frame.data() + kAnsPlaneDescOffset + kAnsPlaneDescBytes * p;
  const std::string name = "plane " + std::to_string(p);
  v->mode = d[0];
  if (d[1] != 0 || d[2] != 0 || d[3] != 0) return Bad(name + ": reserved bytes set");
  const uint64_t off = Load32(d + 4), size = Load32(d + 8), table_off = Load32(d + 12);
  if (off % 4 != 0 || off < kAnsHeaderBytes || off + size > frame.size()) {
    return Bad(name + ": data out of the frame");
  }
  v->data = frame.data() + off;
  v->data_size = static_cast<uint32_t>(size);
  if (v->mode == kAnsPlaneRaw) {
    if (size != elems) return Bad(name + ": raw plane size is not the element count");
    return Status::OK();
  }
  if (v->mode != kAnsPlaneRans) return Bad(name + ": unknown mode");
  if (table_off < kAnsHeaderBytes ||
      table_off + kAnsFreqTableBytes + 4 * uint64_t{chunks} > frame.size()) {
    return Bad(name + ": tables out of the frame");
  }
  const uint8_t* freq = frame.data() + table_off;
  v->chunk_end = freq + kAnsFreqTableBytes;
  v->table.resize(kAnsProbScale);
  uint32_t cum = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t f = Load16(freq + 2 * s);
    if (f > kAnsProbScale - cum) return Bad(name + ": frequencies sum past 4096");
    for (uint32_t k = 0; k < f; ++k) v->table[cum + k] = AnsTableEntry(s, f, k);
    cum += f;
  }
  if (cum != kAnsProbScale) return Bad(name + ": frequencies do not sum to 4096");
  return Status::OK();
}

using PlaneJoiner = void (*)(const uint8_t*, const uint8_t*, size_t, uint8_t*);

Status DecodeWith(AnsChunkDecoder decode, PlaneJoiner join, const FrameInfo& fi,
                  std::span<const uint8_t> frame, std::span<uint8_t> out) {
  const uint8_t* f = frame.data();
  if (fi.flags & kFrameFlagStored) {
    if (fi.frame_size != kFramePrefixBytes + fi.decoded_size) return Bad("stored size mismatch");
    std::copy(f + kFramePrefixBytes, f + fi.frame_size, out.data());
    return Status::OK();
  }
  if (frame.size() < kAnsHeaderBytes) return Bad("shorter than its header");
  const uint32_t planes = f[kAnsPlanesOffset];
  if (planes != DTypeBytes(fi.dtype)) return Bad("plane count does not match the dtype");
  if (f[kAnsLanesOffset] != kAnsLanes || Load16(f + kAnsProbBitsOffset) != kAnsProbBits) {
    return Bad("unsupported lanes or probability bits");
  }
  const uint32_t chunk = fi.param;
  if (chunk == 0 || chunk % kAnsLanes != 0 || chunk > kAnsMaxChunkElements) {
    return Bad("bad chunk size " + std::to_string(chunk));
  }
  const uint64_t elems = fi.decoded_size / planes;
  const uint32_t chunks = Load32(f + kAnsChunksOffset);
  if (chunks != AnsChunkCount(elems, chunk)) return Bad("chunk count does not match the sizes");
  for (uint32_t p = planes; p < kAnsMaxPlanes; ++p) {
    const uint8_t* d = f + kAnsPlaneDescOffset + kAnsPlaneDescBytes * p;
    if (std::any_of(d, d + kAnsPlaneDescBytes, [](uint8_t b) { return b != 0; })) {
      return Bad("unused plane descriptor set");
    }
  }
  PlaneView view[kAnsMaxPlanes];
  for (uint32_t p = 0; p < planes; ++p) {
    ORBITKV_RETURN_IF_ERROR(ParsePlane(frame, p, chunks, elems, &view[p]));
  }
  std::vector<uint8_t> sym(size_t{chunk} * planes);
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint64_t first = uint64_t{c} * chunk;
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk, elems - first));
    const uint8_t* src[kAnsMaxPlanes] = {};
    for (uint32_t p = 0; p < planes; ++p) {
      const PlaneView& v = view[p];
      if (v.mode == kAnsPlaneRaw) {
        src[p] = v.data + first;
        continue;
      }
      const uint32_t begin = c == 0 ? 0 : Load32(v.chunk_end + 4 * (c - 1));
      const uint32_t end = Load32(v.chunk_end + 4 * c);
      // Aligned ends, as the CUDA decoder needs them.
      if (end > v.data_size || begin > end || end - begin < kAnsStatesBytes || begin % 4 != 0 ||
          end % 4 != 0) {
        return Bad("plane " + std::to_string(p) + " chunk " + std::to_string(c) +
                   ": stream bounds out of the plane");
      }
      uint8_t* dst = planes == 1 ? out.data() + first : sym.data() + size_t{p} * chunk;
      if (!decode(v.table.data(), v.data + begin, end - begin, n, dst)) {
        return Bad("plane " + std::to_string(p) + " chunk " + std::to_string(c) +
                   ": stream does not decode");
      }
      src[p] = dst;
    }
    if (planes == 1) {
      if (src[0] != out.data() + first) std::copy(src[0], src[0] + n, out.data() + first);
      continue;
    }
    join(src[0], src[1], n, out.data() + first * 2);
  }
  return Status::OK();
}

}  // namespace

bool AnsAvx2Available() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<bool> scalar_only{false};
}  // namespace

bool CodecAvx2Enabled() {
  return AnsAvx2Available() && !scalar_only.load(std::memory_order_relaxed);
}

void ForceScalarCodecs(bool scalar) { scalar_only.store(scalar, std::memory_order_relaxed); }

Status AnsDecodeScalar(const FrameInfo& fi, std::span<const uint8_t> frame,
                       std::span<uint8_t> out) {
  return DecodeWith(AnsDecodeChunkScalar, AnsJoinPlanesScalar, fi, frame, out);
}

Status AnsDecode(const FrameInfo& fi, std::span<const uint8_t> frame, std::span<uint8_t> out) {
  if (CodecAvx2Enabled()) return DecodeWith(AnsDecodeChunkAvx2, AnsJoinPlanesAvx2, fi, frame, out);
  return DecodeWith(AnsDecodeChunkScalar, AnsJoinPlanesScalar, fi, frame, out);
}

}  // namespace orbitkv::codec::internal
