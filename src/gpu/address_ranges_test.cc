#include "gpu/address_ranges.h"

#include <gtest/gtest.h>

#include <random>

namespace orbitkv::gpu {
namespace {

constexpr MemoryKind kDev = MemoryKind::kThisDevice;
constexpr MemoryKind kHost = MemoryKind::kMappedHost;

TEST(AddressRangeTest, HoldsOnlyWhatLiesWhollyInside) {
  const AddressRange r{1000, 2000, kDev};
  EXPECT_TRUE(r.Holds(1000, 1000));
  EXPECT_TRUE(r.Holds(1999, 1));
  EXPECT_TRUE(r.Holds(1500, 0));
  EXPECT_FALSE(r.Holds(999, 1));
  EXPECT_FALSE(r.Holds(1999, 2));  // straddles the end
  EXPECT_FALSE(r.Holds(2000, 0));  // the end is outside
  EXPECT_FALSE(r.Holds(1000, UINT64_MAX));
  EXPECT_FALSE(AddressRange{}.Holds(0, 0));  // the empty default holds nothing
}

TEST(AddressRangeTableTest, FindsTheHoldingRangeFirstTimeAndAgain) {
  // Given out of order: the table sorts.
  const AddressRangeTable t({{5000, 6000, kDev}, {1000, 2000, kHost}, {3000, 4000, kDev}});
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].begin, 1000u);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass starts from the thread's guesses
    EXPECT_EQ(t.Find(1000, 10), 0u) << pass;
    EXPECT_EQ(t.Find(3999, 1), 1u) << pass;
    EXPECT_EQ(t.Find(5500, 500), 2u) << pass;
    EXPECT_EQ(t.Find(2000, 1), AddressRangeTable::npos) << pass;     // a gap
    EXPECT_EQ(t.Find(1500, 1000), AddressRangeTable::npos) << pass;  // across a gap
    EXPECT_EQ(t.Find(0, 1), AddressRangeTable::npos) << pass;
    EXPECT_EQ(t.Find(6000, 1), AddressRangeTable::npos) << pass;
  }
  EXPECT_EQ(AddressRangeTable().Find(1, 1), AddressRangeTable::npos);
}

// The thread's guesses are indices of whichever table answered last: another
// table's (or an older one of the same device) must never answer wrongly.
TEST(AddressRangeTableTest, GuessesLeftByAnotherTableAreCheckedNotTrusted) {
  const uint64_t g = 2u << 20;  // one granule
  const AddressRangeTable a(
      {{10 * g, 11 * g, kDev}, {20 * g, 21 * g, kDev}, {30 * g, 31 * g, kHost}});
  const AddressRangeTable b({{30 * g, 30 * g + 4096, kDev}, {31 * g, 32 * g, kHost}});
  for (int pass = 0; pass < 3; ++pass) {
    EXPECT_EQ(a.Find(30 * g + 100, 8), 2u);
    EXPECT_EQ(b.Find(30 * g + 100, 8), 0u);                        // a's index 2 is out of range
    EXPECT_EQ(b.Find(30 * g + 8192, 8), AddressRangeTable::npos);  // past b's small range
    EXPECT_EQ(a.Find(20 * g + 5, 1), 1u);
    EXPECT_EQ(b.Find(20 * g + 5, 1), AddressRangeTable::npos);  // b[1] does not hold it
    EXPECT_EQ(b.Find(31 * g, g), 1u);
    EXPECT_EQ(a.Find(31 * g, 1), AddressRangeTable::npos);  // b's guess 1 is a's [20g, 21g)
  }
}

