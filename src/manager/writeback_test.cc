// Writeback yields the disk to restores' reads (writeback.h, --writeback-yield-ms).
#include "manager/writeback.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

#include "io/io_engine.h"
#include "orbitkv/units.h"
#include "testing/temp_dir.h"

namespace orbitkv {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class WritebackYieldTest : public ::testing::Test {
 protected:
  // A pool with an SSD store behind it and one writeback lane.
  void Start(milliseconds yield) {
    DramCacheOptions d;
    d.capacity = 16 * kMiB;
    d.lock_memory = false;
    auto pool = DramCache::Create(d);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    dram_ = std::move(pool).value();
    SsdStoreOptions s;
    s.path = dir_.path() + "/cache";
    s.capacity = 64 * kMiB;
    s.shards = 1;
    s.direct_io = false;
    auto store = SsdStore::Open(s);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ssd_ = std::move(store).value();
    codec_ = std::make_unique<CodecMetrics>(registry_);
    Writeback::Options w;
    w.dram = dram_.get();
    w.ssd = ssd_.get();
    w.lanes = &lanes_;
    auto io = CreateUringEngine({8, nullptr});
    ASSERT_TRUE(io.ok()) << io.status().ToString();
    w.engines.push_back(std::move(io).value());
    w.batch = 8;
    w.bytes = &written_;
    w.queue_full = &queue_full_;
    w.codec_metrics = codec_.get();
    w.restore_reads = &reads_;
    w.yield = yield;
    w.yield_seconds = &yields_;
    wb_ = std::make_unique<Writeback>(std::move(w));
  }
  void TearDown() override {
    if (wb_) wb_->Close();
  }
  // A sealed, writeback-pending object of 64 KiB, queued for the lane.
  void Publish(uint64_t k) {
    const ObjectId id{1, 0, Key::FromU64(k)};
    std::vector<uint8_t> bytes(64 << 10, static_cast<uint8_t>(k));
    ASSERT_TRUE(dram_->InsertSealed(id, bytes).ok());
    dram_->MarkWritebackPending(id);
    wb_->Queue(id, NamespaceCodec{});
  }
  uint64_t pending() const { return dram_->stats().writeback_pending; }
  bool WaitWritten(Clock::duration limit) {
    const auto end = Clock::now() + limit;
    while (pending() != 0 && Clock::now() < end) std::this_thread::sleep_for(milliseconds(1));
    return pending() == 0;
  }

  testing::TempDir dir_;
  MetricsRegistry registry_;
  std::unique_ptr<DramCache> dram_;
  std::unique_ptr<SsdStore> ssd_;
  std::unique_ptr<CodecMetrics> codec_;
  LaneCounter lanes_, reads_;
  Counter written_, queue_full_;
  Histogram yields_{LatencyBuckets()};
  std::unique_ptr<Writeback> wb_;
};

// A restore's reads outstanding hold the write back until they complete,
// not for the whole --writeback-yield-ms.
TEST_F(WritebackYieldTest, AWriteWaitsForRestoreReadsToFinish) {
  ASSERT_NO_FATAL_FAILURE(Start(milliseconds(5000)));
  LaneToken reading = reads_.Start();
  Publish(1);
  std::this_thread::sleep_for(milliseconds(150));
  EXPECT_EQ(pending(), 1u) << "written while a restore was reading";
  EXPECT_EQ(written_.Value(), 0u);
  const auto released = Clock::now();
  reading.Release();
  ASSERT_TRUE(WaitWritten(std::chrono::seconds(3)));
  EXPECT_LT(Clock::now() - released, std::chrono::seconds(3));
  EXPECT_EQ(written_.Value(), 64u << 10);
  EXPECT_EQ(yields_.Snap().count, 1u);
}

// Reads that never end delay each write by the yield at most, and the lane
// then writes one object at a time (so a read arriving meanwhile waits for one
// object's write, not a batch's).
TEST_F(WritebackYieldTest, EndlessReadsDelayEachWriteByTheYieldAtMost) {
  ASSERT_NO_FATAL_FAILURE(Start(milliseconds(60)));
  LaneToken reading = reads_.Start();
  const auto start = Clock::now();
  for (uint64_t k = 1; k <= 3; ++k) Publish(k);
  ASSERT_TRUE(WaitWritten(std::chrono::seconds(10)));
  EXPECT_GE(Clock::now() - start, milliseconds(120));  // at least two of the waits ran out
  EXPECT_EQ(written_.Value(), 3u * (64u << 10));
  const Histogram::Snapshot y = yields_.Snap();
  EXPECT_GE(y.count, 2u);  // one per object, unless the first batch held only one
  EXPECT_LE(y.count, 3u);
  EXPECT_GE(y.sum, 0.055 * double(y.count));
}

// A publisher waiting for pool room ends the yield: the pool's room matters
// more than a restore's disk share.
TEST_F(WritebackYieldTest, APublisherWaitingForRoomEndsTheYield) {
  ASSERT_NO_FATAL_FAILURE(Start(milliseconds(10000)));
  LaneToken reading = reads_.Start();
  Publish(1);
  std::this_thread::sleep_for(milliseconds(100));  // the lane is yielding now
  ASSERT_EQ(pending(), 1u);
  const auto start = Clock::now();
  Result<DramView> room =
      wb_->WaitForRoom(Status::ResourceExhausted("pool full"), start + std::chrono::seconds(5),
                       [&]() -> Result<DramView> {
                         if (pending() != 0) return Status::ResourceExhausted("pool full");
                         return DramView{};
                       });
  EXPECT_TRUE(room.ok()) << room.status().ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(written_.Value(), 64u << 10);
}

// --writeback-yield-ms 0: reads outstanding do not delay writes.
TEST_F(WritebackYieldTest, ZeroYieldNeverWaits) {
  ASSERT_NO_FATAL_FAILURE(Start(milliseconds(0)));
  LaneToken reading = reads_.Start();
  Publish(1);
  ASSERT_TRUE(WaitWritten(std::chrono::seconds(3)));
  EXPECT_EQ(yields_.Snap().count, 0u);
}

}  // namespace
}  // namespace orbitkv
