// Unit tests for ValidateLayout: the two layouts engines use, unaligned sizes,
// one rejection per rule (checking the message names the field), overflow.
#include "orbitkv/layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace orbitkv {
namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// Split layout: one region per slot, each a dense [num_pages][bytes] tensor.
InstanceLayout Split(uint64_t pages, const std::vector<uint64_t>& bytes) {
  InstanceLayout l;
  l.num_pages = pages;
  GroupLayout g;
  g.group_id = 0;
  g.num_slots = static_cast<uint32_t>(bytes.size());
  g.slot_bytes = bytes;
  for (uint32_t s = 0; s < bytes.size(); ++s) {
    l.region_bytes.push_back(pages * bytes[s]);
    g.slots.push_back({.slot_id = s,
                       .region = s,
                       .offset = 0,
                       .page_stride = bytes[s],
                       .bytes_per_page = bytes[s]});
  }
  l.groups.push_back(g);
  return l;
}

// Page-first layout: one region of [num_pages][page], slots adjacent inside a page.
InstanceLayout PageFirst(uint64_t pages, const std::vector<uint64_t>& bytes) {
  uint64_t page = 0;
  for (uint64_t b : bytes) page += b;
  InstanceLayout l;
  l.num_pages = pages;
  l.region_bytes = {pages * page};
  GroupLayout g;
  g.group_id = 5;
  g.num_slots = static_cast<uint32_t>(bytes.size());
  g.slot_bytes = bytes;
  uint64_t off = 0;
  for (uint32_t s = 0; s < bytes.size(); ++s) {
    g.slots.push_back({.slot_id = s,
                       .region = 0,
                       .offset = off,
                       .page_stride = page,
                       .bytes_per_page = bytes[s]});
    off += bytes[s];
  }
  l.groups.push_back(g);
  return l;
}

// Expects InvalidArgument whose message contains every one of `parts`.
void ExpectRejected(const InstanceLayout& l, const std::vector<std::string>& parts) {
  Status st = ValidateLayout(l);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  for (const std::string& p : parts) {
    EXPECT_NE(st.message().find(p), std::string_view::npos)
        << "message '" << st.message() << "' lacks '" << p << "'";
  }
}

TEST(LayoutTest, SplitLayoutIsValid) {
  InstanceLayout l = Split(1000, {65536, 65536, 65536, 65536});
  EXPECT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l).ToString();
}

TEST(LayoutTest, PageFirstLayoutIsValid) {
  InstanceLayout l = PageFirst(1000, {4096, 4096, 8192});
  EXPECT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l).ToString();
  EXPECT_EQ(SlotPageOffset(l.groups[0].slots[2], 999), 999 * 16384 + 8192);
}

TEST(LayoutTest, UnalignedSizesAreValid) {
  EXPECT_TRUE(ValidateLayout(Split(7, {1000, 3, 1})).ok());
  EXPECT_TRUE(ValidateLayout(PageFirst(7, {1000, 3, 1})).ok());
}

TEST(LayoutTest, SlotEndingExactlyAtRegionEndIsValid) {
  InstanceLayout l = Split(10, {1000});
  l.region_bytes[0] = 10 * 1000;  // exactly fits
  EXPECT_TRUE(ValidateLayout(l).ok());
  l.region_bytes[0] -= 1;
  ExpectRejected(l, {"group 0 slot 0", "last page ends at 10000", "region 0"});
}

TEST(LayoutTest, PartialSlotOwnershipIsValid) {
  // A TP/PP writer holding slots 1 and 3 of a 4-slot group.
  InstanceLayout l = Split(4, {100, 200, 300, 400});
  l.groups[0].slots = {l.groups[0].slots[3], l.groups[0].slots[1]};
  EXPECT_TRUE(ValidateLayout(l).ok());
}

