#include "manager/lane.h"

#include "manager/read_staging.h"
#include "orbitkv/units.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace orbitkv {
namespace {

ReadStaging MakeStaging(uint64_t capacity, uint64_t run_bytes) {
  DramCacheOptions o;
  o.capacity = capacity;
  o.lock_memory = false;
  auto pool = DramCache::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return ReadStaging(std::move(pool).value(), run_bytes);
}

// With a staging larger than a restore (--ssd-read-staging auto), one run
// held the whole restore: its copy started only after its last read.
TEST(ReadStagingTest, RunsSplitARestoreInTwoAtLeastAndFitHalfTheStaging) {
  ReadStaging staging = MakeStaging(64 * kMiB, kGiB);  // runs bounded by the staging
  using Runs = std::vector<std::pair<size_t, size_t>>;
  const std::vector<uint64_t> four(4, 2 * kMiB);  // 8 MiB: two runs of two
  EXPECT_EQ(staging.Runs(four), (Runs{{0, 2}, {2, 4}}));
  EXPECT_EQ(staging.Runs({kMiB}), (Runs{{0, 1}}));
  const std::vector<uint64_t> many(40, 2 * kMiB);  // 80 MiB: runs of at most 32 MiB
  EXPECT_EQ(staging.Runs(many), (Runs{{0, 16}, {16, 32}, {32, 40}}));
  const std::vector<uint64_t> big = {40 * kMiB, kMiB};  // an object above the cap runs alone
  EXPECT_EQ(staging.Runs(big), (Runs{{0, 1}, {1, 2}}));
}

// Runs of half a restore left half its copy after its last read: a 64 MiB
// restore of 32 blocks took 37 ms on the VM, 7.6 ms of them copying out the
// second 32 MiB run after the disk was done (0.8 ms with runs of 4 MiB).
// Runs are now at most --ssd-read-run.
TEST(ReadStagingTest, ARestoreIsReadInRunsOfAtMostTheRunSizeSoLittleCopyIsLeftAtTheEnd) {
  ReadStaging staging = MakeStaging(256 * kMiB, 8 * kMiB);
  using Runs = std::vector<std::pair<size_t, size_t>>;
  const std::vector<uint64_t> blocks(32, 2 * kMiB);  // 64 MiB: eight runs of four blocks
  Runs want;
  for (size_t i = 0; i < 32; i += 4) want.emplace_back(i, i + 4);
  EXPECT_EQ(staging.Runs(blocks), want);
  // Under the run size, still two runs of a restore of two objects or more.
  const std::vector<uint64_t> small(4, 64 * 1024);
  EXPECT_EQ(staging.Runs(small), (Runs{{0, 2}, {2, 4}}));
  // Sizes count 4 KiB aligned: four 2 MiB + 1 byte objects overflow 8 MiB.
  const std::vector<uint64_t> odd(8, 2 * kMiB + 1);
  EXPECT_EQ(staging.Runs(odd), (Runs{{0, 3}, {3, 6}, {6, 8}}));
  // An object above the run size runs alone.
  EXPECT_EQ(staging.Runs({kMiB, 20 * kMiB, kMiB}), (Runs{{0, 1}, {1, 2}, {2, 3}}));
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
