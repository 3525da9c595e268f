// Unit tests for the object format (header write/parse, segment layout,
// identity checks) and for StoreKey.
#include "store/object_format.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "store/crc32c.h"
#include "store/object_id.h"

namespace orbitkv {
namespace {

ObjectId Id(uint64_t ns, uint32_t group, uint64_t key) {
  ObjectId id;
  id.ns = ns;
  id.group = group;
  id.key = Key::FromU64(key);
  id.key.bytes[31] = 0x5A;  // the key's last byte is part of the header too
  return id;
}

// Unaligned sizes: 1000, 3, 1, 4097, 7, 1000, 3, ...
std::vector<uint64_t> Sizes(uint32_t n) {
  static constexpr uint64_t kPattern[] = {1000, 3, 1, 4097, 7};
  std::vector<uint64_t> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(kPattern[i % 5]);
  return out;
}

std::vector<uint8_t> Header(const ObjectId& id, const std::vector<uint64_t>& sizes,
                            ObjectCodec codec = {}) {
  std::vector<uint8_t> h(ObjectHeaderSize(static_cast<uint32_t>(sizes.size())));
  WriteObjectHeader(id, sizes, codec, {}, h);
  return h;
}

// Recomputes the crc after a test edits a header, so a later check is reached.
void Reseal(std::vector<uint8_t>& h, uint64_t header_size) {
  std::memset(h.data() + kObjectHeaderCrcOffset, 0, 4);
  const uint32_t crc = Crc32c({h.data(), header_size});
  for (int i = 0; i < 4; ++i) h[kObjectHeaderCrcOffset + i] = static_cast<uint8_t>(crc >> (8 * i));
}

void PutU64(std::vector<uint8_t>& h, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) h[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetU64(const std::vector<uint8_t>& h, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{h[at + i]} << (8 * i);
  return v;
}

size_t EntryAt(uint32_t slot) { return kObjectHeaderFixedBytes + kObjectSlotEntryBytes * slot; }

// Expects Corruption whose message contains `part`.
void ExpectCorrupt(const Result<ParsedHeader>& r, const std::string& part) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find(part), std::string_view::npos)
      << "message '" << r.status().message() << "' lacks '" << part << "'";
}

TEST(ObjectFormatTest, HeaderSize) {
  EXPECT_EQ(ObjectHeaderSize(1), 512u);
  EXPECT_EQ(ObjectHeaderSize(18), 512u);  // 64 + 18 * 24 = 496
  EXPECT_EQ(ObjectHeaderSize(19), 1024u);
  EXPECT_EQ(ObjectHeaderSize(100), 2560u);
  EXPECT_EQ(kObjectMaxHeaderBytes, 98816u);  // AlignUp(64 + 4096 * 24, 512)
}

TEST(ObjectFormatTest, SegmentLayoutPadsEachSegmentTo512) {
  const std::vector<SegmentPos> want = {{512, 1000}, {1536, 3}, {2048, 1}, {2560, 4097}, {7168, 7}};
  static_assert(ObjectHeaderSize(5) == 512);
  EXPECT_EQ(SegmentLayout({1000, 3, 1, 4097, 7}), want);
  EXPECT_EQ(ObjectSize({1000, 3, 1, 4097, 7}), 7175u);  // no tail padding
  EXPECT_EQ(SegmentLayout({512, 512}), (std::vector<SegmentPos>{{512, 512}, {1024, 512}}));
  EXPECT_EQ(ObjectSize({512, 512}), 1536u);
}

TEST(ObjectFormatTest, SegmentsAreAlignedAndContiguousWithPadding) {
  for (uint32_t n : {1u, 3u, 100u, kMaxSlotsPerGroup}) {
    const std::vector<uint64_t> sizes = Sizes(n);
    const std::vector<SegmentPos> segs = SegmentLayout(sizes);
    ASSERT_EQ(segs.size(), n);
    uint64_t end = ObjectHeaderSize(n);
    for (uint32_t i = 0; i < n; ++i) {
      EXPECT_EQ(segs[i].offset % kObjectAlign, 0u);
      EXPECT_EQ(segs[i].offset, AlignUp(end, kObjectAlign)) << "slot " << i;
      EXPECT_EQ(segs[i].size, sizes[i]);
      end = segs[i].offset + segs[i].size;
    }
    EXPECT_EQ(ObjectSize(sizes), end);
  }
}

TEST(ObjectFormatTest, FixedFieldsAreWhereTheFormatSays) {
  const ObjectId id = Id(0x0102030405060708ULL, 0x0A0B0C0D, 77);
  const std::vector<uint8_t> h = Header(id, {1000, 3}, {.id = 2, .version = 7});
  EXPECT_EQ(std::memcmp(h.data(), "OKVOBJ1\0", 8), 0);
  EXPECT_EQ(h[8], 2);  // version, little-endian
  EXPECT_EQ(h[9], 0);
  EXPECT_EQ(h[10], 2);  // codec id
  EXPECT_EQ(h[11], 7);  // its format version
  EXPECT_EQ(h[12], 2);  // num_slots
  EXPECT_EQ(GetU64(h, 16), id.ns);
  EXPECT_EQ(h[24], 0x0D);
  EXPECT_EQ(h[27], 0x0A);
  EXPECT_EQ(std::memcmp(h.data() + 32, id.key.bytes.data(), 32), 0);
  EXPECT_EQ(GetU64(h, EntryAt(0)), 512u);
  EXPECT_EQ(GetU64(h, EntryAt(0) + 8), 1000u);
  EXPECT_EQ(GetU64(h, EntryAt(1)), 1536u);
  EXPECT_EQ(GetU64(h, EntryAt(1) + 8), 3u);
  for (size_t i = EntryAt(2); i < h.size(); ++i) ASSERT_EQ(h[i], 0) << "byte " << i;
  // Payload CRCs at entry + 16, after the reserved u32 at + 20 stays zero.
  std::vector<uint8_t> with_crc(h.size());
  const uint32_t crcs[] = {0x11223344, 0xA5A5A5A5};
  WriteObjectHeader(id, {1000, 3}, {2, 7}, crcs, with_crc);
  EXPECT_EQ(with_crc[EntryAt(0) + 16], 0x44);
  EXPECT_EQ(with_crc[EntryAt(0) + 19], 0x11);
  EXPECT_EQ(with_crc[EntryAt(1) + 16], 0xA5);
  EXPECT_EQ(GetU64(with_crc, EntryAt(0) + 20) & 0xFFFFFFFF, 0u);
}

TEST(Crc32cTest, KnownValuesAndChaining) {
  const std::string s = "123456789";
  const std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  EXPECT_EQ(Crc32c(b), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(Crc32c({}), 0u);
  EXPECT_EQ(Crc32c(b.subspan(4), Crc32c(b.first(4))), 0xE3069283u);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(Crc32cCombine(Crc32c(b.first(cut)), Crc32c(b.subspan(cut)), s.size() - cut),
              0xE3069283u)
        << "cut " << cut;
  }
  // Bitwise reference over larger, unaligned data.
  std::vector<uint8_t> data(100003);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + (i >> 7));
  uint32_t reg = ~0u;
  for (uint8_t byte : data) reg = crc32c::ByteStep(reg, byte);
  EXPECT_EQ(Crc32c(data), ~reg);
  const std::span<const uint8_t> d(data);
  EXPECT_EQ(Crc32cCombine(Crc32c(d.first(777)), Crc32c(d.subspan(777)), data.size() - 777), ~reg);
}

