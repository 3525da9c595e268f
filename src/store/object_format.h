// Object format: the stored bytes of one storage group for one key (DESIGN.md,
// "object"): a header, then one segment per slot in slot order, each starting
// at a multiple of 512 from the object start, zeros between. The object ends
// where the last segment's bytes end (no tail padding). Headers come back from
// disk, so ParseObjectHeader treats its input as untrusted. All functions are
// pure and thread-safe.
//
// Header, little-endian; header_size = AlignUp(64 + 24 * num_slots, 512):
//   [0, 8)    magic "OKVOBJ1\0"
//   [8, 10)   format version u16 (kObjectFormatVersion)
//   [10, 12)  flags u16: bits 0-7 codec id (0 = raw), bits 8-15 the codec's
//             format version (0 for raw, nonzero otherwise; codec/codec.h)
//   [12, 16)  num_slots u32, in [1, kMaxSlotsPerGroup]
//   [16, 24)  ns u64
//   [24, 28)  group u32
//   [28, 32)  header CRC32C of bytes [0, header_size) with this field zeroed
//   [32, 64)  key
//   [64, 64 + 24 * num_slots)  per slot: offset u64 (from the object start),
//             size u64, payload CRC32C u32 of the segment's stored bytes
//             [offset, offset + size), reserved u32 (zero)
//   then zeros up to header_size
// The header CRC covers the whole header, slot table and padding included, so
// any corrupted header byte is detected; each payload CRC covers its segment,
// so a torn, misdirected or bit-flipped payload is detected too (before a
// byte of it reaches an engine page: VerifyObjectPayload on the CPU, the
// cuFile worker's kernel on the GPU). Version 1 (16-byte slot entries, zlib
// CRC32 of the header only) is refused as Corruption: the SSD cache is
// recreated at every start, so such an object is never served.
// Encoded objects (codec id != 0): each segment is the codec's frame of the
// slot's raw bytes (codec/codec.h), its size the frame's, its payload CRC the
// CRC32C of the frame; segments are laid out by SegmentLayout of the encoded
// sizes. Raw objects (codec 0) are the format as it was before codecs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "orbitkv/layout.h"
#include "orbitkv/status.h"
#include "orbitkv/units.h"
#include "store/object_id.h"

