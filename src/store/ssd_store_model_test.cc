// Randomised model test of the SSD store over real files and io_uring: random
// publish / lease / read / wrap / cancel / expire sequences with injected I/O
// faults, checked against a reference that knows which bytes every generation
// holds. Every read returns exactly the published bytes of its generation or
// fails cleanly; leases and reservations all return to zero.
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "store/store_test_util.h"

namespace orbitkv {
namespace {

using testing::AlignedBuf;
using testing::AllocAligned;
using testing::Pattern;
using testing::StoreFixture;

struct Held {
  LeaseId lease;
  std::vector<ExtentRef> refs;
  bool submitted;
};

void RunModel(uint64_t seed, int steps) {
  StoreFixture f;
  ASSERT_TRUE(f.Open(3, 3 * 256 * 1024, 8, 64 * 1024, 16 * 1024).ok());
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return rng() % n; };
  // generation -> pattern seed and size of the bytes written under it.
  std::map<uint64_t, std::pair<uint64_t, size_t>> written;
  std::map<uint64_t, uint64_t> version;  // key -> last version written
  std::vector<Held> held;
  uint64_t reads_ok = 0, misses = 0, read_faults = 0;

  for (int step = 0; step < steps; ++step) {
    const uint64_t op = pick(100);
    if (op < 40) {  // publish
      const uint64_t key = pick(40);
      const uint64_t ver = ++version[key];
      const size_t size = 1 + pick(50000);
      if (pick(10) == 0) {
        static const ScriptedIoFaults::Fault kinds[] = {ScriptedIoFaults::Fault::kError,
                                                        ScriptedIoFaults::Fault::kShort,
                                                        ScriptedIoFaults::Fault::kZero};
        f.faults.AddRule({IoOp::kWrite, 1 + pick(3), kinds[pick(3)], pick(2) ? EIO : ENOSPC});
      }
      auto ref = f.Write(Key::FromU64(key), Pattern(key * 1000003 + ver, size));
      if (ref.ok()) {
        written[ref->generation] = {key * 1000003 + ver, size};
        // Just published: the directory must say so.
        ASSERT_EQ(f.store->catalog().Lookup(Key::FromU64(key)), *ref);
      } else {
        ASSERT_TRUE(ref.status().IsBusy() || ref.status().IsNoSpace() ||
                    ref.status().code() == StatusCode::kIOError)
            << ref.status().ToString();
      }
      f.faults.Clear();
    } else if (op < 60) {  // lease a few keys
      std::vector<ExtentRef> refs;
      for (int i = 0, n = 1 + pick(4); i < n; ++i) {
        if (auto r = f.store->catalog().Lookup(Key::FromU64(pick(40)))) refs.push_back(*r);
      }
      if (refs.empty()) {
        misses++;
        continue;
      }
      LeaseSpec spec;
      spec.deadline = f.clock.Now() + std::chrono::milliseconds(1 + pick(50));
      auto lease = f.store->catalog().AcquireLease(refs, spec);
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();  // refs came from Lookup just now
      held.push_back({*lease, refs, false});
    } else if (op < 80 && !held.empty()) {  // read under a lease
      const size_t i = pick(held.size());
      Held h = held[i];
      held.erase(held.begin() + i);
      if (!f.store->catalog().Submit(h.lease).ok()) {
        misses++;  // expired before submission: nothing may be read
        continue;
      }
      if (pick(8) == 0) f.faults.AddRule({IoOp::kRead, 1, ScriptedIoFaults::Fault::kError, EIO});
      if (pick(8) == 0) f.faults.AddRule({IoOp::kRead, 1, ScriptedIoFaults::Fault::kShort});
      std::vector<AlignedBuf> bufs;
      std::vector<ExtentRead> reads;
      for (const ExtentRef& r : h.refs) {
        bufs.push_back(AllocAligned(r.length));
        reads.push_back({r, bufs.back().get(), {}});
      }
      f.store->ReadExtents(*f.io, reads).IgnoreError("checked per extent below");
      f.faults.Clear();
      for (size_t j = 0; j < reads.size(); ++j) {
        if (!reads[j].status.ok()) {
          read_faults++;
          continue;
        }
        auto it = written.find(reads[j].ref.generation);
        ASSERT_NE(it, written.end());
        auto want = Pattern(it->second.first, it->second.second);
        ASSERT_EQ(reads[j].ref.object_size, want.size());
        ASSERT_EQ(0, std::memcmp(bufs[j].get(), want.data(), want.size()))
            << "seed " << seed << " step " << step << " generation " << reads[j].ref.generation;
        reads_ok++;
      }
      f.store->catalog().Complete(h.lease);
    } else if (op < 88 && !held.empty()) {  // cancel
      const size_t i = pick(held.size());
      f.store->catalog().Cancel(held[i].lease);
      held.erase(held.begin() + i);
    } else if (op < 96) {  // time passes; pending interests expire
      f.clock.Advance(std::chrono::milliseconds(pick(30)));
      f.store->catalog().ExpireLeases();
    } else {  // a reservation abandoned mid-way by a writer
      auto ref = f.store->Reserve(Key::FromU64(pick(40)), 1 + pick(20000));
      if (ref.ok()) {
        ASSERT_FALSE(f.store->catalog().IsCurrent(*ref));
        f.store->Abort(*ref, Status::Cancelled("model"));
      }
    }
    // Invariant: every leased extent is still intact (pinned against the ring).
    for (const Held& h : held) {
      if (f.store->catalog().LeaseExtents(h.lease).empty()) continue;  // expired
      for (const ExtentRef& r : h.refs) ASSERT_TRUE(f.store->catalog().IsCurrent(r));
    }
  }
  for (const Held& h : held) f.store->catalog().Cancel(h.lease);
  CatalogStats s = f.store->catalog().stats();
  EXPECT_EQ(s.active_leases, 0u);
  EXPECT_EQ(s.pending_interests + s.submitted_interests, 0u);
  EXPECT_EQ(s.pinned_extents, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(s.writing_extents, 0u);
  EXPECT_GT(reads_ok, 50u) << "seed " << seed << " misses " << misses << " faults " << read_faults;
  EXPECT_GT(s.evictions, 0u);  // the ring wrapped
}

TEST(SsdStoreModel, RandomSequencesMatchTheReference) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    RunModel(seed, 1500);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace orbitkv
