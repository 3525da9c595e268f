#include "store/object_format.h"

#include <zlib.h>

#include <cassert>
#include <cstring>
#include <string>

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

// crc32 of header[0, size) with the crc field read as zero.
uint32_t HeaderCrc(const uint8_t* header, uint64_t size) {
  static constexpr uint8_t kZero[4] = {};
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, header, kObjectHeaderCrcOffset);
  crc = crc32(crc, kZero, sizeof kZero);
  crc = crc32(crc, header + kObjectHeaderCrcOffset + 4,
              static_cast<uInt>(size - kObjectHeaderCrcOffset - 4));
  return static_cast<uint32_t>(crc);
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

void WriteObjectHeader(const ObjectId& id, const std::vector<uint64_t>& slot_bytes, uint8_t codec,
                       std::span<uint8_t> out) {
  const auto n = static_cast<uint32_t>(slot_bytes.size());
  assert(n >= 1 && n <= kMaxSlotsPerGroup);
  const uint64_t header_size = ObjectHeaderSize(n);
  assert(out.size() >= header_size);
  uint8_t* p = out.data();
  std::memset(p, 0, header_size);
  std::memcpy(p, kObjectMagic, sizeof kObjectMagic);
  PutLE<uint16_t>(p + kVersionAt, kObjectFormatVersion);
  PutLE<uint16_t>(p + kFlagsAt, codec);
  PutLE<uint32_t>(p + kNumSlotsAt, n);
  PutLE<uint64_t>(p + kNsAt, id.ns);
  PutLE<uint32_t>(p + kGroupAt, id.group);
  std::memcpy(p + kKeyAt, id.key.bytes.data(), id.key.bytes.size());
  uint8_t* entry = p + kObjectHeaderFixedBytes;
  for (const SegmentPos& seg : SegmentLayout(slot_bytes)) {
    assert(seg.size > 0);
    PutLE<uint64_t>(entry, seg.offset);
    PutLE<uint64_t>(entry + 8, seg.size);
    entry += kObjectSlotEntryBytes;
  }
  PutLE<uint32_t>(p + kObjectHeaderCrcOffset, HeaderCrc(p, header_size));
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
  if ((flags >> 8) != 0) return Bad("unknown flags " + Hex32(flags));
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
  out.codec = static_cast<uint8_t>(flags & 0xff);
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
    prev_end = seg.offset + seg.size;
    out.segments.push_back(seg);
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
  for (size_t i = 0; i < expected_slot_bytes.size(); ++i) {
    if (header.segments[i].size != expected_slot_bytes[i]) {
      return Status::Corruption("object " + Describe(expected) + " slot " + std::to_string(i) +
                                " holds " + std::to_string(header.segments[i].size) +
                                " bytes, expected " + std::to_string(expected_slot_bytes[i]));
    }
  }
  return Status::OK();
}

}  // namespace orbitkv
