#include "manager/lane.h"

#include "manager/read_staging.h"
#include "orbitkv/units.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace orbitkv {
namespace {

// With a staging larger than a restore (--ssd-read-staging auto), one run
// held the whole restore: its copy started only after its last read.
TEST(ReadStagingTest, RunsSplitARestoreInTwoAtLeastAndFitHalfTheStaging) {
  DramCacheOptions o;
  o.capacity = 64 * kMiB;
  o.lock_memory = false;
  auto pool = DramCache::Create(o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  ReadStaging staging(std::move(pool).value());
  using Runs = std::vector<std::pair<size_t, size_t>>;
  const std::vector<uint64_t> four(4, 2 * kMiB);  // 8 MiB: two runs of two
  EXPECT_EQ(staging.Runs(four), (Runs{{0, 2}, {2, 4}}));
  EXPECT_EQ(staging.Runs({kMiB}), (Runs{{0, 1}}));
  const std::vector<uint64_t> many(40, 2 * kMiB);  // 80 MiB: runs of at most 32 MiB
  EXPECT_EQ(staging.Runs(many), (Runs{{0, 16}, {16, 32}, {32, 40}}));
  const std::vector<uint64_t> big = {40 * kMiB, kMiB};  // an object above the cap runs alone
  EXPECT_EQ(staging.Runs(big), (Runs{{0, 1}, {1, 2}}));
}

TEST(LaneTokenTest, MovedTokensEndTheirWorkExactlyOnce) {
  LaneCounter lanes;
  LaneToken a = lanes.Start();
  LaneToken b = std::move(a);  // a holds nothing now
  EXPECT_FALSE(a.held());
  EXPECT_TRUE(b.held());
  EXPECT_EQ(lanes.outstanding(), 1);
  a.Release();  // no work of its own: nothing ends
  EXPECT_EQ(lanes.outstanding(), 1);
  LaneToken c = lanes.Start();
  b = std::move(c);  // b's first unit ends, c's moves in
  EXPECT_EQ(lanes.outstanding(), 1);
  b.Release();
  b.Release();  // idempotent
  EXPECT_EQ(lanes.outstanding(), 0);
}

TEST(LaneTokenTest, DrainWaitsForATokenReleasedOnAnotherThread) {
  LaneCounter lanes;
  LaneToken t = lanes.Start();
  auto drained = std::async(std::launch::async, [&] { lanes.Drain(); });
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  std::thread([t = std::move(t)]() mutable { t.Release(); }).join();
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(5)), std::future_status::ready);
}

}  // namespace
}  // namespace orbitkv