namespace orbitkv {

inline constexpr char kObjectMagic[8] = {'O', 'K', 'V', 'O', 'B', 'J', '1', '\0'};
inline constexpr uint16_t kObjectFormatVersion = 2;
inline constexpr uint64_t kObjectAlign = 512;  // header size and segment offsets
inline constexpr uint64_t kObjectHeaderFixedBytes = 64;
inline constexpr uint64_t kObjectSlotEntryBytes = 24;
inline constexpr uint64_t kObjectHeaderCrcOffset = 28;
inline constexpr uint8_t kCodecRaw = 0;

// The codec of an object's segments: header flags bits 0-7 (id) and 8-15
// (the version of the codec's format its encoder wrote).
struct ObjectCodec {
  uint8_t id = kCodecRaw;
  uint8_t version = 0;  // 0 exactly when id is kCodecRaw
  friend bool operator==(const ObjectCodec&, const ObjectCodec&) = default;
};

struct SegmentPos {
  uint64_t offset = 0;  // from the object start; a multiple of kObjectAlign
  uint64_t size = 0;    // bytes of the slot (as stored: encoded when a codec is set)
  friend bool operator==(const SegmentPos&, const SegmentPos&) = default;
};

// The shape of a group's raw object: the size of every slot, in slot order,
// and what follows from them (MakeObjectShape). Every instance of a namespace
// agrees on it for each group.
struct ObjectShape {
  std::vector<uint64_t> slot_bytes;
  std::vector<SegmentPos> segments;  // SegmentLayout(slot_bytes)
  uint64_t header_bytes = 0;         // ObjectHeaderSize(slot_bytes.size())
  uint64_t object_size = 0;          // ObjectSize(slot_bytes)
};

// Header bytes for num_slots slots, padding included.
inline constexpr uint64_t ObjectHeaderSize(uint32_t num_slots) {
  return AlignUp(kObjectHeaderFixedBytes + kObjectSlotEntryBytes * uint64_t{num_slots},
                 kObjectAlign);
}
inline constexpr uint64_t kObjectMaxHeaderBytes = ObjectHeaderSize(kMaxSlotsPerGroup);

// Where each slot's segment lies: the first right after the header, each next
// one at the first 512 boundary after the previous one's end.
// REQUIRES: every size > 0 and the sum of the padded sizes fits in uint64.
std::vector<SegmentPos> SegmentLayout(const std::vector<uint64_t>& slot_bytes);

// Bytes of the whole object: the end of the last segment (the header size when
// there is none). Same REQUIRES as SegmentLayout.
uint64_t ObjectSize(const std::vector<uint64_t>& slot_bytes);

// The ObjectShape of `slot_bytes`. Same REQUIRES as SegmentLayout, and
// slot_bytes.size() <= kMaxSlotsPerGroup.
ObjectShape MakeObjectShape(const std::vector<uint64_t>& slot_bytes);

// Writes the header of the object holding `slot_bytes` (as stored) under `id`
// into out[0, ObjectHeaderSize(n)), zero-filling the padding; bytes of `out`
// past the header are not touched. The segments go at SegmentLayout(slot_bytes).
// `segment_crcs` holds each segment's payload CRC32C, or is empty: then every
// payload CRC is written as 0, to be filled in with SetSegmentCrc and
// SealObjectHeader once the payload is known (fragmented publishes).
// REQUIRES: 1 <= slot_bytes.size() <= kMaxSlotsPerGroup, every size > 0,
// segment_crcs empty or one per slot, out.size() >= ObjectHeaderSize(n).
// REQUIRES (also): codec.version is 0 exactly when codec.id is kCodecRaw.
void WriteObjectHeader(const ObjectId& id, const std::vector<uint64_t>& slot_bytes,
                       ObjectCodec codec, std::span<const uint32_t> segment_crcs,
                       std::span<uint8_t> out);

// Sets slot `slot`'s payload CRC in a header WriteObjectHeader wrote; the
// header CRC is stale until SealObjectHeader. Entries of different slots are
// disjoint bytes, so writers of different slots may call it concurrently.
// REQUIRES: slot < the header's num_slots, header.size() >= its header size.
void SetSegmentCrc(std::span<uint8_t> header, uint32_t slot, uint32_t crc);

// Recomputes and stores the header CRC (after SetSegmentCrc). REQUIRES: the
// header's fixed part is well formed (num_slots in range) and header.size()
// >= its header size.
void SealObjectHeader(std::span<uint8_t> header);

// The payload CRC32C of every segment of an object laid out by SegmentLayout:
// what WriteObjectHeader takes. REQUIRES: object.size() >= ObjectSize(slot_bytes).
std::vector<uint32_t> SegmentCrcs(std::span<const uint8_t> object,
                                  const std::vector<uint64_t>& slot_bytes);

struct ParsedHeader {
  ObjectId id;
  uint8_t codec = kCodecRaw;
  uint8_t codec_version = 0;  // nonzero exactly when codec is not raw
  uint64_t header_size = 0;
  std::vector<SegmentPos> segments;  // one per slot, in slot order
  std::vector<uint32_t> crcs;        // each segment's payload CRC32C
};

// Parses an untrusted header from the start of `bytes` (which may hold more of
// the object) for an object of `object_size` bytes. Checks magic, version,
// flags, num_slots, crc, zero padding, and that the segments are non-empty,
// 512-aligned, in order, non-overlapping, after the header and inside
// object_size, and that the codec version is 0 exactly for raw objects (which
// codec ids and versions exist is the codec's to check). Any failure is
// Corruption saying which check failed.
Result<ParsedHeader> ParseObjectHeader(std::span<const uint8_t> bytes, uint64_t object_size);

// Corruption when a well-formed header is not the object the caller looked up
// (a stale or foreign object): the id differs, or the slot count, or, for a raw
// object, a slot size or a segment offset (raw objects are laid out by
// SegmentLayout, so a reader knows where every segment lies before it has the
// header). An encoded object's sizes are the codec's; the codec checks its
// decoded sizes.
Status CheckObjectMatches(const ParsedHeader& header, const ObjectId& expected,
                          const std::vector<uint64_t>& expected_slot_bytes);

// Corruption naming the slot and both CRCs when a segment's payload CRC32C
// differs from the header's. REQUIRES: `header` was parsed from `object` (so
// every segment lies inside it).
Status VerifyObjectPayload(const ParsedHeader& header, std::span<const uint8_t> object);

// Corruption for segment `slot` whose computed payload CRC is `computed`;
// OK when it equals the header's. For readers that compute CRCs elsewhere (the
// GPU). REQUIRES: slot < header.segments.size().
Status CheckSegmentCrc(const ParsedHeader& header, uint32_t slot, uint32_t computed);

}  // namespace orbitkv
