#include "store/ssd_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <gtest/gtest.h>

#include "store/object_format.h"
#include "store/store_test_util.h"

namespace orbitkv {
namespace {

using testing::AlignedBuf;
using testing::AllocAligned;
using testing::Pattern;
using testing::StoreFixture;

class SsdStoreTest : public ::testing::Test {
 protected:
  StoreFixture f;
  void SetUp() override { ASSERT_TRUE(f.Open(2, 8u << 20).ok()); }
  void ExpectIdle() {
    CatalogStats s = f.store->catalog().stats();
    EXPECT_EQ(s.writing_extents, 0u);
    EXPECT_EQ(s.active_leases, 0u);
    EXPECT_EQ(s.pinned_extents, 0u);
    EXPECT_EQ(s.pinned_bytes, 0u);
    EXPECT_EQ(f.Metric("orbitkv_ssd_read_pinned_bytes"), 0);
  }
};

TEST_F(SsdStoreTest, WritesPublishesAndReadsBackExactBytes) {
  for (size_t size : {1ul, 511ul, 4096ul, 5000ul, 65536ul, 3ul << 20}) {
    Key k = Key::FromU64(size);
    auto bytes = Pattern(size, size);
    auto ref = f.Write(k, bytes);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    EXPECT_EQ(ref->object_size, size);
    EXPECT_EQ(ref->length % 4096, 0u);
    EXPECT_EQ(f.store->catalog().Lookup(k), *ref);
    auto back = f.Read(*ref);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, bytes);
  }
  ExpectIdle();
  EXPECT_EQ(f.Metric("orbitkv_ssd_objects_written_total"), 6);
}

TEST_F(SsdStoreTest, PaddingIsZeroedOnDisk) {
  auto ref = f.Write(Key::FromU64(1), Pattern(1, 100));
  ASSERT_TRUE(ref.ok());
  auto leased = f.store->catalog().AcquireLease({&*ref, 1}, {});
  ASSERT_TRUE(leased.ok());
  AlignedBuf buf = AllocAligned(ref->length);
  LeaseId lease = *leased;
  ASSERT_TRUE(f.store->catalog().Submit(lease).ok());
  ExtentRead r{*ref, buf.get(), {}};
  ASSERT_TRUE(f.store->ReadExtents(*f.io, {&r, 1}).ok());
  f.store->catalog().Complete(lease);
  for (size_t i = 100; i < ref->length; ++i) ASSERT_EQ(buf[i], 0) << i;
}

TEST_F(SsdStoreTest, ObjectInvisibleUntilEveryChunkIsWritten) {
  const size_t size = 3 * 4096;
  Key k = Key::FromU64(7);
  auto bytes = Pattern(7, size);
  AlignedBuf buf = AllocAligned(size);
  std::memcpy(buf.get(), bytes.data(), size);
  auto ref = f.store->Reserve(k, size);
  ASSERT_TRUE(ref.ok());
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_FALSE(f.store->catalog().Lookup(k).has_value()) << "visible after chunk " << c;
    EXPECT_FALSE(f.store->catalog().AcquireLease({&*ref, 1}, {}).ok());
    ASSERT_TRUE(f.store->WriteChunk(*f.io, *ref, c * 4096, buf.get() + c * 4096, 4096).ok());
  }
  EXPECT_FALSE(f.store->catalog().Lookup(k).has_value());
  ASSERT_TRUE(f.store->Publish(*ref).ok());
  EXPECT_EQ(f.store->catalog().Lookup(k), *ref);
  EXPECT_EQ(*f.Read(*ref), bytes);
}

TEST_F(SsdStoreTest, FailedAndShortWritesAbortOnlyTheirObject) {
  auto good = f.Write(Key::FromU64(1), Pattern(1, 20000));
  ASSERT_TRUE(good.ok());
  // EIO on the next write completion.
  f.faults.AddRule({IoOp::kWrite, 1, ScriptedIoFaults::Fault::kError, EIO});
  auto bad = f.Write(Key::FromU64(2), Pattern(2, 20000));
  EXPECT_EQ(bad.status().code(), StatusCode::kIOError);
  EXPECT_NE(bad.status().message().find("cache.bin"), std::string::npos) << bad.status().ToString();
  // A write that stops making progress (0 bytes) fails as short.
  f.faults.AddRule({IoOp::kWrite, 1, ScriptedIoFaults::Fault::kZero});
  auto zero = f.Write(Key::FromU64(3), Pattern(3, 20000));
  EXPECT_FALSE(zero.ok());
  // A short completion is continued by the engine and the object lands intact.
  f.faults.AddRule({IoOp::kWrite, 1, ScriptedIoFaults::Fault::kShort});
  auto shortened = f.Write(Key::FromU64(4), Pattern(4, 20000));
  ASSERT_TRUE(shortened.ok()) << shortened.status().ToString();
  EXPECT_EQ(*f.Read(*shortened), Pattern(4, 20000));

  EXPECT_FALSE(f.store->catalog().Lookup(Key::FromU64(2)).has_value());
  EXPECT_FALSE(f.store->catalog().Lookup(Key::FromU64(3)).has_value());
  EXPECT_EQ(*f.Read(*good), Pattern(1, 20000));
  EXPECT_EQ(f.Metric("orbitkv_ssd_write_drops_total", {{"reason", "io_error"}}), 2);
  EXPECT_EQ(f.Metric("orbitkv_ssd_uring_write_failures_total"), 2);
  ExpectIdle();
}