std::vector<uint8_t> Object(const ObjectId& id, const std::vector<uint64_t>& sizes, uint8_t seed) {
  std::vector<uint8_t> obj(ObjectSize(sizes));
  for (const SegmentPos& seg : SegmentLayout(sizes)) {
    for (uint64_t i = 0; i < seg.size; ++i) obj[seg.offset + i] = static_cast<uint8_t>(seed + i);
  }
  const std::vector<uint32_t> crcs = SegmentCrcs(obj, sizes);
  WriteObjectHeader(id, sizes, ObjectCodec{}, crcs, obj);
  return obj;
}

TEST(ObjectFormatTest, PayloadCrcCatchesEveryFlippedPayloadByte) {
  const ObjectId id = Id(9, 1, 42);
  const std::vector<uint64_t> sizes = {1000, 3, 1, 4097};
  const std::vector<uint8_t> good = Object(id, sizes, 7);
  auto h = ParseObjectHeader(good, good.size());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(VerifyObjectPayload(*h, good).ok());
  for (size_t slot = 0; slot < sizes.size(); ++slot) {
    const SegmentPos seg = h->segments[slot];
    for (uint64_t i = 0; i < seg.size; i += (seg.size > 64 ? 61 : 1)) {
      std::vector<uint8_t> bad = good;
      bad[seg.offset + i] ^= 0x10;
      Status st = VerifyObjectPayload(*h, bad);
      ASSERT_EQ(st.code(), StatusCode::kCorruption) << "slot " << slot << " byte " << i;
      EXPECT_NE(st.message().find("slot " + std::to_string(slot)), std::string_view::npos)
          << st.message();
    }
  }
  // Another key's payload under this header (a misdirected write) fails too.
  const std::vector<uint8_t> other = Object(Id(9, 1, 43), sizes, 8);
  std::vector<uint8_t> mixed = good;
  std::copy(other.begin() + ObjectHeaderSize(4), other.end(), mixed.begin() + ObjectHeaderSize(4));
  EXPECT_EQ(VerifyObjectPayload(*h, mixed).code(), StatusCode::kCorruption);
}

