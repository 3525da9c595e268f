// RangeAllocator (gpu_decode_lane.h): the GPU decode lane's arena ranges.
// The lane itself runs in the GPU tier's gates (tests/gpu_tier).
#include <gtest/gtest.h>

#include "manager/gpu_decode_lane.h"

namespace orbitkv {
namespace {

TEST(RangeAllocator, TakesFirstFitIn4KiBUnitsUntilFull) {
  RangeAllocator a(16384 + 100);  // the tail that is no whole unit is not used
  EXPECT_EQ(a.free_bytes(), 16384u);
  EXPECT_EQ(a.Take(1), 0u);
  EXPECT_EQ(a.Take(4097), 4096u);  // two units
  EXPECT_EQ(a.Take(4096), 12288u);
  EXPECT_FALSE(a.Take(1).has_value());
  EXPECT_EQ(a.free_bytes(), 0u);
}

TEST(RangeAllocator, GivenBackRangesCoalesceWithBothNeighbours) {
  RangeAllocator a(5 * 4096);
  const uint64_t r0 = *a.Take(4096), r1 = *a.Take(4096), r2 = *a.Take(4096);
  EXPECT_FALSE(a.Take(3 * 4096).has_value());  // only two units left
  a.Give(r0, 4096);
  a.Give(r2, 4096);
  // Free: r0 alone, r2 merged with the two-unit tail.
  EXPECT_FALSE(a.Take(4 * 4096).has_value());
  EXPECT_EQ(a.free_bytes(), 4 * 4096u);
  a.Give(r1, 4096);  // joins r0 and r2 + tail into one range
  EXPECT_EQ(a.free_bytes(), 5 * 4096u);
  EXPECT_EQ(a.Take(5 * 4096), 0u);
}

TEST(RangeAllocator, ZeroBytesIsEmpty) {
  RangeAllocator a(0);
  EXPECT_FALSE(a.Take(1).has_value());
}

}  // namespace
}  // namespace orbitkv