TEST(LayoutTest, SinglePageAllowsAnyStride) {
  InstanceLayout l = Split(1, {512});
  l.groups[0].slots[0].page_stride = 0;
  EXPECT_TRUE(ValidateLayout(l).ok());
  l.groups[0].slots[0].page_stride = kU64Max;  // never multiplied: (1 - 1) * stride
  EXPECT_TRUE(ValidateLayout(l).ok());
}

TEST(LayoutTest, AliasedPagesAreNotChecked) {
  // stride < bytes: pages overlap; engines may alias, so it is accepted.
  InstanceLayout l = Split(4, {1000});
  l.groups[0].slots[0].page_stride = 10;
  EXPECT_TRUE(ValidateLayout(l).ok());
}

TEST(LayoutTest, EmptyLayoutWithPagesIsValid) {
  InstanceLayout l;
  l.num_pages = 1;
  EXPECT_TRUE(ValidateLayout(l).ok());
}

TEST(LayoutTest, RejectsNumPages) {
  InstanceLayout l = Split(1, {16});
  l.num_pages = 0;
  ExpectRejected(l, {"num_pages 0"});
  l = Split(1, {16});
  l.num_pages = kMaxPages;
  l.region_bytes[0] = kU64Max;
  ExpectRejected(l, {"num_pages"});
  l.num_pages = kMaxPages - 1;
  l.groups[0].slots[0].page_stride = 1;  // ends at 2^40 - 2 + 16
  EXPECT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l).ToString();
}

TEST(LayoutTest, RejectsRegions) {
  InstanceLayout l = Split(2, {16});
  l.region_bytes.resize(kMaxRegions + 1, 64);
  ExpectRejected(l, {"region_bytes", std::to_string(kMaxRegions + 1)});
  l = Split(2, {16, 16});
  l.region_bytes[1] = 0;
  ExpectRejected(l, {"region 1", "region_bytes is 0"});
}

TEST(LayoutTest, RejectsGroups) {
  InstanceLayout l = Split(2, {16});
  GroupLayout g = l.groups[0];
  l.groups.clear();
  for (uint32_t i = 0; i <= kMaxGroups; ++i) {
    g.group_id = i;
    l.groups.push_back(g);
  }
  ExpectRejected(l, {"groups", std::to_string(kMaxGroups + 1)});

  l = Split(2, {16});
  l.groups[0].group_id = kMaxGroups;
  ExpectRejected(l, {"group 64", "group_id"});

  l = Split(2, {16});
  l.groups.push_back(l.groups[0]);
  ExpectRejected(l, {"group 0", "group_id appears twice"});
}

TEST(LayoutTest, RejectsNumSlots) {
  InstanceLayout l = Split(2, {16});
  l.groups[0].num_slots = 0;
  ExpectRejected(l, {"group 0", "num_slots 0"});

  l = Split(2, {16});
  l.groups[0].num_slots = kMaxSlotsPerGroup + 1;
  l.groups[0].slot_bytes.resize(kMaxSlotsPerGroup + 1, 16);
  ExpectRejected(l, {"group 0", "num_slots 4097"});

  l = Split(2, {16, 16});
  l.groups[0].slot_bytes.pop_back();
  ExpectRejected(l, {"group 0", "slot_bytes has 1 entries", "num_slots 2"});
}

TEST(LayoutTest, RejectsSlotBytes) {
  InstanceLayout l = Split(2, {16, 16});
  l.groups[0].slot_bytes[1] = 0;
  ExpectRejected(l, {"group 0 slot 1", "slot_bytes 0"});

  l = Split(2, {16, 16});
  l.groups[0].slot_bytes[1] = kMaxSlotBytes + 1;
  ExpectRejected(l, {"group 0 slot 1", "slot_bytes " + std::to_string(kMaxSlotBytes + 1)});

  // The largest slot is accepted.
  l = Split(1, {kMaxSlotBytes});
  EXPECT_TRUE(ValidateLayout(l).ok());
}