TEST_F(SsdStoreTest, NoSpaceDropsTheWriteAndKeepsRunning) {
  f.faults.AddRule({IoOp::kWrite, 1, ScriptedIoFaults::Fault::kError, ENOSPC, /*every=*/true});
  for (int i = 0; i < 5; ++i) {
    auto r = f.Write(Key::FromU64(i), Pattern(i, 9000));
    EXPECT_TRUE(r.status().IsNoSpace()) << r.status().ToString();
  }
  EXPECT_EQ(f.Metric("orbitkv_ssd_write_drops_total", {{"reason", "nospace"}}), 5);
  f.faults.Clear();
  auto r = f.Write(Key::FromU64(9), Pattern(9, 9000));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*f.Read(*r), Pattern(9, 9000));
  ExpectIdle();
}

TEST_F(SsdStoreTest, NoSpaceDropsAreLoggedAtMostOncePerIntervalWithTheirCount) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(sink);
  auto lines = [&] {
    int n = 0;
    std::string last;
    for (const std::string& l : sink->last_formatted()) {
      if (l.find("SSD writes dropped (reason nospace)") == std::string::npos) continue;
      ++n;
      last = l;
    }
    return std::make_pair(n, last);
  };
  f.faults.AddRule({IoOp::kWrite, 1, ScriptedIoFaults::Fault::kError, ENOSPC, /*every=*/true});
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(f.Write(Key::FromU64(i), Pattern(i, 9000)).status().IsNoSpace());
  auto [first, first_line] = lines();
  EXPECT_EQ(first, 1) << "the first drop is reported, the next four wait for the interval";
  EXPECT_NE(first_line.find("1 since the last report"), std::string::npos) << first_line;
  EXPECT_NE(first_line.find("--ssd-cache-capacity"), std::string::npos) << first_line;
  f.clock.Advance(SsdStore::kDropLogInterval);
  EXPECT_TRUE(f.Write(Key::FromU64(7), Pattern(7, 9000)).status().IsNoSpace());
  auto [second, second_line] = lines();
  EXPECT_EQ(second, 2);
  EXPECT_NE(second_line.find("5 since the last report"), std::string::npos) << second_line;
  EXPECT_EQ(f.Metric("orbitkv_ssd_write_drops_total", {{"reason", "nospace"}}), 6);
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::find(sinks.begin(), sinks.end(), sink));
  f.faults.Clear();
  ExpectIdle();
}

TEST(SsdStore, LeasedExtentsAreNeverOverwrittenAndBlockedWritesAreCounted) {
  StoreFixture f;
  ASSERT_TRUE(f.Open(2, 2 * 64 * 1024).ok());  // two 64 KiB shards
  std::vector<ExtentRef> refs;
  for (int i = 0; i < 4; ++i) {  // two 32 KiB objects per shard: both shards full
    auto r = f.Write(Key::FromU64(i), Pattern(i, 32 * 1024));
    ASSERT_TRUE(r.ok());
    refs.push_back(*r);
  }
  // Pin the ring head of both shards (the oldest extent of each).
  auto lease0 = f.store->catalog().AcquireLease({&refs[0], 1}, {});
  auto lease1 = f.store->catalog().AcquireLease({&refs[1], 1}, {});
  ASSERT_TRUE(lease0.ok() && lease1.ok());
  auto blocked = f.Write(Key::FromU64(10), Pattern(10, 32 * 1024));
  EXPECT_TRUE(blocked.status().IsBusy()) << blocked.status().ToString();
  EXPECT_EQ(f.Metric("orbitkv_ssd_pinned_write_skips_total"), 1);
  EXPECT_EQ(f.Metric("orbitkv_ssd_write_drops_total", {{"reason", "pinned"}}), 1);
  EXPECT_EQ(f.Metric("orbitkv_ssd_read_pinned_bytes"), 64 * 1024);
  EXPECT_EQ(*f.Read(refs[0]), Pattern(0, 32 * 1024));  // still intact

  // Releasing one shard's pin lets the next write overwrite there (and only there).
  f.store->catalog().Cancel(*lease1);
  auto next = f.Write(Key::FromU64(11), Pattern(11, 32 * 1024));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->shard, refs[1].shard);
  EXPECT_FALSE(f.store->catalog().IsCurrent(refs[1]));
  EXPECT_FALSE(f.store->catalog().Lookup(Key::FromU64(1)).has_value());
  EXPECT_TRUE(f.store->catalog().AcquireLease({&refs[1], 1}, {}).status().IsNotFound());
  EXPECT_EQ(*f.Read(refs[0]), Pattern(0, 32 * 1024));
  f.store->catalog().Cancel(*lease0);
  EXPECT_EQ(f.Metric("orbitkv_ssd_read_pinned_bytes"), 0);
}

