#include "store/object_format.h"

#include <cassert>
#include <cstring>
#include <string>

#include "store/crc32c.h"

namespace orbitkv {
namespace {

// Field offsets inside the fixed part of the header (see object_format.h).
constexpr size_t kVersionAt = 8;
constexpr size_t kFlagsAt = 10;
constexpr size_t kNumSlotsAt = 12;
constexpr size_t kNsAt = 16;
constexpr size_t kGroupAt = 24;
constexpr size_t kKeyAt = 32;
static_assert(kKeyAt + sizeof(Key::bytes) == kObjectHeaderFixedBytes);
static_assert(kObjectHeaderCrcOffset + 4 == kKeyAt);

template <typename T>
void PutLE(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

template <typename T>
T GetLE(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(p[i]) << (8 * i);
  return v;
}

// Offsets inside one slot entry.
constexpr size_t kEntryCrcAt = 16;
constexpr size_t kEntryReservedAt = 20;
static_assert(kEntryReservedAt + 4 == kObjectSlotEntryBytes);

// CRC32C of header[0, size) with the crc field read as zero.
uint32_t HeaderCrc(const uint8_t* header, uint64_t size) {
  static constexpr uint8_t kZero[4] = {};
  uint32_t crc = Crc32c({header, kObjectHeaderCrcOffset});
  crc = Crc32c(kZero, crc);
  return Crc32c({header + kObjectHeaderCrcOffset + 4, size - kObjectHeaderCrcOffset - 4}, crc);
}

Status Bad(const std::string& why) { return Status::Corruption("object header: " + why); }

std::string SlotName(uint32_t i) { return "slot " + std::to_string(i) + ": "; }

std::string Range(const SegmentPos& seg) {
  return "[" + std::to_string(seg.offset) + ", +" + std::to_string(seg.size) + ")";
}

std::string Hex32(uint32_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s += kHex[(v >> shift) & 15];
  return s;
}

std::string Describe(const ObjectId& id) {
  return "ns " + std::to_string(id.ns) + " group " + std::to_string(id.group) + " key " +
         id.key.ShortHex();
}

}  // namespace

std::vector<SegmentPos> SegmentLayout(const std::vector<uint64_t>& slot_bytes) {
  std::vector<SegmentPos> out;
  out.reserve(slot_bytes.size());
  uint64_t at = ObjectHeaderSize(static_cast<uint32_t>(slot_bytes.size()));
  for (uint64_t size : slot_bytes) {
    out.push_back({.offset = at, .size = size});
    at = AlignUp(at + size, kObjectAlign);
  }
  return out;
}

uint64_t ObjectSize(const std::vector<uint64_t>& slot_bytes) {
  if (slot_bytes.empty()) return ObjectHeaderSize(0);
  const SegmentPos last = SegmentLayout(slot_bytes).back();
  return last.offset + last.size;
}

ObjectShape MakeObjectShape(const std::vector<uint64_t>& slot_bytes) {
  ObjectShape s;
  s.slot_bytes = slot_bytes;
  s.segments = SegmentLayout(slot_bytes);
  s.header_bytes = ObjectHeaderSize(static_cast<uint32_t>(slot_bytes.size()));
  s.object_size = ObjectSize(slot_bytes);
  return s;
}

void WriteObjectHeader(const ObjectId& id, const std::vector<uint64_t>& slot_bytes,
                       ObjectCodec codec, std::span<const uint32_t> segment_crcs,
                       std::span<uint8_t> out) {
  const auto n = static_cast<uint32_t>(slot_bytes.size());
  assert(n >= 1 && n <= kMaxSlotsPerGroup);
  assert(segment_crcs.empty() || segment_crcs.size() == n);
  const uint64_t header_size = ObjectHeaderSize(n);
  assert(out.size() >= header_size);
  uint8_t* p = out.data();
  std::memset(p, 0, header_size);
  std::memcpy(p, kObjectMagic, sizeof kObjectMagic);
  PutLE<uint16_t>(p + kVersionAt, kObjectFormatVersion);
  assert((codec.id == kCodecRaw) == (codec.version == 0));
  PutLE<uint16_t>(p + kFlagsAt, static_cast<uint16_t>(codec.id | (codec.version << 8)));
  PutLE<uint32_t>(p + kNumSlotsAt, n);
  PutLE<uint64_t>(p + kNsAt, id.ns);
  PutLE<uint32_t>(p + kGroupAt, id.group);
  std::memcpy(p + kKeyAt, id.key.bytes.data(), id.key.bytes.size());
  uint8_t* entry = p + kObjectHeaderFixedBytes;
  const std::vector<SegmentPos> segments = SegmentLayout(slot_bytes);
  for (uint32_t i = 0; i < n; ++i) {
    assert(segments[i].size > 0);
    PutLE<uint64_t>(entry, segments[i].offset);
    PutLE<uint64_t>(entry + 8, segments[i].size);
    PutLE<uint32_t>(entry + kEntryCrcAt, segment_crcs.empty() ? 0 : segment_crcs[i]);
    entry += kObjectSlotEntryBytes;
  }
  PutLE<uint32_t>(p + kObjectHeaderCrcOffset, HeaderCrc(p, header_size));
}

void SetSegmentCrc(std::span<uint8_t> header, uint32_t slot, uint32_t crc) {
  assert(slot < GetLE<uint32_t>(header.data() + kNumSlotsAt));
  const uint64_t at = kObjectHeaderFixedBytes + kObjectSlotEntryBytes * uint64_t{slot};
  assert(header.size() >= at + kObjectSlotEntryBytes);
  PutLE<uint32_t>(header.data() + at + kEntryCrcAt, crc);
}

void SealObjectHeader(std::span<uint8_t> header) {
  const auto n = GetLE<uint32_t>(header.data() + kNumSlotsAt);
  assert(n >= 1 && n <= kMaxSlotsPerGroup);
  const uint64_t size = ObjectHeaderSize(n);
  assert(header.size() >= size);
  PutLE<uint32_t>(header.data() + kObjectHeaderCrcOffset, HeaderCrc(header.data(), size));
}

std::vector<uint32_t> SegmentCrcs(std::span<const uint8_t> object,
                                  const std::vector<uint64_t>& slot_bytes) {
  std::vector<uint32_t> out;
  out.reserve(slot_bytes.size());
  for (const SegmentPos& seg : SegmentLayout(slot_bytes)) {
    assert(seg.offset + seg.size <= object.size());
    out.push_back(Crc32c(object.subspan(seg.offset, seg.size)));
  }
  return out;
}

Result<ParsedHeader> ParseObjectHeader(std::span<const uint8_t> bytes, uint64_t object_size) {
  if (bytes.size() < kObjectHeaderFixedBytes) {
    return Bad("truncated: " + std::to_string(bytes.size()) + " bytes < " +
               std::to_string(kObjectHeaderFixedBytes));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kObjectMagic, sizeof kObjectMagic) != 0) return Bad("bad magic");
  const auto version = GetLE<uint16_t>(p + kVersionAt);
  if (version != kObjectFormatVersion) {
    return Bad("format version " + std::to_string(version) + " unsupported (want " +
               std::to_string(kObjectFormatVersion) + ")");
  }
  const auto flags = GetLE<uint16_t>(p + kFlagsAt);
  const auto codec = static_cast<uint8_t>(flags & 0xff);
  const auto codec_version = static_cast<uint8_t>(flags >> 8);
  if ((codec == kCodecRaw) != (codec_version == 0)) {
    return Bad("codec " + std::to_string(codec) + " with format version " +
               std::to_string(codec_version) + " (flags " + Hex32(flags) +
               "): raw objects have version 0, encoded ones a nonzero version");
  }
  const auto n = GetLE<uint32_t>(p + kNumSlotsAt);
  if (n == 0 || n > kMaxSlotsPerGroup) {
    return Bad("num_slots " + std::to_string(n) + " not in [1, " +
               std::to_string(kMaxSlotsPerGroup) + "]");
  }
  const uint64_t header_size = ObjectHeaderSize(n);
  if (bytes.size() < header_size) {
    return Bad("truncated: " + std::to_string(bytes.size()) + " bytes < header size " +
               std::to_string(header_size));
  }
  if (object_size < header_size) {
    return Bad("object size " + std::to_string(object_size) + " < header size " +
               std::to_string(header_size));
  }
  const auto stored_crc = GetLE<uint32_t>(p + kObjectHeaderCrcOffset);
  const uint32_t crc = HeaderCrc(p, header_size);
  if (stored_crc != crc) {
    return Bad("crc mismatch: stored " + Hex32(stored_crc) + ", computed " + Hex32(crc));
  }
  const uint64_t table_end = kObjectHeaderFixedBytes + kObjectSlotEntryBytes * n;
  for (uint64_t i = table_end; i < header_size; ++i) {
    if (p[i] != 0) return Bad("nonzero padding at byte " + std::to_string(i));
  }