TEST(LayoutTest, RejectsSlotId) {
  InstanceLayout l = PageFirst(2, {16, 16});
  l.groups[0].slots[1].slot_id = 2;
  ExpectRejected(l, {"group 5 slot 2", "slot_id >= num_slots 2"});

  l = PageFirst(2, {16, 16});
  l.groups[0].slots[1].slot_id = 0;
  ExpectRejected(l, {"group 5 slot 0", "slot_id appears twice"});

  l = PageFirst(2, {16, 16});
  l.groups[0].slots.push_back(l.groups[0].slots[0]);
  ExpectRejected(l, {"group 5", "3 slots listed"});
}

TEST(LayoutTest, RejectsRegionIndex) {
  InstanceLayout l = Split(2, {16, 16});
  l.groups[0].slots[1].region = 2;
  ExpectRejected(l, {"group 0 slot 1", "region 2 >= region count 2"});
}

TEST(LayoutTest, RejectsBytesPerPage) {
  InstanceLayout l = Split(2, {16, 16});
  l.groups[0].slots[1].bytes_per_page = 15;
  ExpectRejected(l, {"group 0 slot 1", "bytes_per_page 15 != slot_bytes 16"});
}

TEST(LayoutTest, RejectsZeroStrideWithManyPages) {
  InstanceLayout l = Split(2, {16});
  l.groups[0].slots[0].page_stride = 0;
  ExpectRejected(l, {"group 0 slot 0", "page_stride is 0"});
}

TEST(LayoutTest, RejectsSlotPastRegionEnd) {
  InstanceLayout l = PageFirst(3, {1000, 3});
  l.groups[0].slots[1].offset = 1001;  // last page: 2 * 1003 + 1001 + 3 = 3010 > 3009
  ExpectRejected(l, {"group 5 slot 1", "offset 1001", "last page ends at 3010", "region 0"});

  l = Split(3, {1000});
  l.groups[0].slots[0].page_stride = 1001;
  ExpectRejected(l, {"group 0 slot 0", "page_stride 1001"});
}

TEST(LayoutTest, RejectsOverflow) {
  // (num_pages - 1) * stride overflows.
  InstanceLayout l = Split(3, {16});
  l.region_bytes[0] = kU64Max;
  l.groups[0].slots[0].page_stride = (kU64Max / 2) + 1;
  ExpectRejected(l, {"group 0 slot 0", "page_stride", "overflows"});

  // Huge stride times many pages.
  l = Split(kMaxPages - 1, {16});
  l.region_bytes[0] = kU64Max;
  l.groups[0].slots[0].page_stride = 1ull << 25;  // (2^40 - 2) * 2^25 > 2^64
  ExpectRejected(l, {"group 0 slot 0", "overflows"});

  // offset + span overflows.
  l = Split(2, {16});
  l.region_bytes[0] = kU64Max;
  l.groups[0].slots[0].page_stride = 1ull << 62;
  l.groups[0].slots[0].offset = kU64Max - (1ull << 61);
  ExpectRejected(l, {"group 0 slot 0", "overflows"});

  // ... + bytes_per_page overflows: the end lands exactly on 2^64.
  l = Split(2, {16});
  l.region_bytes[0] = kU64Max;
  l.groups[0].slots[0].page_stride = 16;
  l.groups[0].slots[0].offset = kU64Max - 31;  // + 16 + 16 = 2^64
  ExpectRejected(l, {"group 0 slot 0", "overflows"});
  l.groups[0].slots[0].offset = kU64Max - 32;  // ends at 2^64 - 1 = region end
  EXPECT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l).ToString();
}

TEST(LayoutTest, ErrorNamesTheRightGroupAmongMany) {
  InstanceLayout l = Split(4, {64});
  GroupLayout g2 = l.groups[0];
  g2.group_id = 9;
  g2.slots[0].offset = 1;  // ends one byte past the region
  l.groups.push_back(g2);
  ExpectRejected(l, {"group 9 slot 0", "offset 1"});
}

}  // namespace
}  // namespace orbitkv