// The transfer-shape rules on the io_uring route: adjacent extents in one file
// read together, different files and gaps stay separate.
TEST(SsdStore, AdjacentExtentsAreReadWithOneRead) {
  struct Case {
    uint32_t shards;
    std::vector<int> pick;
    double ops;
    double bytes;
  };
  for (const Case& c : {Case{1, {0, 1, 2, 3}, 1, 256 * 1024}, Case{2, {0, 1, 2, 3}, 2, 256 * 1024},
                        Case{1, {0, 2}, 2, 128 * 1024}}) {
    StoreFixture f;
    ASSERT_TRUE(f.Open(c.shards, c.shards * (1u << 20)).ok());
    std::vector<ExtentRef> refs;
    for (int i = 0; i < 4; ++i) refs.push_back(*f.Write(Key::FromU64(i), Pattern(i, 64 * 1024)));
    std::vector<ExtentRef> picked;
    for (int i : c.pick) picked.push_back(refs[i]);
    auto lease = f.store->catalog().AcquireLease(picked, {});
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(f.store->catalog().Submit(*lease).ok());
    std::vector<AlignedBuf> bufs;
    std::vector<ExtentRead> reads;
    for (const ExtentRef& r : picked) {
      bufs.push_back(AllocAligned(r.length));
      reads.push_back({r, bufs.back().get(), {}});
    }
    const double ops0 = f.Metric("orbitkv_ssd_uring_read_ops_total");
    const double bytes0 = f.Metric("orbitkv_ssd_uring_read_bytes_total");
    ASSERT_TRUE(f.store->ReadExtents(*f.io, reads).ok());
    f.store->catalog().Complete(*lease);
    EXPECT_EQ(f.Metric("orbitkv_ssd_uring_read_ops_total") - ops0, c.ops);
    EXPECT_EQ(f.Metric("orbitkv_ssd_uring_read_bytes_total") - bytes0, c.bytes);
    for (size_t i = 0; i < picked.size(); ++i) {
      auto want = Pattern(c.pick[i], 64 * 1024);
      ASSERT_EQ(0, std::memcmp(bufs[i].get(), want.data(), want.size())) << i;
    }
  }
}

TEST_F(SsdStoreTest, ReadFailureIsPerExtentAndNamesTheFile) {
  auto a = *f.Write(Key::FromU64(1), Pattern(1, 8192));
  auto b = *f.Write(Key::FromU64(2), Pattern(2, 8192));  // other shard
  f.faults.AddRule({IoOp::kRead, 1, ScriptedIoFaults::Fault::kError, EIO});
  std::vector<ExtentRef> refs{a, b};
  LeaseId lease = *f.store->catalog().AcquireLease(refs, {});
  ASSERT_TRUE(f.store->catalog().Submit(lease).ok());
  AlignedBuf ba = AllocAligned(a.length), bb = AllocAligned(b.length);
  std::vector<ExtentRead> reads{{a, ba.get(), {}}, {b, bb.get(), {}}};
  Status st = f.store->ReadExtents(*f.io, reads);
  f.store->catalog().Complete(lease);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cache.bin"), std::string::npos) << st.ToString();
  EXPECT_NE(reads[0].status.ok(), reads[1].status.ok());  // exactly one failed
  EXPECT_EQ(f.Metric("orbitkv_ssd_uring_read_failures_total"), 1);
  ExpectIdle();
  // The engine keeps working after the failure.
  EXPECT_EQ(*f.Read(a), Pattern(1, 8192));
}