TEST(ObjectFormatTest, SetSegmentCrcThenSealEqualsWritingTheCrcs) {
  const ObjectId id = Id(9, 1, 42);
  const std::vector<uint64_t> sizes = {1000, 3, 1};
  const std::vector<uint8_t> want = Object(id, sizes, 3);
  std::vector<uint8_t> obj = want;
  WriteObjectHeader(id, sizes, ObjectCodec{}, {}, obj);  // payload CRCs zero
  auto zero = ParseObjectHeader(obj, obj.size());
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(VerifyObjectPayload(*zero, obj).code(), StatusCode::kCorruption);
  const std::vector<uint32_t> crcs = SegmentCrcs(obj, sizes);
  for (uint32_t i = 0; i < sizes.size(); ++i) SetSegmentCrc(obj, i, crcs[i]);
  EXPECT_EQ(ParseObjectHeader(obj, obj.size()).status().code(), StatusCode::kCorruption)
      << "the header CRC is stale until sealed";
  SealObjectHeader(obj);
  EXPECT_EQ(obj, want);
}

TEST(ObjectFormatTest, Version1ObjectsAreRefused) {
  std::vector<uint8_t> h = Header(Id(9, 1, 42), {1000});
  h[8] = 1;
  Reseal(h, h.size());
  ExpectCorrupt(ParseObjectHeader(h, 512 + 1000), "format version 1 unsupported");
}

TEST(ObjectFormatTest, WriteZeroFillsPaddingAndStopsAtHeaderEnd) {
  std::vector<uint8_t> buf(ObjectHeaderSize(3) + 100, 0xAB);
  WriteObjectHeader(Id(1, 2, 3), {10, 20, 30}, ObjectCodec{}, {}, buf);
  std::vector<uint8_t> want = Header(Id(1, 2, 3), {10, 20, 30});
  want.resize(buf.size(), 0xAB);
  EXPECT_EQ(buf, want);
}