  ParsedHeader out;
  out.id.ns = GetLE<uint64_t>(p + kNsAt);
  out.id.group = GetLE<uint32_t>(p + kGroupAt);
  std::memcpy(out.id.key.bytes.data(), p + kKeyAt, out.id.key.bytes.size());
  out.codec = codec;
  out.codec_version = codec_version;
  out.header_size = header_size;
  out.segments.reserve(n);
  uint64_t prev_end = header_size;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* entry = p + kObjectHeaderFixedBytes + kObjectSlotEntryBytes * i;
    const SegmentPos seg{.offset = GetLE<uint64_t>(entry), .size = GetLE<uint64_t>(entry + 8)};
    if (seg.size == 0) return Bad(SlotName(i) + "size 0");
    if (seg.offset % kObjectAlign != 0) {
      return Bad(SlotName(i) + Range(seg) + " not " + std::to_string(kObjectAlign) +
                 "-byte aligned");
    }
    if (seg.offset < prev_end) {
      return Bad(SlotName(i) + Range(seg) + " starts before " +
                 (i == 0 ? "the header end " : "the previous segment's end ") +
                 std::to_string(prev_end));
    }
    // offset + size <= object_size, without overflow.
    if (seg.size > object_size || seg.offset > object_size - seg.size) {
      return Bad(SlotName(i) + Range(seg) + " past object size " + std::to_string(object_size));
    }
    if (GetLE<uint32_t>(entry + kEntryReservedAt) != 0) {
      return Bad(SlotName(i) + "nonzero reserved field");
    }
    prev_end = seg.offset + seg.size;
    out.segments.push_back(seg);
    out.crcs.push_back(GetLE<uint32_t>(entry + kEntryCrcAt));
  }
  return out;
}

