#include "io/coalesce.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace orbitkv {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kPage = 64 * kKiB;

uint64_t TotalBytes(const std::vector<CoalescedRead>& reads) {
  uint64_t total = 0;
  for (const auto& r : reads) total += r.length;
  return total;
}

TEST(CoalesceReadsTest, EmptyInputGivesNoReads) { EXPECT_TRUE(CoalesceReads({}).empty()); }

TEST(CoalesceReadsTest, FourAdjacentPagesInOneFileBecomeOneRead) {
  std::vector<ReadRange> ranges;
  for (uint64_t i = 0; i < 4; ++i) ranges.push_back({0, i * kPage, kPage});
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].file, 0u);
  EXPECT_EQ(reads[0].offset, 0u);
  EXPECT_EQ(reads[0].length, 256 * kKiB);
  EXPECT_THAT(reads[0].members, ElementsAre(0, 1, 2, 3));
}

TEST(CoalesceReadsTest, InputOrderDoesNotMatterAndMembersAreInOffsetOrder) {
  std::vector<ReadRange> ranges = {
      {0, 3 * kPage, kPage}, {0, kPage, kPage}, {0, 0, kPage}, {0, 2 * kPage, kPage}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].length, 256 * kKiB);
  EXPECT_THAT(reads[0].members, ElementsAre(2, 1, 3, 0));
}

TEST(CoalesceReadsTest, SamePagesSplitAcrossTwoFilesGiveTwoReads) {
  // Pages 0,1 in file 1 and pages 2,3 in file 0 (given interleaved).
  std::vector<ReadRange> ranges = {
      {1, 0, kPage}, {0, 2 * kPage, kPage}, {1, kPage, kPage}, {0, 3 * kPage, kPage}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].file, 0u);
  EXPECT_EQ(reads[0].offset, 2 * kPage);
  EXPECT_EQ(reads[0].length, 2 * kPage);
  EXPECT_THAT(reads[0].members, ElementsAre(1, 3));
  EXPECT_EQ(reads[1].file, 1u);
  EXPECT_EQ(reads[1].offset, 0u);
  EXPECT_EQ(reads[1].length, 2 * kPage);
  EXPECT_THAT(reads[1].members, ElementsAre(0, 2));
}

TEST(CoalesceReadsTest, SameOffsetsInDifferentFilesNeverMerge) {
  std::vector<ReadRange> ranges = {{0, 0, kPage}, {1, 0, kPage}, {2, 0, kPage}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 3u);
  for (uint32_t f = 0; f < 3; ++f) {
    EXPECT_EQ(reads[f].file, f);
    EXPECT_THAT(reads[f].members, ElementsAre(f));
  }
}

TEST(CoalesceReadsTest, AlternatingPagesLeaveTheGapsUnread) {
  // Pages 0 and 2 of four adjacent pages: two 64 KiB reads, 128 KiB in all.
  std::vector<ReadRange> ranges = {{0, 0, kPage}, {0, 2 * kPage, kPage}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].offset, 0u);
  EXPECT_EQ(reads[0].length, kPage);
  EXPECT_EQ(reads[1].offset, 2 * kPage);
  EXPECT_EQ(reads[1].length, kPage);
  EXPECT_EQ(TotalBytes(reads), 128 * kKiB);

  // Pages 0, 2, 4, 6 of eight: four reads.
  std::vector<ReadRange> even;
  for (uint64_t p = 0; p < 8; p += 2) even.push_back({0, p * kPage, kPage});
  auto even_reads = CoalesceReads(even);
  ASSERT_EQ(even_reads.size(), 4u);
  EXPECT_EQ(TotalBytes(even_reads), 4 * kPage);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(even_reads[i].offset, 2 * i * kPage);
    EXPECT_THAT(even_reads[i].members, ElementsAre(i));
  }
}

TEST(CoalesceReadsTest, UnalignedRangesInOneBlockMergeIntoThatBlock) {
  std::vector<ReadRange> ranges = {{0, 8192 + 100, 50}, {0, 8192 + 10, 20}, {0, 8192 + 4000, 96}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].offset, 8192u);
  EXPECT_EQ(reads[0].length, 4096u);
  EXPECT_THAT(reads[0].members, ElementsAre(1, 0, 2));
}

TEST(CoalesceReadsTest, UnalignedRangesAreAlignedOutward) {
  // [5000, 9000) touches blocks 1 and 2; [13000, +1) touches block 3: adjacent, so one read.
  std::vector<ReadRange> ranges = {{0, 5000, 4000}, {0, 13000, 1}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].offset, 4096u);
  EXPECT_EQ(reads[0].length, 3 * 4096u);
  // An unrequested block between them keeps them apart.
  ranges = {{0, 5000, 4000}, {0, 17000, 1}};
  reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].length, 2 * 4096u);
  EXPECT_EQ(reads[1].offset, 4 * 4096u);
  EXPECT_EQ(reads[1].length, 4096u);
}