TEST(ObjectFormatTest, RoundTrip) {
  for (uint32_t n : {1u, 3u, 100u, kMaxSlotsPerGroup}) {
    SCOPED_TRACE("slots " + std::to_string(n));
    const ObjectId id = Id(n * 1000 + 7, n % kMaxGroups, n);
    const std::vector<uint64_t> sizes = Sizes(n);
    for (ObjectCodec codec : {ObjectCodec{}, ObjectCodec{3, 1}, ObjectCodec{255, 255}}) {
      const std::vector<uint8_t> h = Header(id, sizes, codec);
      auto r = ParseObjectHeader(h, ObjectSize(sizes));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->id, id);
      EXPECT_EQ(r->codec, codec.id);
      EXPECT_EQ(r->codec_version, codec.version);
      EXPECT_EQ(r->header_size, ObjectHeaderSize(n));
      EXPECT_EQ(r->segments, SegmentLayout(sizes));
      EXPECT_TRUE(CheckObjectMatches(*r, id, sizes).ok());
    }
  }
}

TEST(ObjectFormatTest, ParseAcceptsMoreBytesAndLargerObjectSize) {
  const std::vector<uint64_t> sizes = {1000, 3};
  std::vector<uint8_t> buf = Header(Id(1, 2, 3), sizes);
  buf.resize(ObjectSize(sizes) + 4096, 0xCD);  // the whole object and then some
  auto r = ParseObjectHeader(buf, ObjectSize(sizes) + 4096);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->segments, SegmentLayout(sizes));
}

TEST(ObjectFormatTest, EverySingleByteCorruptionIsRejected) {
  for (uint32_t n : {1u, 3u, 100u}) {
    SCOPED_TRACE("slots " + std::to_string(n));
    const std::vector<uint64_t> sizes = Sizes(n);
    const std::vector<uint8_t> good = Header(Id(9, 1, 42), sizes);
    const uint64_t object_size = ObjectSize(sizes);
    for (size_t i = 0; i < good.size(); ++i) {
      for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
        std::vector<uint8_t> bad = good;
        bad[i] ^= flip;
        auto r = ParseObjectHeader(bad, object_size);
        ASSERT_FALSE(r.ok()) << "byte " << i << " ^ " << int{flip} << " accepted";
        ASSERT_EQ(r.status().code(), StatusCode::kCorruption);
      }
    }
  }
}

TEST(ObjectFormatTest, TruncatedBuffersAreRejected) {
  const std::vector<uint64_t> sizes = Sizes(100);
  const std::vector<uint8_t> good = Header(Id(9, 1, 42), sizes);
  for (size_t len = 0; len < good.size(); ++len) {
    auto r = ParseObjectHeader(std::span<const uint8_t>(good.data(), len), ObjectSize(sizes));
    ExpectCorrupt(r, "truncated");
  }
}

TEST(ObjectFormatTest, ObjectSizeTooSmallIsRejected) {
  const std::vector<uint64_t> sizes = {1000, 3, 1};
  const std::vector<uint8_t> h = Header(Id(9, 1, 42), sizes);
  ExpectCorrupt(ParseObjectHeader(h, ObjectSize(sizes) - 1), "slot 2: [2048, +1) past object size");
  ExpectCorrupt(ParseObjectHeader(h, 1535), "slot 1: [1536, +3) past object size 1535");
  ExpectCorrupt(ParseObjectHeader(h, 1511), "slot 0: [512, +1000) past object size 1511");
  ExpectCorrupt(ParseObjectHeader(h, 511), "object size 511 < header size 512");
  ExpectCorrupt(ParseObjectHeader(h, 0), "object size 0");
  EXPECT_TRUE(ParseObjectHeader(h, ObjectSize(sizes)).ok());
}

// Forged headers with a valid crc: each rule past the crc check on its own.
class ForgedHeaderTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kSlots = 3;
  std::vector<uint64_t> sizes_ = {1000, 3, 1};
  uint64_t object_size_ = ObjectSize(sizes_);
  std::vector<uint8_t> h_ = Header(Id(9, 1, 42), sizes_);

  Result<ParsedHeader> Parse() {
    Reseal(h_, ObjectHeaderSize(kSlots));
    return ParseObjectHeader(h_, object_size_);
  }
};

