#include "manager/lane.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace orbitkv {
namespace {

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
