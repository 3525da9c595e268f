// libFuzzer target for ParseObjectHeader, the parser of object headers read
// back from SSD (untrusted). Input: 8 bytes little-endian object_size, then the
// header bytes. When bit 63 of object_size is set it is cleared and the header's
// crc is recomputed first, so mutations reach the checks behind the crc.
// A successful parse must satisfy the format's invariants (segments, codec id
// and version), and a header in the canonical layout must re-serialize to the
// same bytes, codec and version included; violations trap.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "store/object_format.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Rewrites the crc field so it matches, when num_slots gives a header that fits.
void FixCrc(std::vector<uint8_t>& h) {
  using namespace orbitkv;
  if (h.size() < kObjectHeaderFixedBytes) return;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{h[12 + i]} << (8 * i);
  if (n > kMaxSlotsPerGroup || h.size() < ObjectHeaderSize(n)) return;
  if (n == 0) return;
  SealObjectHeader(h);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orbitkv;
  if (size < 8) return 0;
  uint64_t object_size = LoadLE64(data);
  std::vector<uint8_t> header(data + 8, data + size);  // exact size: ASan sees over-reads
  if (object_size >> 63) {
    object_size &= ~(uint64_t{1} << 63);
    FixCrc(header);
  }

  Result<ParsedHeader> r = ParseObjectHeader(header, object_size);
  if (!r.ok()) {
    Check(r.status().code() == StatusCode::kCorruption);
    return 0;
  }
  const ParsedHeader& h = *r;
  const auto n = static_cast<uint32_t>(h.segments.size());
  Check(n >= 1 && n <= kMaxSlotsPerGroup);
  Check(h.header_size == ObjectHeaderSize(n));
  Check(h.header_size <= header.size() && h.header_size <= object_size);
  uint64_t prev_end = h.header_size;
  std::vector<uint64_t> sizes;
  for (const SegmentPos& s : h.segments) {
    Check(s.size > 0);
    Check(s.offset % kObjectAlign == 0);
    Check(s.offset >= prev_end);
    Check(s.offset <= object_size && s.size <= object_size - s.offset);
    prev_end = s.offset + s.size;
    sizes.push_back(s.size);
  }
  Check(h.crcs.size() == n);
  // The codec's format version is set exactly for encoded objects.
  Check((h.codec == kCodecRaw) == (h.codec_version == 0));
  const bool canonical = h.segments == SegmentLayout(sizes);
  // Raw objects must sit where SegmentLayout puts them; encoded ones are the codec's.
  Check(CheckObjectMatches(h, h.id, sizes).ok() == (canonical || h.codec != kCodecRaw));

  // A canonically laid out header is exactly what WriteObjectHeader writes.
  if (canonical) {
    std::vector<uint8_t> again(h.header_size);
    WriteObjectHeader(h.id, sizes, ObjectCodec{h.codec, h.codec_version}, h.crcs, again);
    Check(std::memcmp(again.data(), header.data(), h.header_size) == 0);
  }
  return 0;
}