Status CheckObjectMatches(const ParsedHeader& header, const ObjectId& expected,
                          const std::vector<uint64_t>& expected_slot_bytes) {
  if (!(header.id == expected)) {
    return Status::Corruption("object holds " + Describe(header.id) + ", expected " +
                              Describe(expected));
  }
  if (header.segments.size() != expected_slot_bytes.size()) {
    return Status::Corruption("object " + Describe(expected) + " has " +
                              std::to_string(header.segments.size()) + " slots, expected " +
                              std::to_string(expected_slot_bytes.size()));
  }
  if (header.codec != kCodecRaw) return Status::OK();
  const std::vector<SegmentPos> canonical = SegmentLayout(expected_slot_bytes);
  for (size_t i = 0; i < expected_slot_bytes.size(); ++i) {
    if (header.segments[i].size != expected_slot_bytes[i]) {
      return Status::Corruption("object " + Describe(expected) + " slot " + std::to_string(i) +
                                " holds " + std::to_string(header.segments[i].size) +
                                " bytes, expected " + std::to_string(expected_slot_bytes[i]));
    }
    if (header.segments[i].offset != canonical[i].offset) {
      return Status::Corruption("object " + Describe(expected) + " slot " + std::to_string(i) +
                                " starts at " + std::to_string(header.segments[i].offset) +
                                ", expected " + std::to_string(canonical[i].offset));
    }
  }
  return Status::OK();
}

Status CheckSegmentCrc(const ParsedHeader& header, uint32_t slot, uint32_t computed) {
  if (header.crcs[slot] == computed) return Status::OK();
  return Status::Corruption("object " + Describe(header.id) + " slot " + std::to_string(slot) +
                            " " + Range(header.segments[slot]) + ": payload CRC32C " +
                            Hex32(computed) + ", header says " + Hex32(header.crcs[slot]));
}

Status VerifyObjectPayload(const ParsedHeader& header, std::span<const uint8_t> object) {
  for (uint32_t i = 0; i < header.segments.size(); ++i) {
    const SegmentPos& seg = header.segments[i];
    assert(seg.offset + seg.size <= object.size());
    ORBITKV_RETURN_IF_ERROR(
        CheckSegmentCrc(header, i, Crc32c(object.subspan(seg.offset, seg.size))));
  }
  return Status::OK();
}

}  // namespace orbitkv
