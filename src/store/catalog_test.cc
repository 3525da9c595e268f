// Unit tests for SsdCatalog: one test per rule of the contract in catalog.h.
#include "store/catalog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace orbitkv {
namespace {

using std::chrono::milliseconds;

Key K(uint64_t v) { return Key::FromU64(v); }

class CatalogTest : public ::testing::Test {
 protected:
  // Builds a catalog of `shards` shards of `blocks` 4 KiB blocks each.
  std::unique_ptr<SsdCatalog> Make(uint32_t shards, uint64_t blocks) {
    CatalogOptions o;
    o.shards = shards;
    o.shard_capacity = blocks * kExtentAlign;
    o.clock = &clock_;
    auto r = SsdCatalog::Create(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }

  // Reserves and publishes; fails the test on error.
  static ExtentRef Put(SsdCatalog& c, uint64_t key, uint64_t size) {
    auto r = c.Reserve(K(key), size);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(c.Publish(*r).ok());
    return *r;
  }

  static LeaseId Lease(SsdCatalog& c, std::vector<ExtentRef> refs, uint32_t interests = 1,
                       SessionId session = 1, Clock::TimePoint deadline = {}) {
    auto r = c.AcquireLease(refs, LeaseSpec{session, interests, deadline});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.value_or(0);
  }

  ManualClock clock_;
};

TEST_F(CatalogTest, CreateRejectsBadOptions) {
  CatalogOptions o;
  o.shard_capacity = 0;
  EXPECT_EQ(SsdCatalog::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.shard_capacity = 4096 + 512;
  EXPECT_EQ(SsdCatalog::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.shard_capacity = 4096;
  o.shards = 0;
  EXPECT_EQ(SsdCatalog::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.shards = 1;
  o.clock = nullptr;
  EXPECT_EQ(SsdCatalog::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.clock = &clock_;
  auto c = SsdCatalog::Create(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->options().shards, 1u);
  EXPECT_EQ((*c)->options().shard_capacity, 4096u);
  EXPECT_EQ((*c)->options().clock, &clock_);
}

TEST_F(CatalogTest, ReserveAlignsAndStampsIncreasingGenerations) {
  auto c = Make(1, 16);
  auto a = c->Reserve(K(1), 1);
  auto b = c->Reserve(K(2), 4096);
  auto d = c->Reserve(K(3), 4097);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  EXPECT_EQ(*a, (ExtentRef{0, 0, 4096, 1, 1}));
  EXPECT_EQ(*b, (ExtentRef{0, 4096, 4096, 4096, 2}));
  EXPECT_EQ(*d, (ExtentRef{0, 8192, 8192, 4097, 3}));
  auto st = c->stats();
  EXPECT_EQ(st.reservations, 3u);
  EXPECT_EQ(st.writing_extents, 3u);
  EXPECT_EQ(st.writing_bytes, 16384u);
}

TEST_F(CatalogTest, ReserveRoundRobinsOverShards) {
  auto c = Make(3, 4);
  std::vector<uint32_t> shards;
  for (int i = 0; i < 6; ++i) shards.push_back(c->Reserve(K(i), 100)->shard);
  EXPECT_EQ(shards, (std::vector<uint32_t>{0, 1, 2, 0, 1, 2}));
}

TEST_F(CatalogTest, ReserveRejectsZeroAndOversize) {
  auto c = Make(2, 4);
  EXPECT_EQ(c->Reserve(K(1), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Reserve(K(1), 4 * 4096 + 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Reserve(K(1), std::numeric_limits<uint64_t>::max()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->stats().reservations, 0u);
  // A rejected call consumes no generation; a whole-shard object fits.
  auto r = c->Reserve(K(1), 4 * 4096);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generation, 1u);
  EXPECT_EQ(r->length, 4 * 4096u);
}

TEST_F(CatalogTest, UnpublishedExtentIsInvisible) {
  auto c = Make(1, 4);
  auto r = c->Reserve(K(7), 5000);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(c->Lookup(K(7)).has_value());
  EXPECT_FALSE(c->IsCurrent(*r));
  EXPECT_EQ(c->AcquireLease({&*r, 1}, LeaseSpec{}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->stats().published_objects, 0u);
}

TEST_F(CatalogTest, PublishMakesObjectVisibleAtOnce) {
  auto c = Make(1, 4);
  auto r = c->Reserve(K(7), 5000);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(c->Publish(*r).ok());
  EXPECT_EQ(c->Lookup(K(7)), *r);
  EXPECT_TRUE(c->IsCurrent(*r));
  auto st = c->stats();
  EXPECT_EQ(st.published_objects, 1u);
  EXPECT_EQ(st.published_bytes, 8192u);
  EXPECT_EQ(st.writing_extents, 0u);
  EXPECT_EQ(st.writing_bytes, 0u);
  EXPECT_EQ(st.publishes, 1u);
}

TEST_F(CatalogTest, PublishRejectsRefsThatAreNotOpenReservations) {
  auto c = Make(1, 8);
  auto r = c->Reserve(K(1), 100);
  ASSERT_TRUE(r.ok());
  ExtentRef wrong_gen = *r;
  ++wrong_gen.generation;
  EXPECT_EQ(c->Publish(wrong_gen).code(), StatusCode::kFailedPrecondition);
  ExtentRef wrong_shard = *r;
  wrong_shard.shard = 5;
  EXPECT_EQ(c->Publish(wrong_shard).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->Publish(*r).ok());
  EXPECT_EQ(c->Publish(*r).code(), StatusCode::kFailedPrecondition);  // twice
  auto aborted = c->Reserve(K(2), 100);
  ASSERT_TRUE(aborted.ok());
  c->Abort(*aborted);
  EXPECT_EQ(c->Publish(*aborted).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(c->Lookup(K(2)).has_value());
  EXPECT_EQ(c->stats().publishes, 1u);
}

TEST_F(CatalogTest, AbortLeavesOtherObjectsValid) {
  auto c = Make(1, 8);
  ExtentRef a = Put(*c, 1, 4096);
  auto b = c->Reserve(K(2), 4096);
  ASSERT_TRUE(b.ok());
  ExtentRef d = Put(*c, 3, 4096);
  c->Abort(*b);
  EXPECT_EQ(c->Lookup(K(1)), a);
  EXPECT_EQ(c->Lookup(K(3)), d);
  EXPECT_FALSE(c->Lookup(K(2)).has_value());
  EXPECT_FALSE(c->IsCurrent(*b));
  // Ignored: twice, or a published ref.
  c->Abort(*b);
  c->Abort(a);
  EXPECT_TRUE(c->IsCurrent(a));
  auto st = c->stats();
  EXPECT_EQ(st.aborts, 1u);
  EXPECT_EQ(st.writing_extents, 0u);
  EXPECT_EQ(st.published_objects, 2u);
  // The head does not move back into the hole.
  auto next = c->Reserve(K(4), 1);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->offset, 3 * 4096u);
}

TEST_F(CatalogTest, RingWrapEvictsOldestAndRemovesFromDirectory) {
  auto c = Make(1, 4);
  std::vector<ExtentRef> refs;
  for (uint64_t k = 0; k < 4; ++k) refs.push_back(Put(*c, k, 4096));
  ExtentRef e = Put(*c, 10, 4096);  // wraps to offset 0
  EXPECT_EQ(e.offset, 0u);
  EXPECT_FALSE(c->Lookup(K(0)).has_value());
  EXPECT_FALSE(c->IsCurrent(refs[0]));
  for (uint64_t k = 1; k < 4; ++k) EXPECT_EQ(c->Lookup(K(k)), refs[k]);
  EXPECT_EQ(c->stats().evictions, 1u);
  // Head is at 4096; an 8 KiB object covers keys 1 and 2.
  ExtentRef f = Put(*c, 11, 8192);
  EXPECT_EQ(f.offset, 4096u);
  EXPECT_FALSE(c->Lookup(K(1)).has_value());
  EXPECT_FALSE(c->Lookup(K(2)).has_value());
  EXPECT_EQ(c->Lookup(K(3)), refs[3]);
  // Head is at 12288: 8 KiB does not fit before the end, so it wraps to 0 and
  // evicts keys 10 and 11 (the extent straddling 4096..12288 overlaps too).
  ExtentRef g = Put(*c, 12, 8192);
  EXPECT_EQ(g.offset, 0u);
  EXPECT_FALSE(c->Lookup(K(10)).has_value());
  EXPECT_FALSE(c->Lookup(K(11)).has_value());
  EXPECT_EQ(c->Lookup(K(3)), refs[3]);
  auto st = c->stats();
  EXPECT_EQ(st.evictions, 5u);
  EXPECT_EQ(st.published_objects, 2u);
  EXPECT_EQ(st.published_bytes, 4096u + 8192u);
}

TEST_F(CatalogTest, LookupNeverReturnsARefWhoseGenerationChanged) {
  auto c = Make(1, 1);
  ExtentRef a = Put(*c, 1, 10);
  ExtentRef b = Put(*c, 2, 10);  // same shard/offset, new generation
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_NE(a.generation, b.generation);
  EXPECT_FALSE(c->IsCurrent(a));
  EXPECT_FALSE(c->Lookup(K(1)).has_value());
  EXPECT_EQ(c->Lookup(K(2)), b);
  // The old generation cannot be leased even though the offset is live.
  EXPECT_EQ(c->AcquireLease({&a, 1}, LeaseSpec{}).status().code(), StatusCode::kNotFound);
  // Overwriting with the same key yields the new generation.
  ExtentRef b2 = Put(*c, 2, 10);
  EXPECT_GT(b2.generation, b.generation);
  EXPECT_EQ(c->Lookup(K(2)), b2);
  EXPECT_FALSE(c->IsCurrent(b));
}

TEST_F(CatalogTest, RepublishSameKeyReplacesAndOldExtentStaysLeasable) {
  auto c = Make(1, 4);
  ExtentRef old_ref = Put(*c, 1, 4096);
  LeaseId held = Lease(*c, {old_ref});
  ExtentRef new_ref = Put(*c, 1, 6000);
  EXPECT_EQ(c->Lookup(K(1)), new_ref);
  EXPECT_GT(new_ref.generation, old_ref.generation);
  auto st = c->stats();
  EXPECT_EQ(st.published_objects, 1u);
  EXPECT_EQ(st.published_bytes, 8192u);
  // The dead extent is intact: still current and leasable; the existing lease holds.
  EXPECT_TRUE(c->IsCurrent(old_ref));
  EXPECT_EQ(c->LeaseExtents(held), std::vector<ExtentRef>{old_ref});
  LeaseId second = Lease(*c, {old_ref});
  c->Cancel(held);
  c->Cancel(second);
  // Overwriting the dead extent leaves the key's new entry alone.
  Put(*c, 2, 4096);  // offset 12288
  Put(*c, 3, 4096);  // wraps to 0, overwriting the dead extent
  EXPECT_FALSE(c->IsCurrent(old_ref));
  EXPECT_EQ(c->Lookup(K(1)), new_ref);
  EXPECT_EQ(c->stats().evictions, 1u);
}

TEST_F(CatalogTest, OutOfOrderPublishKeepsTheNewerGeneration) {
  auto c = Make(1, 8);
  auto older = c->Reserve(K(1), 100);
  auto newer = c->Reserve(K(1), 100);
  ASSERT_TRUE(older.ok() && newer.ok());
  ASSERT_TRUE(c->Publish(*newer).ok());
  ASSERT_TRUE(c->Publish(*older).ok());  // succeeds, but dead at once
  EXPECT_EQ(c->Lookup(K(1)), *newer);
  EXPECT_TRUE(c->IsCurrent(*older));
  auto st = c->stats();
  EXPECT_EQ(st.published_objects, 1u);
  EXPECT_EQ(st.published_bytes, 4096u);
  EXPECT_EQ(st.publishes, 2u);
}

TEST_F(CatalogTest, OlderWriterPublishingAfterNewerWasEvictedStaysDead) {
  auto c = Make(2, 1);
  auto older = c->Reserve(K(1), 100);  // shard 0
  ASSERT_TRUE(older.ok());
  ExtentRef newer = Put(*c, 1, 100);  // shard 1
  ASSERT_EQ(newer.shard, 1u);
  // Cursor at shard 0 (blocked by the open reservation), so shard 1 is
  // overwritten and key 1 leaves the directory.
  Put(*c, 2, 100);
  ASSERT_FALSE(c->IsCurrent(newer));
  ASSERT_FALSE(c->Lookup(K(1)).has_value());
  ASSERT_TRUE(c->Publish(*older).ok());
  EXPECT_FALSE(c->Lookup(K(1)).has_value());  // not back to the older generation
  EXPECT_TRUE(c->IsCurrent(*older));
  EXPECT_EQ(c->stats().published_objects, 1u);
  // A reservation made after that publishes normally.
  ExtentRef fresh = Put(*c, 1, 100);
  EXPECT_EQ(c->Lookup(K(1)), fresh);
}

TEST_F(CatalogTest, PinnedExtentSendsWriteToNextShardThenBusy) {
  auto c = Make(2, 1);
  ExtentRef a = Put(*c, 1, 100);  // shard 0
  ExtentRef b = Put(*c, 2, 100);  // shard 1
  ASSERT_EQ(a.shard, 0u);
  ASSERT_EQ(b.shard, 1u);
  LeaseId lease = Lease(*c, {a});

  // Cursor is at shard 0: pinned, so shard 1 takes it and evicts key 2.
  auto r = c->Reserve(K(3), 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->shard, 1u);
  EXPECT_FALSE(c->Lookup(K(2)).has_value());
  EXPECT_TRUE(c->IsCurrent(a));
  auto st = c->stats();
  EXPECT_EQ(st.shard_skips, 1u);
  EXPECT_EQ(st.pinned_write_skips, 0u);

  // Shard 1 holds an in-flight write, shard 0 a pin: every shard is blocked.
  auto busy = c->Reserve(K(4), 100);
  ASSERT_EQ(busy.status().code(), StatusCode::kBusy);
  const std::string msg(busy.status().message());
  EXPECT_NE(msg.find("4096"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all 2 shards"), std::string::npos) << msg;
  st = c->stats();
  EXPECT_EQ(st.pinned_write_skips, 1u);
  EXPECT_EQ(st.shard_skips, 3u);
  EXPECT_EQ(st.reservations, 2u + 1u);
  EXPECT_TRUE(c->IsCurrent(a));

  // Releasing the lease unblocks shard 0.
  c->Cancel(lease);
  auto ok = c->Reserve(K(4), 100);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->shard, 0u);
  EXPECT_FALSE(c->IsCurrent(a));
}

TEST_F(CatalogTest, InFlightWriteBlocksOverwrite) {
  auto c = Make(1, 2);
  auto w = c->Reserve(K(1), 4096);
  ASSERT_TRUE(w.ok());
  ExtentRef p = Put(*c, 2, 4096);
  // The ring wraps onto the writing extent: blocked.
  EXPECT_EQ(c->Reserve(K(3), 1).status().code(), StatusCode::kBusy);
  EXPECT_EQ(c->stats().pinned_write_skips, 1u);
  ASSERT_TRUE(c->Publish(*w).ok());
  EXPECT_EQ(c->Lookup(K(1)), *w);
  EXPECT_TRUE(c->IsCurrent(p));
  // Once published (and unpinned) it can be overwritten.
  auto r = c->Reserve(K(3), 1);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(c->Lookup(K(1)).has_value());
}

TEST_F(CatalogTest, CancelReleasesPendingButNotSubmitted) {
  auto c = Make(1, 1);
  ExtentRef a = Put(*c, 1, 100);
  LeaseId lease = Lease(*c, {a}, /*interests=*/3);
  ASSERT_TRUE(c->Submit(lease, 1).ok());
  auto st = c->stats();
  EXPECT_EQ(st.pending_interests, 2u);
  EXPECT_EQ(st.submitted_interests, 1u);
  c->Cancel(lease);
  st = c->stats();
  EXPECT_EQ(st.pending_interests, 0u);
  EXPECT_EQ(st.submitted_interests, 1u);
  EXPECT_EQ(st.active_leases, 1u);
  EXPECT_EQ(st.pinned_extents, 1u);
  EXPECT_EQ(c->LeaseExtents(lease), std::vector<ExtentRef>{a});
  EXPECT_EQ(c->Submit(lease, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Reserve(K(2), 1).status().code(), StatusCode::kBusy);
  EXPECT_TRUE(c->IsCurrent(a));
  c->Complete(lease, 5);  // drops only the one submitted interest
  st = c->stats();
  EXPECT_EQ(st.active_leases, 0u);
  EXPECT_EQ(st.submitted_interests, 0u);
  EXPECT_EQ(st.pinned_extents, 0u);
  EXPECT_TRUE(c->LeaseExtents(lease).empty());
  EXPECT_EQ(c->Submit(lease, 1).code(), StatusCode::kFailedPrecondition);
  c->Complete(lease);  // unknown: ignored
  c->Cancel(lease);
  EXPECT_TRUE(c->Reserve(K(2), 1).ok());
}

// A released lease's storage is reused for the next one: its old id must stay
// unknown, so a late Cancel, Submit or Complete of it cannot touch the new one.
TEST_F(CatalogTest, ReusedLeaseDoesNotAnswerToItsOldId) {
  auto c = Make(1, 4);
  ExtentRef a = Put(*c, 1, 100);
  ExtentRef b = Put(*c, 2, 100);
  LeaseId old = Lease(*c, {a});
  c->Cancel(old);
  LeaseId fresh = Lease(*c, {b}, /*interests=*/2);
  ASSERT_NE(fresh, old);
  c->Cancel(old);
  c->Complete(old, 2);
  EXPECT_EQ(c->Submit(old, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c->LeaseExtents(old).empty());
  EXPECT_EQ(c->LeaseExtents(fresh), std::vector<ExtentRef>{b});
  auto st = c->stats();
  EXPECT_EQ(st.active_leases, 1u);
  EXPECT_EQ(st.pending_interests, 2u);
  EXPECT_EQ(st.pinned_extents, 1u);
  ASSERT_TRUE(c->Submit(fresh, 2).ok());
  c->Complete(fresh, 2);
  EXPECT_EQ(c->stats().active_leases, 0u);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
  // Thousands of leases live at once, then released in another order.
  std::vector<LeaseId> many;
  for (int i = 0; i < 3000; ++i) many.push_back(Lease(*c, {i % 2 ? a : b}));
  EXPECT_EQ(c->stats().active_leases, 3000u);
  for (size_t i = 0; i < many.size(); i += 2) c->Cancel(many[i]);
  for (size_t i = 1; i < many.size(); i += 2) {
    EXPECT_EQ(c->LeaseExtents(many[i]), std::vector<ExtentRef>{i % 2 ? a : b});
  }
  c->CancelMany(many);
  st = c->stats();
  EXPECT_EQ(st.active_leases, 0u);
  EXPECT_EQ(st.pending_interests, 0u);
  EXPECT_EQ(st.pinned_extents, 0u);
}
TEST_F(CatalogTest, LookupAndLeaseLeasesOnlyAKeysCurrentPublishedExtent) {
  auto c = Make(1, 8);
  ExtentRef a = Put(*c, 1, 100);
  ExtentRef b = Put(*c, 2, 100);
  auto open = c->Reserve(K(3), 100);  // not published: invisible
  ASSERT_TRUE(open.ok());
  EXPECT_FALSE(c->LookupAndLease(K(3), LeaseSpec{1, 1, {}}));
  EXPECT_FALSE(c->LookupAndLease(K(9), LeaseSpec{1, 1, {}}));
  ASSERT_TRUE(c->Drop(b));  // dropped: gone from the directory
  EXPECT_FALSE(c->LookupAndLease(K(2), LeaseSpec{1, 1, {}}));
  EXPECT_EQ(c->stats().active_leases, 0u);
  auto l1 = c->LookupAndLease(K(1), LeaseSpec{1, 1, {}});
  auto l2 = c->LookupAndLease(K(1), LeaseSpec{1, 2, {}});
  ASSERT_TRUE(l1 && l2);
  EXPECT_EQ(l1->ref, a);
  EXPECT_NE(l1->lease, l2->lease);
  auto st = c->stats();
  EXPECT_EQ(st.active_leases, 2u);
  EXPECT_EQ(st.pending_interests, 3u);
  EXPECT_EQ(st.pinned_extents, 1u);
  EXPECT_EQ(c->LeaseExtents(l2->lease), std::vector<ExtentRef>{a});
  c->CancelMany(std::vector<LeaseId>{l1->lease, 12345, l2->lease});  // unknown: ignored
  st = c->stats();
  EXPECT_EQ(st.active_leases, 0u);
  EXPECT_EQ(st.pending_interests, 0u);
  EXPECT_EQ(st.pinned_extents, 0u);
  c->Abort(*open);
}

TEST_F(CatalogTest, SubmitMoreThanPendingFailsAndChangesNothing) {
  auto c = Make(1, 1);
  ExtentRef a = Put(*c, 1, 100);
  LeaseId lease = Lease(*c, {a}, 2);
  EXPECT_EQ(c->Submit(lease, 3).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Submit(999, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->stats().pending_interests, 2u);
  ASSERT_TRUE(c->Submit(lease, 2).ok());
  c->Complete(lease, 1);
  EXPECT_EQ(c->stats().active_leases, 1u);
  c->Complete(lease, 1);
  EXPECT_EQ(c->stats().active_leases, 0u);
}

TEST_F(CatalogTest, ExpiryDropsPendingInterestsAtTheDeadline) {
  auto c = Make(1, 2);
  ExtentRef a = Put(*c, 1, 100);
  ExtentRef b = Put(*c, 2, 100);
  LeaseId timed = Lease(*c, {a}, 2, 1, clock_.Now() + milliseconds(10));
  LeaseId forever = Lease(*c, {b}, 1, 1);
  ASSERT_TRUE(c->Submit(timed, 1).ok());
  clock_.Advance(milliseconds(9));
  EXPECT_EQ(c->ExpireLeases(), 0u);
  clock_.Advance(milliseconds(1));  // Now() == deadline
  EXPECT_EQ(c->ExpireLeases(), 1u);
  auto st = c->stats();
  EXPECT_EQ(st.expired_interests, 1u);
  EXPECT_EQ(st.pending_interests, 1u);  // the un-timed lease
  EXPECT_EQ(st.submitted_interests, 1u);
  EXPECT_EQ(st.active_leases, 2u);
  // The submitted read keeps its pin; the expired interest may not be read.
  EXPECT_EQ(c->Submit(timed, 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c->IsCurrent(a));
  c->Complete(timed);
  EXPECT_TRUE(c->LeaseExtents(timed).empty());
  clock_.Advance(std::chrono::hours(24));
  EXPECT_EQ(c->ExpireLeases(), 0u);
  EXPECT_EQ(c->LeaseExtents(forever), std::vector<ExtentRef>{b});
  c->Cancel(forever);
  EXPECT_EQ(c->stats().active_leases, 0u);
}

TEST_F(CatalogTest, KeptLeaseOutlivesItsDeadlineUntilReadOrCancelled) {
  auto c = Make(1, 2);
  ExtentRef a = Put(*c, 1, 100);
  ExtentRef b = Put(*c, 2, 100);
  LeaseId read = Lease(*c, {a}, 1, 1, clock_.Now() + milliseconds(10));
  LeaseId cancelled = Lease(*c, {b}, 1, 1, clock_.Now() + milliseconds(10));
  ASSERT_TRUE(c->KeepUntilDone(read).ok());
  ASSERT_TRUE(c->KeepUntilDone(cancelled).ok());
  clock_.Advance(std::chrono::hours(1));
  EXPECT_EQ(c->ExpireLeases(), 0u);
  ASSERT_TRUE(c->Submit(read).ok());
  c->Complete(read);
  c->Cancel(cancelled);
  EXPECT_EQ(c->stats().active_leases, 0u);
  EXPECT_EQ(c->KeepUntilDone(read).code(), StatusCode::kFailedPrecondition);
}

TEST_F(CatalogTest, ExpiryReleasesFullyPendingLease) {
  auto c = Make(1, 1);
  ExtentRef a = Put(*c, 1, 100);
  LeaseId lease = Lease(*c, {a}, 3, 1, clock_.Now() + milliseconds(1));
  EXPECT_EQ(c->Reserve(K(2), 1).status().code(), StatusCode::kBusy);
  clock_.Advance(milliseconds(2));
  EXPECT_EQ(c->ExpireLeases(), 3u);
  EXPECT_TRUE(c->LeaseExtents(lease).empty());
  auto st = c->stats();
  EXPECT_EQ(st.expired_interests, 3u);
  EXPECT_EQ(st.pinned_extents, 0u);
  EXPECT_TRUE(c->Reserve(K(2), 1).ok());
}

TEST_F(CatalogTest, ReleaseSessionCancelsOnlyThatSession) {
  auto c = Make(1, 4);
  ExtentRef a = Put(*c, 1, 100);
  ExtentRef b = Put(*c, 2, 100);
  LeaseId s7_pending = Lease(*c, {a}, 2, 7);
  LeaseId s7_reading = Lease(*c, {b}, 2, 7);
  LeaseId s8 = Lease(*c, {a, b}, 1, 8);
  ASSERT_TRUE(c->Submit(s7_reading, 1).ok());
  c->ReleaseSession(7);
  EXPECT_TRUE(c->LeaseExtents(s7_pending).empty());
  EXPECT_EQ(c->LeaseExtents(s7_reading), std::vector<ExtentRef>{b});
  EXPECT_EQ(c->LeaseExtents(s8), (std::vector<ExtentRef>{a, b}));
  auto st = c->stats();
  EXPECT_EQ(st.active_leases, 2u);
  EXPECT_EQ(st.pending_interests, 1u);
  EXPECT_EQ(st.submitted_interests, 1u);
  c->ReleaseSession(42);  // unknown: ignored
  c->Complete(s7_reading);
  c->ReleaseSession(8);
  EXPECT_EQ(c->stats().active_leases, 0u);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
}

TEST_F(CatalogTest, StaleRefLeaseIsNotFoundAndPinsNothing) {
  auto c = Make(1, 2);
  ExtentRef stale = Put(*c, 1, 4096);
  ExtentRef live = Put(*c, 2, 4096);
  Put(*c, 3, 4096);  // overwrites key 1
  ASSERT_FALSE(c->IsCurrent(stale));
  std::vector<ExtentRef> refs{live, stale};
  EXPECT_EQ(c->AcquireLease(refs, LeaseSpec{}).status().code(), StatusCode::kNotFound);
  auto st = c->stats();
  EXPECT_EQ(st.active_leases, 0u);
  EXPECT_EQ(st.pinned_extents, 0u);
  EXPECT_EQ(st.pending_interests, 0u);
  // `live` was not pinned: the ring may overwrite it.
  EXPECT_TRUE(c->Reserve(K(4), 1).ok());
  EXPECT_FALSE(c->IsCurrent(live));
}

// More extents than AcquireLease keeps inline (8): the same all-or-nothing
// check, then every extent pinned.
TEST_F(CatalogTest, LeaseOfManyExtentsPinsAllOrNone) {
  auto c = Make(1, 16);
  std::vector<ExtentRef> refs;
  for (uint64_t k = 1; k <= 12; ++k) refs.push_back(Put(*c, k, 4096));
  std::vector<ExtentRef> with_stale = refs;
  with_stale.back().generation += 1;  // not current
  EXPECT_EQ(c->AcquireLease(with_stale, LeaseSpec{}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
  EXPECT_EQ(c->stats().active_leases, 0u);
  auto lease = c->AcquireLease(refs, LeaseSpec{});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(c->stats().pinned_extents, 12u);
  EXPECT_EQ(c->LeaseExtents(*lease).size(), 12u);
  ASSERT_TRUE(c->Submit(*lease).ok());
  c->Complete(*lease);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
  EXPECT_EQ(c->stats().active_leases, 0u);
}

TEST_F(CatalogTest, AcquireLeaseRejectsEmptyRefsAndZeroInterests) {
  auto c = Make(1, 1);
  ExtentRef a = Put(*c, 1, 1);
  EXPECT_EQ(c->AcquireLease({}, LeaseSpec{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->AcquireLease({&a, 1}, LeaseSpec{1, 0, {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->stats().active_leases, 0u);
}

TEST_F(CatalogTest, DuplicateRefsPinTwiceAndCountOnce) {
  auto c = Make(1, 1);
  ExtentRef a = Put(*c, 1, 100);
  LeaseId twice = Lease(*c, {a, a});
  LeaseId once = Lease(*c, {a});
  auto st = c->stats();
  EXPECT_EQ(st.pinned_extents, 1u);
  EXPECT_EQ(st.pinned_bytes, 4096u);
  c->Cancel(twice);
  EXPECT_EQ(c->Reserve(K(2), 1).status().code(), StatusCode::kBusy);  // `once` still pins
  c->Cancel(once);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
  EXPECT_TRUE(c->Reserve(K(2), 1).ok());
}

TEST_F(CatalogTest, StatsReturnToZeroAfterEverythingIsReleased) {
  auto c = Make(2, 4);
  std::vector<ExtentRef> refs;
  for (uint64_t k = 0; k < 6; ++k) refs.push_back(Put(*c, k, 3000 + k));
  auto open = c->Reserve(K(100), 1);
  ASSERT_TRUE(open.ok());
  LeaseId l1 = Lease(*c, {refs[0], refs[1]}, 2, 1, clock_.Now() + milliseconds(5));
  Lease(*c, {refs[2]}, 1, 2);  // session 2, released below
  LeaseId l3 = Lease(*c, {refs[3], refs[3]}, 2, 3);
  ASSERT_TRUE(c->Submit(l1, 1).ok());
  ASSERT_TRUE(c->Submit(l3, 2).ok());
  auto st = c->stats();
  EXPECT_EQ(st.active_leases, 3u);
  EXPECT_EQ(st.pending_interests, 2u);
  EXPECT_EQ(st.submitted_interests, 3u);
  EXPECT_EQ(st.pinned_extents, 4u);
  EXPECT_EQ(st.pinned_bytes, 4u * 4096);
  EXPECT_EQ(st.writing_extents, 1u);

  clock_.Advance(milliseconds(5));
  EXPECT_EQ(c->ExpireLeases(), 1u);
  c->Complete(l1);
  c->ReleaseSession(2);
  c->Complete(l3, 2);
  c->Abort(*open);
  st = c->stats();
  EXPECT_EQ(st.active_leases, 0u);
  EXPECT_EQ(st.pending_interests, 0u);
  EXPECT_EQ(st.submitted_interests, 0u);
  EXPECT_EQ(st.pinned_extents, 0u);
  EXPECT_EQ(st.pinned_bytes, 0u);
  EXPECT_EQ(st.writing_extents, 0u);
  EXPECT_EQ(st.writing_bytes, 0u);
  EXPECT_EQ(st.published_objects, 6u);
  EXPECT_EQ(st.published_bytes, 6u * 4096);
  EXPECT_EQ(st.reservations, 7u);
  EXPECT_EQ(st.publishes, 6u);
  EXPECT_EQ(st.aborts, 1u);
  EXPECT_EQ(st.expired_interests, 1u);
}

TEST_F(CatalogTest, ClearForgetsEverythingAndKeepsGenerationsIncreasing) {
  auto c = Make(2, 2);
  ExtentRef a = Put(*c, 1, 100);
  c->Clear();
  EXPECT_FALSE(c->Lookup(K(1)).has_value());
  EXPECT_FALSE(c->IsCurrent(a));
  auto st = c->stats();
  EXPECT_EQ(st.published_objects, 0u);
  EXPECT_EQ(st.reservations, 0u);
  EXPECT_EQ(st.publishes, 0u);
  // Same placement as a fresh catalog, but a newer generation.
  ExtentRef b = Put(*c, 1, 100);
  EXPECT_EQ(b.shard, a.shard);
  EXPECT_EQ(b.offset, a.offset);
  EXPECT_GT(b.generation, a.generation);
  EXPECT_FALSE(c->IsCurrent(a));
}

// Drop (a read found the extent damaged): the key is absent at once, no new
// lease takes the extent, a lease that pins it keeps its range from reuse
// until released, and the key can be published again.
TEST_F(CatalogTest, DroppedExtentLeavesTheDirectoryAndIsKeptOnlyWhileLeased) {
  auto c = Make(1, 4);
  const ExtentRef a = Put(*c, 1, 4096);
  for (uint64_t k = 2; k <= 4; ++k) Put(*c, k, 4096);  // the shard is full; head back at 0
  const LeaseId other = Lease(*c, {a});                // another query still holds key 1
  EXPECT_TRUE(c->Drop(a));
  EXPECT_FALSE(c->Lookup(K(1)).has_value());
  EXPECT_FALSE(c->IsCurrent(a));
  EXPECT_EQ(c->AcquireLease({&a, 1}, {}).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(c->Drop(a)) << "a second reader of the damaged extent drops nothing more";
  CatalogStats st = c->stats();
  EXPECT_EQ(st.published_objects, 3u);
  EXPECT_EQ(st.published_bytes, 3u * 4096);
  EXPECT_EQ(st.dropped_extents, 1u);
  EXPECT_EQ(st.pinned_extents, 1u);
  // The ring head is at the dropped extent: the lease keeps it from reuse.
  EXPECT_TRUE(c->Reserve(K(5), 4096).status().IsBusy());
  c->Cancel(other);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
  // Released: the range is free, and a new object of key 1 is its current extent.
  auto again = c->Reserve(K(1), 4096);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->offset, a.offset);
  ASSERT_TRUE(c->Publish(*again).ok());
  EXPECT_EQ(c->Lookup(K(1)), *again);
  st = c->stats();
  EXPECT_EQ(st.evictions, 0u) << "a dropped extent is not evicted again";
  EXPECT_EQ(st.published_objects, 4u);
  EXPECT_EQ(st.active_leases, 0u);
}

TEST_F(CatalogTest, DropIgnoresOpenUnknownAndSupersededRefsButDropsADeadExtent) {
  auto c = Make(1, 8);
  auto open = c->Reserve(K(1), 4096);
  ASSERT_TRUE(open.ok());
  EXPECT_FALSE(c->Drop(*open));  // being written: not a read's object
  ASSERT_TRUE(c->Publish(*open).ok());
  EXPECT_FALSE(c->Drop(ExtentRef{0, open->offset, 4096, 4096, open->generation + 100}));
  EXPECT_FALSE(c->Drop(ExtentRef{3, 0, 4096, 4096, open->generation}));  // no such shard
  const ExtentRef newer = Put(*c, 1, 4096);                              // key 1 republished
  EXPECT_TRUE(c->Drop(*open));  // the dead extent goes; the key keeps its newer one
  EXPECT_EQ(c->Lookup(K(1)), newer);
  EXPECT_FALSE(c->IsCurrent(*open));
  EXPECT_EQ(c->stats().published_objects, 1u);
}

TEST_F(CatalogTest, DropTagDropsEveryPublishedExtentOfTheTagAndNothingElse) {
  auto c = Make(2, 8);
  auto put = [&](uint64_t key, uint64_t tag) {
    auto r = c->Reserve(K(key), 4096, tag);
    EXPECT_TRUE(r.ok() && c->Publish(*r).ok());
    return *r;
  };
  const ExtentRef a1 = put(1, 7), b = put(2, 8);
  const ExtentRef a2 = put(3, 7);
  const ExtentRef dead = put(1, 7);  // key 1 republished: a1 is dead
  const LeaseId held = Lease(*c, {a2});
  auto open = c->Reserve(K(4), 4096, 7);  // a write in flight
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(c->DropTag(7), 2u);  // keys 1 and 3 leave the directory
  EXPECT_FALSE(c->Lookup(K(1)).has_value());
  EXPECT_FALSE(c->Lookup(K(3)).has_value());
  EXPECT_FALSE(c->IsCurrent(a1));
  EXPECT_FALSE(c->IsCurrent(dead));
  EXPECT_FALSE(c->IsCurrent(a2));
  EXPECT_EQ(c->Lookup(K(2)), b);
  EXPECT_EQ(c->stats().pinned_extents, 1u);  // the lease keeps a2 until released
  EXPECT_EQ(c->stats().dropped_extents, 3u);
  c->Cancel(held);
  EXPECT_EQ(c->stats().pinned_extents, 0u);
  EXPECT_EQ(c->DropTag(9), 0u);
}

// CI stop 26: SGLang's clear() was followed by a get that still found two
// pages: their writeback had reserved its extents before the clear and
// published them after it, so the cleared objects came back from the SSD.
TEST_F(CatalogTest, WriteUnderWayWhenItsNamespaceIsClearedDoesNotBringItsObjectBack) {
  auto c = Make(1, 8);
  auto open = c->Reserve(K(4), 4096, 7);  // a write in flight
  auto other = c->Reserve(K(5), 4096, 8);
  ASSERT_TRUE(open.ok() && other.ok());
  EXPECT_EQ(c->DropTag(7), 0u);  // nothing of tag 7 was published yet
  EXPECT_EQ(c->Publish(*open).code(), StatusCode::kCancelled);
  EXPECT_FALSE(c->Lookup(K(4)).has_value());
  EXPECT_FALSE(c->IsCurrent(*open));
  EXPECT_EQ(c->Publish(*open).code(), StatusCode::kFailedPrecondition);  // gone
  ASSERT_TRUE(c->Publish(*other).ok());  // another tag's write is untouched
  EXPECT_EQ(c->Lookup(K(5)), *other);
  const CatalogStats s = c->stats();
  EXPECT_EQ(s.writing_extents, 0u);
  EXPECT_EQ(s.writing_bytes, 0u);
  EXPECT_EQ(s.aborts, 1u);
  // Written again after the clear, the key is published as usual.
  auto again = c->Reserve(K(4), 4096, 7);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(c->Publish(*again).ok());
  EXPECT_EQ(c->Lookup(K(4)), *again);
}

}  // namespace
}  // namespace orbitkv