TEST_F(ForgedHeaderTest, ResealedUnchangedHeaderParses) { EXPECT_TRUE(Parse().ok()); }

TEST_F(ForgedHeaderTest, BadMagic) {
  h_[6] = '2';
  ExpectCorrupt(Parse(), "bad magic");
}

TEST_F(ForgedHeaderTest, UnsupportedVersion) {
  h_[8] = 3;
  ExpectCorrupt(Parse(), "format version 3 unsupported");
}

// A raw object (codec 0) has version 0, an encoded one a nonzero version:
// a header claiming otherwise is damaged, not a format to guess at.
TEST_F(ForgedHeaderTest, CodecVersionWithoutCodecOrCodecWithoutVersion) {
  h_[11] = 1;
  ExpectCorrupt(Parse(), "codec 0 with format version 1 (flags 0x00000100)");
  h_ = Header(Id(9, 1, 42), sizes_);
  h_[10] = 1;
  ExpectCorrupt(Parse(), "codec 1 with format version 0");
}

// Objects written before codecs existed (flags 0) read as they did.
TEST(ObjectFormatTest, RawObjectsKeepTheFormatBeforeCodecs) {
  const std::vector<uint8_t> h = Header(Id(9, 1, 42), {1000, 3});
  EXPECT_EQ(h[10], 0);
  EXPECT_EQ(h[11], 0);
  auto r = ParseObjectHeader(h, ObjectSize({1000, 3}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->codec, kCodecRaw);
  EXPECT_EQ(r->codec_version, 0);
}

TEST_F(ForgedHeaderTest, NumSlotsOutOfRange) {
  std::memset(h_.data() + 12, 0, 4);
  ExpectCorrupt(Parse(), "num_slots 0");
  h_ = Header(Id(9, 1, 42), sizes_);
  h_[12] = 0x01, h_[13] = 0x10;  // 0x1001 = 4097
  ExpectCorrupt(ParseObjectHeader(h_, object_size_), "num_slots 4097");
  h_[12] = 0xFF, h_[13] = 0xFF, h_[14] = 0xFF, h_[15] = 0xFF;
  ExpectCorrupt(ParseObjectHeader(h_, ~uint64_t{0}), "num_slots 4294967295");
}

TEST_F(ForgedHeaderTest, NumSlotsLargerThanWrittenNeedsMoreBytes) {
  h_[12] = 29;  // header would be 1024 bytes; only 512 are here
  ExpectCorrupt(ParseObjectHeader(h_, object_size_), "truncated: 512 bytes < header size 1024");
}

TEST_F(ForgedHeaderTest, NonzeroPadding) {
  h_[EntryAt(kSlots) + 5] = 1;
  ExpectCorrupt(Parse(), "nonzero padding at byte " + std::to_string(EntryAt(kSlots) + 5));
  h_[EntryAt(kSlots) + 5] = 0;
  h_[511] = 0x80;
  ExpectCorrupt(Parse(), "nonzero padding at byte 511");
}

TEST_F(ForgedHeaderTest, ZeroSize) {
  PutU64(h_, EntryAt(1) + 8, 0);
  ExpectCorrupt(Parse(), "slot 1: size 0");
}

TEST_F(ForgedHeaderTest, UnalignedOffset) {
  PutU64(h_, EntryAt(1), 1537);
  ExpectCorrupt(Parse(), "slot 1: [1537, +3) not 512-byte aligned");
}

TEST_F(ForgedHeaderTest, SegmentInsideHeader) {
  PutU64(h_, EntryAt(0), 0);
  ExpectCorrupt(Parse(), "slot 0: [0, +1000) starts before the header end 512");
}

TEST_F(ForgedHeaderTest, OverlappingSegments) {
  PutU64(h_, EntryAt(1), 1024);  // slot 0 is [512, 1512)
  ExpectCorrupt(Parse(), "slot 1: [1024, +3) starts before the previous segment's end 1512");
}

TEST_F(ForgedHeaderTest, OutOfOrderSegments) {
  PutU64(h_, EntryAt(0), 2048);
  PutU64(h_, EntryAt(0) + 8, 1);
  PutU64(h_, EntryAt(2), 512);
  PutU64(h_, EntryAt(2) + 8, 1000);
  ExpectCorrupt(Parse(), "slot 1: [1536, +3) starts before the previous segment's end 2049");
}

TEST_F(ForgedHeaderTest, SizeOrOffsetOverflow) {
  object_size_ = ~uint64_t{0};
  PutU64(h_, EntryAt(2), AlignDown(~uint64_t{0}, 512));
  PutU64(h_, EntryAt(2) + 8, 1024);  // offset + size wraps
  ExpectCorrupt(Parse(), "slot 2");
  PutU64(h_, EntryAt(2), 2048);
  PutU64(h_, EntryAt(2) + 8, ~uint64_t{0});
  ExpectCorrupt(Parse(), "past object size");
}

TEST_F(ForgedHeaderTest, GapsBetweenSegmentsAreAccepted) {
  // Not what WriteObjectHeader produces, but well-formed: aligned, ordered, inside.
  PutU64(h_, EntryAt(2), 8192);
  object_size_ = 8193;
  auto r = Parse();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->segments[2], (SegmentPos{8192, 1}));
}

