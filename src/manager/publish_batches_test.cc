#include "manager/publish_batches.h"

#include <gtest/gtest.h>

#include <vector>

namespace orbitkv {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// The batches a call of `objects` objects of `object` bytes makes, as
// Publish closes them (a batch closes once it reaches its target).
std::vector<uint64_t> Batches(uint64_t objects, uint64_t object, uint64_t cap) {
  std::vector<uint64_t> out;
  uint64_t batch = 0;
  for (uint64_t i = 0; i < objects; ++i) {
    batch += object;
    const uint64_t remaining = batch + (objects - i - 1) * object;
    if (batch >= PublishBatchTarget(remaining, cap)) {
      out.push_back(batch / object);
      batch = 0;
    }
  }
  if (batch) out.push_back(batch / object);
  return out;
}

TEST(PublishBatchTarget, FullBatchesUntilTheEndThenHalves) {
  // 32 blocks of an 8B model (2 MiB each): 64 MiB under the 16 MiB cap.
  EXPECT_EQ(Batches(32, 2 * kMiB, 16 * kMiB), (std::vector<uint64_t>{8, 8, 8, 4, 2, 1, 1}));
  EXPECT_EQ(Batches(40, kMiB, 16 * kMiB), (std::vector<uint64_t>{16, 12, 6, 3, 2, 1}));
}

TEST(PublishBatchTarget, NeverOverTheCapNorUnderAnEighthOfIt) {
  for (uint64_t remaining :
       {uint64_t{0}, uint64_t{1}, kMiB, 5 * kMiB, 31 * kMiB, uint64_t{1} << 40}) {
    const uint64_t t = PublishBatchTarget(remaining, 16 * kMiB);
    EXPECT_LE(t, 16 * kMiB);
    EXPECT_GE(t, 2 * kMiB);
  }
}

TEST(PublishBatchTarget, ObjectsLargerThanTheCapAreOnePerBatch) {
  EXPECT_EQ(Batches(3, 32 * kMiB, 16 * kMiB), (std::vector<uint64_t>{1, 1, 1}));
}

TEST(PublishBatchTarget, EveryObjectInExactlyOneBatch) {
  for (uint64_t n : {1u, 2u, 7u, 33u, 500u}) {
    for (uint64_t obj : {uint64_t{4096}, 640 * uint64_t{1024}, 2 * kMiB}) {
      uint64_t sum = 0;
      for (uint64_t b : Batches(n, obj, 16 * kMiB)) sum += b;
      EXPECT_EQ(sum, n) << n << " objects of " << obj;
    }
  }
}

}  // namespace
}  // namespace orbitkv