TEST_F(SsdStoreTest, LargeExtentsAreSplitAtTheReadCap) {
  StoreFixture g;
  ASSERT_TRUE(g.Open(1, 32u << 20, 8, 1u << 20).ok());
  auto ref = g.Write(Key::FromU64(5), Pattern(5, (5u << 20) + 123));
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(*g.Read(*ref), Pattern(5, (5u << 20) + 123));
  EXPECT_EQ(g.Metric("orbitkv_ssd_uring_read_ops_total"), 6);
}

TEST_F(SsdStoreTest, RejectsBadArguments) {
  AlignedBuf buf = AllocAligned(4096);
  EXPECT_FALSE(f.store->WriteObject(*f.io, Key::FromU64(1), buf.get() + 1, 10).ok());
  EXPECT_FALSE(f.store->WriteObject(*f.io, Key::FromU64(1), buf.get(), 0).ok());
  EXPECT_FALSE(f.store->WriteObject(*f.io, Key::FromU64(1), buf.get(), 1ull << 40).ok());
  ExtentRef bogus{7, 0, 4096, 4096, 1};
  ExtentRead r{bogus, buf.get(), {}};
  EXPECT_EQ(f.store->ReadExtents(*f.io, {&r, 1}).code(), StatusCode::kInvalidArgument);
  ExpectIdle();
}

TEST(SsdStore, ConcurrentWorkersEachWithTheirOwnRing) {
  StoreFixture f;
  ASSERT_TRUE(f.Open(4, 4u << 20).ok());
  std::vector<std::thread> threads;
  std::atomic<int> verified{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto io = CreateUringEngine({8, nullptr});
      ASSERT_TRUE(io.ok());
      for (int i = 0; i < 60; ++i) {
        const uint64_t id = t * 1000 + i;
        auto bytes = Pattern(id, 1000 + (id * 7919) % 60000);
        AlignedBuf buf = AllocAligned(bytes.size());
        std::memcpy(buf.get(), bytes.data(), bytes.size());
        auto ref = f.store->WriteObject(**io, Key::FromU64(id), buf.get(), bytes.size());
        if (!ref.ok()) continue;  // pinned by another thread's lease: a counted drop
        auto lease = f.store->catalog().AcquireLease({&*ref, 1}, {});
        if (!lease.ok()) continue;  // already overwritten by the ring
        ASSERT_TRUE(f.store->catalog().Submit(*lease).ok());
        AlignedBuf out = AllocAligned(ref->length);
        ExtentRead r{*ref, out.get(), {}};
        ASSERT_TRUE(f.store->ReadExtents(**io, {&r, 1}).ok());
        f.store->catalog().Complete(*lease);
        ASSERT_EQ(0, std::memcmp(out.get(), bytes.data(), bytes.size()));
        verified++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(verified.load(), 100);
  EXPECT_EQ(f.store->catalog().stats().pinned_extents, 0u);
}

}  // namespace
}  // namespace orbitkv