TEST(ObjectFormatTest, CheckObjectMatchesDetectsStaleOrForeignObjects) {
  const ObjectId id = Id(9, 1, 42);
  const std::vector<uint64_t> sizes = {1000, 3, 1};
  auto r = ParseObjectHeader(Header(id, sizes), ObjectSize(sizes));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(CheckObjectMatches(*r, id, sizes).ok());

  auto expect_mismatch = [&](const ObjectId& want, const std::vector<uint64_t>& want_sizes,
                             const std::string& part) {
    Status st = CheckObjectMatches(*r, want, want_sizes);
    ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find(part), std::string_view::npos) << st.message();
  };
  expect_mismatch(Id(10, 1, 42), sizes, "object holds ns 9 group 1");
  expect_mismatch(Id(9, 2, 42), sizes, "expected ns 9 group 2");
  ObjectId other_key = id;
  other_key.key.bytes[31] ^= 1;  // differs outside ShortHex's 8 bytes
  expect_mismatch(other_key, sizes, "object holds");
  expect_mismatch(id, {1000, 3}, "has 3 slots, expected 2");
  expect_mismatch(id, {1000, 3, 1, 1}, "has 3 slots, expected 4");
  expect_mismatch(id, {1000, 4, 1}, "slot 1 holds 3 bytes, expected 4");
  // Well formed and of the right sizes, but not where SegmentLayout puts them.
  std::vector<uint8_t> moved = Header(id, sizes);
  PutU64(moved, EntryAt(2), 4096);
  Reseal(moved, moved.size());
  auto m = ParseObjectHeader(moved, 4097);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Status st = CheckObjectMatches(*m, id, sizes);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("slot 2 starts at 4096, expected 2048"), std::string_view::npos)
      << st.message();
}

TEST(ObjectFormatTest, CheckObjectMatchesSkipsSizesOfEncodedObjects) {
  const ObjectId id = Id(9, 1, 42);
  const std::vector<uint64_t> stored = {600, 2, 1};  // encoded sizes
  auto r = ParseObjectHeader(Header(id, stored, {.id = 1, .version = 1}), ObjectSize(stored));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(CheckObjectMatches(*r, id, {1000, 3, 1}).ok());
  EXPECT_EQ(CheckObjectMatches(*r, id, {1000, 3}).code(), StatusCode::kCorruption);
  EXPECT_EQ(CheckObjectMatches(*r, Id(9, 0, 42), {1000, 3, 1}).code(), StatusCode::kCorruption);
}