// A whole call's pattern: each op between the pool (one host range) and one
// of many slot allocations, in any order, against a brute-force answer.
TEST(RangeLookupTest, AgreesWithABruteForceScanOverRandomCalls) {
  std::vector<AddressRange> ranges;
  ranges.push_back({1u << 30, 2u << 30, kHost});  // the pool
  for (uint64_t s = 0; s < 160; ++s) {            // slot allocations, 1 MiB apart
    ranges.push_back(
        {(8ull << 30) + s * (2u << 20), (8ull << 30) + s * (2u << 20) + (1u << 20), kDev});
  }
  const AddressRangeTable t(ranges);
  std::mt19937_64 rng(7);
  for (int call = 0; call < 50; ++call) {
    RangeLookup lookup(t);
    const bool walk = call % 2 == 0;  // slots in order, or at random
    for (int op = 0; op < 400; ++op) {
      const uint64_t slot = walk ? op % 160 : rng() % 170;  // 160..169: no such slot
      uint64_t address = (8ull << 30) + slot * (2u << 20) + rng() % (3u << 19);
      if (op % 3 == 0) address = (1u << 30) + rng() % (1u << 30) + (op % 7 == 0 ? (1u << 30) : 0);
      const uint64_t bytes = 1 + rng() % 8192;
      MemoryKind want = MemoryKind::kUnknown;
      for (const AddressRange& r : ranges) {
        if (r.Holds(address, bytes)) want = r.kind;
      }
      MemoryKind got = MemoryKind::kUnknown;
      const bool found = lookup.Find(address, bytes, &got);
      ASSERT_EQ(found, want != MemoryKind::kUnknown) << call << " " << op << " " << address;
      if (found) {
        EXPECT_EQ(got, want);
      }
    }
  }
}

TEST(RangeLookupTest, KeptRangesAnswerTheCallsLaterOps) {
  const AddressRangeTable t({{1000, 2000, kHost}});
  RangeLookup lookup(t);
  MemoryKind k = MemoryKind::kUnknown;
  EXPECT_FALSE(lookup.Find(5000, 10, &k));
  EXPECT_EQ(lookup.Keep(5000, 6000, MemoryKind::kElsewhere), MemoryKind::kElsewhere);
  EXPECT_EQ(lookup.Keep(3000, 4000, kDev), kDev);
  EXPECT_EQ(lookup.Keep(8000, 9000, kDev), kDev);
  // Pushed out of the recent answers by later lookups, still kept.
  ASSERT_TRUE(lookup.Find(1500, 10, &k));
  EXPECT_EQ(k, kHost);
  ASSERT_TRUE(lookup.Find(8500, 10, &k));
  EXPECT_EQ(k, kDev);
  ASSERT_TRUE(lookup.Find(5999, 1, &k));
  EXPECT_EQ(k, MemoryKind::kElsewhere);
  ASSERT_TRUE(lookup.Find(3000, 1000, &k));
  EXPECT_EQ(k, kDev);
  EXPECT_FALSE(lookup.Find(4000, 1, &k));
  EXPECT_FALSE(lookup.Find(5999, 2, &k));  // straddles a kept range's end
}

// Regression for the replacement of the recent answers: a Publish's ops
// alternate between a page (a different slot's mapping each op) and the pool.
// Round-robin replacement evicted the pool every other op, so half its
// lookups went to the table again (1.5 table lookups per op, measured on the
// same pattern); the pool must stay, leaving one per op, for its page.
TEST(RangeLookupTest, ThePoolStaysAmongTheRecentAnswersWhilePagesAlternate) {
  constexpr uint64_t kPool = 1ull << 40, kPoolBytes = 1ull << 30;
  constexpr uint64_t kPages = 1ull << 44, kSlotStride = 2ull << 20;
  constexpr int kSlots = 160;
  std::vector<AddressRange> ranges = {{kPool, kPool + kPoolBytes, kHost}};
  for (int s = 0; s < kSlots; ++s) {
    ranges.push_back({kPages + s * kSlotStride, kPages + s * kSlotStride + (128 << 10), kDev});
  }
  const AddressRangeTable t(std::move(ranges));
  RangeLookup lookup(t);
  MemoryKind k = MemoryKind::kUnknown;
  for (int object = 0; object < 4; ++object) {
    for (int s = 0; s < kSlots; ++s) {
      ASSERT_TRUE(lookup.Find(kPages + s * kSlotStride + 4096 * object, 4096, &k));
      EXPECT_EQ(k, kDev);
      ASSERT_TRUE(lookup.Find(kPool + (object * kSlots + s) * 4096, 4096, &k));
      EXPECT_EQ(k, kHost);
    }
  }
  // One for the pool's first op, then one per page.
  EXPECT_EQ(lookup.slow_finds(), 1u + 4 * kSlots);
}

}  // namespace
}  // namespace orbitkv::gpu