TEST(CoalesceReadsTest, OverlappingRangesMerge) {
  std::vector<ReadRange> ranges = {{0, 0, 3 * kPage}, {0, kPage, kPage}, {0, 2 * kPage, 2 * kPage}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].length, 4 * kPage);
  EXPECT_THAT(reads[0].members, ElementsAre(0, 1, 2));
}

TEST(CoalesceReadsTest, MergedReadsStopAtTheCap) {
  // 96 adjacent 64 KiB pages = 6 MiB: a 4 MiB read and a 2 MiB read.
  std::vector<ReadRange> ranges;
  for (uint64_t i = 0; i < 96; ++i) ranges.push_back({0, i * kPage, kPage});
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].offset, 0u);
  EXPECT_EQ(reads[0].length, 4 * kMiB);
  EXPECT_EQ(reads[0].members.size(), 64u);
  EXPECT_EQ(reads[1].offset, 4 * kMiB);
  EXPECT_EQ(reads[1].length, 2 * kMiB);
  EXPECT_EQ(reads[1].members.size(), 32u);
  EXPECT_EQ(reads[1].members.front(), 64u);
  EXPECT_EQ(reads[1].members.back(), 95u);

  // A smaller cap.
  auto small = CoalesceReads(ranges, 4096, 256 * kKiB);
  ASSERT_EQ(small.size(), 24u);
  for (const auto& r : small) EXPECT_EQ(r.length, 256 * kKiB);
}

TEST(CoalesceReadsTest, ARangeThatWouldCrossTheCapStartsANewRead) {
  // 4 MiB - 64 KiB, then a 128 KiB range: merging would exceed 4 MiB.
  std::vector<ReadRange> ranges = {{0, 0, 4 * kMiB - kPage}, {0, 4 * kMiB - kPage, 2 * kPage}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].length, 4 * kMiB - kPage);
  EXPECT_EQ(reads[1].offset, 4 * kMiB - kPage);
  EXPECT_EQ(reads[1].length, 2 * kPage);
}

TEST(CoalesceReadsTest, OneLargeRangeSplitsIntoCappedPieces) {
  std::vector<ReadRange> ranges = {{3, kMiB, 10 * kMiB}};
  auto reads = CoalesceReads(ranges);
  ASSERT_EQ(reads.size(), 3u);
  EXPECT_EQ(reads[0].offset, kMiB);
  EXPECT_EQ(reads[0].length, 4 * kMiB);
  EXPECT_EQ(reads[1].offset, 5 * kMiB);
  EXPECT_EQ(reads[1].length, 4 * kMiB);
  EXPECT_EQ(reads[2].offset, 9 * kMiB);
  EXPECT_EQ(reads[2].length, 2 * kMiB);
  for (const auto& r : reads) {
    EXPECT_EQ(r.file, 3u);
    EXPECT_THAT(r.members, ElementsAre(0));
  }
}

TEST(CoalesceReadsTest, LargeRangeAmongSmallOnesKeepsOutputOrdered) {
  std::vector<ReadRange> ranges = {
      {0, 20 * kMiB, kPage},  // after the large range, with a gap
      {0, 0, 10 * kMiB},      // split 4 + 4 + 2
      {0, 10 * kMiB, kPage},  // touches the large range's end
      {0, kMiB, kPage},       // inside the large range
  };
  auto reads = CoalesceReads(ranges);
  for (size_t i = 1; i < reads.size(); ++i) {
    EXPECT_LE(reads[i - 1].offset, reads[i].offset);
  }
  // Every member is covered whole by a read that names it.
  for (size_t m = 0; m < ranges.size(); ++m) {
    uint64_t covered = 0;
    for (const auto& r : reads) {
      for (size_t idx : r.members) {
        if (idx != m) continue;
        const uint64_t lo = std::max(r.offset, ranges[m].offset);
        const uint64_t hi = std::min(r.offset + r.length, ranges[m].offset + ranges[m].length);
        if (hi > lo) covered += hi - lo;
      }
    }
    EXPECT_EQ(covered, ranges[m].length) << "member " << m;
  }
  for (const auto& r : reads) {
    EXPECT_EQ(r.offset % 4096, 0u);
    EXPECT_EQ(r.length % 4096, 0u);
    EXPECT_LE(r.length, 4 * kMiB);
  }
}

TEST(CoalesceReadsTest, CustomAlignment) {
  std::vector<ReadRange> ranges = {{0, 100, 10}, {0, 600, 10}};
  auto reads = CoalesceReads(ranges, 512, 1 * kMiB);
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].offset, 0u);
  EXPECT_EQ(reads[0].length, 1024u);
  EXPECT_THAT(reads[0].members, ElementsAre(0, 1));
}

}  // namespace
}  // namespace orbitkv