// The committed fuzz seed (fuzz/corpus/object_header_fuzz: object_size u64,
// then the header) is an encoded object's header, so the fuzzer starts from
// the codec fields. ORBITKV_WRITE_FUZZ_SEEDS=1 rewrites it.
TEST(ObjectFormatTest, ObjectHeaderFuzzSeedIsAnEncodedHeader) {
  const std::vector<uint64_t> stored = {600, 2, 1};
  const uint64_t size = ObjectSize(stored);
  std::vector<uint8_t> seed(8);
  PutU64(seed, 0, size);
  const std::vector<uint8_t> h = Header(Id(9, 1, 42), stored, {.id = 1, .version = 1});
  seed.insert(seed.end(), h.begin(), h.end());
  const std::string path =
      std::string(ORBITKV_SOURCE_DIR) + "/fuzz/corpus/object_header_fuzz/encoded_header";
  if (std::getenv("ORBITKV_WRITE_FUZZ_SEEDS")) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(seed.data()), std::streamsize(seed.size()));
  }
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> got{std::istreambuf_iterator<char>(in), {}};
  ASSERT_EQ(got, seed) << path;
  auto r = ParseObjectHeader({got.data() + 8, got.size() - 8}, size);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->codec, 1);
  EXPECT_EQ(r->codec_version, 1);
}

// ---- StoreKey ---------------------------------------------------------------

std::string Hex(const Key& k) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : k.bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

TEST(StoreKeyTest, DeterministicAndPinned) {
  // Store keys are persisted in SSD directories: the mapping must never change.
  const ObjectId id = Id(3, 1, 0x1122334455667788ULL);
  EXPECT_EQ(StoreKey(id), StoreKey(id));
  EXPECT_NE(StoreKey(id), id.key);
  // Computed independently (Python model of the splitmix64 lanes).
  EXPECT_EQ(Hex(StoreKey(id)), "65f8678ea027290c6fcf0def386941489b65533c9ca8a7e4fbca15dcc20c29ed");
}

TEST(StoreKeyTest, NamespaceAndGroupSeparateEqualKeys) {
  std::set<Key> seen;
  size_t count = 0;
  for (uint64_t ns : {0ull, 1ull, 2ull, 3ull, 1ull << 32, 1ull << 63, ~0ull}) {
    for (uint32_t group = 0; group < kMaxGroups; ++group) {
      for (uint64_t key : {0ull, 1ull, 0xDEADBEEFull}) {
        seen.insert(StoreKey(Id(ns, group, key)));
        ++count;
      }
    }
  }
  EXPECT_EQ(seen.size(), count);
  // Large group ids too.
  EXPECT_NE(StoreKey(Id(0, 0, 5)), StoreKey(Id(0, ~0u, 5)));
}

TEST(StoreKeyTest, EveryKeyByteMatters) {
  const ObjectId id = Id(7, 3, 99);
  for (size_t i = 0; i < 32; ++i) {
    ObjectId other = id;
    other.key.bytes[i] ^= 1;
    EXPECT_NE(StoreKey(other), StoreKey(id)) << "byte " << i;
  }
}

TEST(StoreKeyTest, MaskSpreadsOverAllLanes) {
  // Lane 0 follows ns, lane 1 follows group, lanes 2 and 3 follow both.
  const Key a = StoreKey(Id(1, 0, 5));
  const Key b = StoreKey(Id(2, 0, 5));  // other ns
  const Key c = StoreKey(Id(1, 1, 5));  // other group
  auto lane_differs = [](const Key& x, const Key& y, size_t lane) {
    return std::memcmp(x.bytes.data() + 8 * lane, y.bytes.data() + 8 * lane, 8) != 0;
  };
  EXPECT_TRUE(lane_differs(a, b, 0));
  EXPECT_FALSE(lane_differs(a, b, 1));
  EXPECT_FALSE(lane_differs(a, c, 0));
  EXPECT_TRUE(lane_differs(a, c, 1));
  for (size_t lane : {2u, 3u}) {
    EXPECT_TRUE(lane_differs(a, b, lane)) << lane;
    EXPECT_TRUE(lane_differs(a, c, lane)) << lane;
  }
}

}  // namespace
}  // namespace orbitkv