namespace orbitkv {
namespace {

// Regression: a restore that names one extent twice (two queries of the same
// key) left the second buffer unfilled when both landed in one vectored read.
TEST(SsdStore, TheSameExtentNamedTwiceFillsBothBuffers) {
  testing::StoreFixture f;
  ASSERT_TRUE(f.Open(1, 1u << 20).ok());
  auto a = *f.Write(Key::FromU64(1), testing::Pattern(1, 8192));
  auto b = *f.Write(Key::FromU64(2), testing::Pattern(2, 8192));
  std::vector<ExtentRef> refs{a, b, a};
  LeaseId lease = *f.store->catalog().AcquireLease(refs, {});
  ASSERT_TRUE(f.store->catalog().Submit(lease).ok());
  std::vector<testing::AlignedBuf> bufs;
  std::vector<ExtentRead> reads;
  for (const ExtentRef& r : refs) {
    bufs.push_back(testing::AllocAligned(r.length));
    reads.push_back({r, bufs.back().get(), {}});
  }
  ASSERT_TRUE(f.store->ReadExtents(*f.io, reads).ok());
  f.store->catalog().Complete(lease);
  EXPECT_EQ(f.Metric("orbitkv_ssd_uring_read_ops_total"), 1);
  for (int i : {0, 2})
    EXPECT_EQ(0, std::memcmp(bufs[i].get(), testing::Pattern(1, 8192).data(), 8192));
  EXPECT_EQ(0, std::memcmp(bufs[1].get(), testing::Pattern(2, 8192).data(), 8192));
}

// A bad read among good ones fails every read. Before, ReadExtents returned
// at the bad read and left the reads before and after it OK with nothing
// read, and its caller, which takes each read's status as the verdict on its
// buffer, checked unread staging and dropped a healthy object as damaged.
TEST(SsdStore, ABadReadLeavesNoReadOkWithNothingRead) {
  testing::StoreFixture f;
  ASSERT_TRUE(f.Open(1, 1u << 20).ok());
  auto a = *f.Write(Key::FromU64(1), testing::Pattern(1, 8192));
  auto b = *f.Write(Key::FromU64(2), testing::Pattern(2, 8192));
  LeaseId lease = *f.store->catalog().AcquireLease(std::vector<ExtentRef>{a, b}, {});
  ASSERT_TRUE(f.store->catalog().Submit(lease).ok());
  const ExtentRef outside{7, 0, 4096, 4096, 1};  // a shard the store does not have
  ExtentRef longer = b;                          // b's extent named with another length
  longer.length += 4096;
  for (const ExtentRef& bad : {outside, longer}) {
    std::vector<ExtentRef> refs{a, b, bad, a};
    std::vector<testing::AlignedBuf> bufs;
    std::vector<ExtentRead> reads;
    for (const ExtentRef& r : refs) {
      bufs.push_back(testing::AllocAligned(r.length));
      reads.push_back({r, bufs.back().get(), {}});
    }
    const double ops = f.Metric("orbitkv_ssd_uring_read_ops_total");
    EXPECT_EQ(f.store->ReadExtents(*f.io, reads).code(), StatusCode::kInvalidArgument);
    for (size_t i = 0; i < reads.size(); ++i) {
      EXPECT_EQ(reads[i].status.code(), StatusCode::kInvalidArgument) << i;
    }
    EXPECT_EQ(f.Metric("orbitkv_ssd_uring_read_ops_total"), ops);  // nothing read
  }
  f.store->catalog().Complete(lease);
}

// A read that finds an object damaged drops it from the store. Before, the
// damaged extent stayed its key's current one, so a publish of the key was
// skipped as "already present" and the key was never cached again.
TEST_F(SsdStoreTest, CorruptObjectFoundByAReadIsDroppedAndItsKeyCanBeStoredAgain) {
  const ObjectId id{7, 0, Key::FromU64(42)};
  const std::vector<uint64_t> slots{8192, 3000};
  std::vector<uint8_t> obj = Pattern(42, ObjectSize(slots));
  WriteObjectHeader(id, slots, ObjectCodec{}, SegmentCrcs(obj, slots), obj);
  auto ref = f.Write(StoreKey(id), obj);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  {  // a flipped payload byte on the medium
    const std::string& path = f.store->shards().path(ref->shard);
    const off_t at =
        static_cast<off_t>(ShardSet::FileOffset(ref->offset) + ObjectHeaderSize(2) + 99);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path;
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    ::close(fd);
  }
  auto verify = [&](const ExtentRef& r) -> Status {
    ORBITKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, f.Read(r));
    ORBITKV_ASSIGN_OR_RETURN(ParsedHeader h, ParseObjectHeader(bytes, r.object_size));
    ORBITKV_RETURN_IF_ERROR(CheckObjectMatches(h, id, slots));
    return VerifyObjectPayload(h, bytes);
  };
  const Status damaged = verify(*ref);
  ASSERT_EQ(damaged.code(), StatusCode::kCorruption) << damaged.ToString();

  // Another failure (the read's own I/O error) drops nothing.
  EXPECT_FALSE(f.store->DropIfCorrupt(*ref, id, Status::IOError("read failed", EIO)));
  EXPECT_TRUE(f.store->catalog().Lookup(StoreKey(id)).has_value());
  EXPECT_TRUE(f.store->DropIfCorrupt(*ref, id, damaged));
  EXPECT_FALSE(f.store->catalog().Lookup(StoreKey(id)).has_value());
  EXPECT_FALSE(f.store->catalog().IsCurrent(*ref));
  EXPECT_FALSE(f.store->DropIfCorrupt(*ref, id, damaged)) << "counted once per object";
  EXPECT_EQ(f.Metric("orbitkv_ssd_corrupt_objects_dropped_total"), 1);
  EXPECT_EQ(f.Metric("orbitkv_ssd_objects"), 0);

  // The key is stored again, and reads back whole.
  auto again = f.Write(StoreKey(id), obj);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(f.store->catalog().Lookup(StoreKey(id)), *again);
  EXPECT_TRUE(verify(*again).ok()) << verify(*again).ToString();
  EXPECT_EQ(*f.Read(*again), obj);
  ExpectIdle();
}

}  // namespace
}  // namespace orbitkv
