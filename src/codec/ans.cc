// ans codec: encoder, frame validation and the scalar decoder (frame_layout.h
// documents the format).
#include <algorithm>
#include <array>
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
  std::vector<uint8_t> data;
};

void EncodeChunk(const uint8_t* sym, uint32_t n, const AnsEncTable& table,
                 const std::array<uint64_t, 256>& rcp, std::vector<uint16_t>& words,
                 std::vector<uint8_t>& data) {
  uint32_t state[kAnsLanes];
  std::fill(state, state + kAnsLanes, kAnsStateLow);
  // At most one word per symbol; written branch-free (renormalisation is a
  // coin flip on incompressible planes).
  words.resize(n);
  size_t nw = 0;
  const uint32_t steps = (n + kAnsLanes - 1) / kAnsLanes;
  for (uint32_t t = steps; t-- > 0;) {
    const uint32_t lanes = std::min(kAnsLanes, n - t * kAnsLanes);
    for (uint32_t j = lanes; j-- > 0;) {
      const uint8_t s = sym[t * kAnsLanes + j];
      const uint32_t f = table.freq[s];
      uint32_t x = state[j];
      const bool renorm = AnsRenorm(x, f);
      words[nw] = static_cast<uint16_t>(x);
      nw += renorm;
      x = renorm ? x >> 16 : x;
      state[j] = AnsEncodeStep(x, f, table.cum[s], rcp[s]);
    }
  }
  words.resize(nw);
  const size_t start = data.size();
  const size_t bytes = kAnsStatesBytes + 2 * words.size();
  data.resize(start + (bytes + 3) / 4 * 4, 0);
  uint8_t* p = data.data() + start;
  for (uint32_t j = 0; j < kAnsLanes; ++j) Store32(p + 4 * j, state[j]);
  p += kAnsStatesBytes;
  // Emitted last-decoded first: the decoder reads them in reverse.
  for (size_t k = 0; k < words.size(); ++k) Store16(p + 2 * k, words[words.size() - 1 - k]);
}

EncodedPlane EncodePlane(const std::vector<uint8_t>& sym, uint32_t chunk, uint32_t chunks) {
  EncodedPlane plane;
  const uint64_t n = sym.size();
  uint32_t count[256] = {};
  for (uint8_t s : sym) ++count[s];
  AnsEncTable table;
  AnsBuildEncTable(count, n, &table);
  std::array<uint64_t, 256> rcp{};
  for (int s = 0; s < 256; ++s) rcp[s] = AnsReciprocal(table.freq[s]);

  plane.table.resize(kAnsFreqTableBytes + 4 * size_t{chunks});
  for (int s = 0; s < 256; ++s) Store16(plane.table.data() + 2 * s, table.freq[s]);
  plane.data.reserve(n / 2 + kAnsStatesBytes * chunks);
  std::vector<uint16_t> words;
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint64_t first = uint64_t{c} * chunk;
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(chunk, n - first));
    EncodeChunk(sym.data() + first, len, table, rcp, words, plane.data);
    Store32(plane.table.data() + kAnsFreqTableBytes + 4 * c,
            static_cast<uint32_t>(plane.data.size()));
    // Incompressible: stop as soon as the coded plane cannot win.
    if (plane.data.size() + plane.table.size() >= n) break;
  }
  if (plane.data.size() + plane.table.size() >= n) {
    plane.mode = kAnsPlaneRaw;
    plane.table.clear();
    plane.data = sym;
  } else {
    plane.mode = kAnsPlaneRans;
  }
  return plane;
}

}  // namespace

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
  std::vector<EncodedPlane> coded(planes);
  size_t size = kAnsHeaderBytes;
  if (elems > 0) {
    std::vector<uint8_t> sym(elems);
    for (uint32_t p = 0; p < planes; ++p) {
      for (uint64_t i = 0; i < elems; ++i) sym[i] = raw[i * planes + p];
      coded[p] = EncodePlane(sym, chunk, chunks);
      size += coded[p].table.size();
    }
    size = AnsAlign4(size);
    for (const EncodedPlane& c : coded) size += AnsAlign4(c.data.size());
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
    uint8_t* d = o + kAnsPlaneDescOffset + kAnsPlaneDescBytes * p;
    d[0] = coded[p].mode;
    Store32(d + 4, static_cast<uint32_t>(at));
    Store32(d + 8, static_cast<uint32_t>(coded[p].data.size()));
    Store32(d + 12, static_cast<uint32_t>(table_at[p]));
    std::copy(coded[p].data.begin(), coded[p].data.end(), o + at);
    std::fill(o + at + coded[p].data.size(), o + AnsAlign4(at + coded[p].data.size()), 0);
    at = AnsAlign4(at + coded[p].data.size());
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

Status DecodeWith(AnsChunkDecoder decode, const FrameInfo& fi, std::span<const uint8_t> frame,
                  std::span<uint8_t> out) {
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
    uint8_t* o = out.data() + first * 2;
    for (uint32_t i = 0; i < n; ++i) {
      o[2 * i] = src[0][i];
      o[2 * i + 1] = src[1][i];
    }
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

Status AnsDecodeScalar(const FrameInfo& fi, std::span<const uint8_t> frame,
                       std::span<uint8_t> out) {
  return DecodeWith(AnsDecodeChunkScalar, fi, frame, out);
}

Status AnsDecode(const FrameInfo& fi, std::span<const uint8_t> frame, std::span<uint8_t> out) {
  return DecodeWith(AnsAvx2Available() ? AnsDecodeChunkAvx2 : AnsDecodeChunkScalar, fi, frame, out);
}

}  // namespace orbitkv::codec::internal
