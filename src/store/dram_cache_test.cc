// Unit tests for DramCache: one test per rule of the contract in dram_cache.h,
// plus a multi-threaded stress test meant for TSan.
#include "store/dram_cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/lock_memory.h"

namespace orbitkv {
namespace {

using std::chrono::seconds;

constexpr uint64_t kBlock = 64 * kKiB;

ObjectId Id(uint64_t v, uint64_t ns = 1, uint32_t group = 0) {
  return ObjectId{ns, group, Key::FromU64(v)};
}

// Deterministic content of object `v` at byte `i`.
uint8_t ByteOf(uint64_t v, uint64_t i) { return static_cast<uint8_t>(v * 131 + i * 7 + (i >> 9)); }

std::vector<uint8_t> Bytes(uint64_t v, uint64_t size) {
  std::vector<uint8_t> out(size);
  for (uint64_t i = 0; i < size; ++i) out[i] = ByteOf(v, i);
  return out;
}

void Fill(const DramView& view, uint64_t v, uint64_t begin, uint64_t end) {
  for (uint64_t i = begin; i < end; ++i) view.data[i] = ByteOf(v, i);
}

bool Holds(const DramView& view, uint64_t v) {
  for (uint64_t i = 0; i < view.size; ++i) {
    if (view.data[i] != ByteOf(v, i)) return false;
  }
  return true;
}

class DramCacheTest : public ::testing::Test {
 protected:
  // writeback_on_seal models a Manager with an SSD tier.
  std::unique_ptr<DramCache> Make(uint64_t capacity,
                                  AdmissionPolicy admission = AdmissionPolicy::kAll,
                                  bool writeback_on_seal = false,
                                  uint64_t ghost_entries = 1 << 16) {
    DramCacheOptions o;
    o.capacity = capacity;
    o.lock_memory = false;
    o.admission = admission;
    o.writeback_on_seal = writeback_on_seal;
    o.ghost_entries = ghost_entries;
    o.clock = &clock_;
    auto r = DramCache::Create(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // Publishes object `v` of `size` bytes in one part (sealed, unpinned;
  // writeback-pending when the cache has writeback_on_seal).
  static void Put(DramCache& c, uint64_t v, uint64_t size = kBlock) {
    auto view = c.BeginAssembly(Id(v), size, 1);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    Fill(*view, v, 0, size);
    const uint32_t part = 0;
    auto done = c.CompleteParts(*view, {&part, 1});
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    ASSERT_TRUE(*done);
  }

  static void WriteBack(DramCache& c, uint64_t v, bool written = true) {
    auto wb = c.TakeWriteback(Id(v));
    ASSERT_TRUE(wb.has_value());
    EXPECT_TRUE(Holds(*wb, v));
    c.FinishWriteback(*wb, written);
  }

  // Evicts every evictable entry by taking the whole pool as scratch.
  static void Drain(DramCache& c) {
    auto s = c.AllocateScratch(c.stats().capacity);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    c.ReleaseScratch(*s);
  }

  ManualClock clock_;
};

TEST_F(DramCacheTest, CreateRejectsCapacityThatIsNotAPositiveMultipleOf4KiB) {
  for (uint64_t cap : {uint64_t{0}, uint64_t{4095}, uint64_t{4097}, uint64_t{kMiB + 512}}) {
    DramCacheOptions o;
    o.capacity = cap;
    o.lock_memory = false;
    auto r = DramCache::Create(o);
    ASSERT_FALSE(r.ok()) << cap;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << cap;
  }
}

TEST_F(DramCacheTest, OnArenaSeesTheArenaAndItsErrorFailsCreate) {
  DramCacheOptions o;
  o.capacity = kMiB;
  o.lock_memory = false;
  void* seen_base = nullptr;
  uint64_t seen_size = 0;
  o.on_arena = [&](void* base, uint64_t size) {
    seen_base = base;
    seen_size = size;
    return Status::OK();
  };
  auto r = DramCache::Create(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(seen_base, (*r)->arena_base());
  EXPECT_EQ(seen_size, kMiB);

  o.on_arena = [](void*, uint64_t) { return Status::Unavailable("no CUDA"); };
  auto bad = DramCache::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);
}

TEST_F(DramCacheTest, LockMemoryIsBestEffort) {
  DramCacheOptions o;
  o.capacity = 2 * kMiB;
  o.lock_memory = true;  // passes whether or not RLIMIT_MEMLOCK allows it
  auto r = DramCache::Create(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Put(**r, 1);
  auto v = (*r)->Pin(Id(1));
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(Holds(*v, 1));
  (*r)->Unpin(v->id);

  // Force the failure path: no lockable memory at all (root with
  // CAP_IPC_LOCK still succeeds, which is fine too).
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &old), 0);
  rlimit none = old;
  none.rlim_cur = 0;
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &none), 0);
  auto unlocked = DramCache::Create(o);
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &old), 0);
  ASSERT_TRUE(unlocked.ok()) << unlocked.status().ToString();
  Put(**unlocked, 2);
  EXPECT_TRUE((*unlocked)->Contains(Id(2)));
}

TEST_F(DramCacheTest, AllocationsAre4KiBAlignedInsideTheArena) {
  auto c = Make(kMiB);
  uint64_t total = 0;
  std::vector<DramView> views;
  for (uint64_t size : {uint64_t{1}, uint64_t{4096}, uint64_t{4097}, uint64_t{10000}}) {
    auto v = c->BeginAssembly(Id(size), size, 1);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % 4096, 0u) << size;
    EXPECT_GE(v->data, c->arena_base());
    EXPECT_LE(v->data + v->capacity, c->arena_base() + kMiB);
    EXPECT_EQ(v->size, size);
    EXPECT_EQ(v->capacity, AlignUp(size, 4096));
    total += v->capacity;
    views.push_back(*v);
  }
  auto s = c->AllocateScratch(5000);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data) % 4096, 0u);
  EXPECT_EQ(s->capacity, 8192u);
  EXPECT_EQ(c->stats().used_bytes, total + 8192);
  EXPECT_EQ(c->stats().assembling_entries, 4u);
  for (const auto& v : views) c->AbortAssembly(v);
  c->ReleaseScratch(*s);
  EXPECT_EQ(c->stats().used_bytes, 0u);
}

TEST_F(DramCacheTest, EvictsLeastRecentlyUsedFirst) {
  auto c = Make(4 * kBlock);
  for (uint64_t v = 1; v <= 4; ++v) Put(*c, v);
  // A use of 1 makes 2 the least recently used.
  auto p = c->Pin(Id(1));
  ASSERT_TRUE(p.has_value());
  c->Unpin(p->id);
  Put(*c, 5);
  EXPECT_FALSE(c->Contains(Id(2)));
  EXPECT_TRUE(c->Contains(Id(1)));
  Put(*c, 6);
  EXPECT_FALSE(c->Contains(Id(3)));
  Put(*c, 7);
  EXPECT_FALSE(c->Contains(Id(4)));
  Put(*c, 8);
  EXPECT_FALSE(c->Contains(Id(1)));
  for (uint64_t v = 5; v <= 8; ++v) EXPECT_TRUE(c->Contains(Id(v))) << v;
  const DramStats s = c->stats();
  EXPECT_EQ(s.evictions, 4u);
  EXPECT_EQ(s.evicted_bytes, 4 * kBlock);
  EXPECT_EQ(s.sealed_entries, 4u);
  EXPECT_EQ(s.used_bytes, 4 * kBlock);
}

TEST_F(DramCacheTest, PinRunStopsAtTheFirstAbsentEntryAndAtARefusalWhichIsAUse) {
  auto c = Make(4 * kBlock);
  for (uint64_t v = 1; v <= 4; ++v) Put(*c, v);
  std::vector<EntryId> pinned;
  auto keep_all = [&](size_t, const DramView& v) {
    pinned.push_back(v.id);
    return Holds(v, pinned.size());
  };
  // 1 and 2 are pinned; 99 is absent, so 3 is not touched.
  const std::vector<ObjectId> ids = {Id(1), Id(2), Id(99), Id(3)};
  EXPECT_EQ(c->PinRun(ids, keep_all), 2u);
  EXPECT_EQ(c->stats().pinned_entries, 2u);
  c->UnpinMany(pinned);
  EXPECT_EQ(c->stats().pinned_entries, 0u);
  // A refusal of 3 leaves it unpinned, but it was used: 4 is now the oldest.
  const std::vector<ObjectId> more = {Id(3), Id(4)};
  EXPECT_EQ(c->PinRun(more, [](size_t, const DramView&) { return false; }), 0u);
  EXPECT_EQ(c->stats().pinned_entries, 0u);
  Put(*c, 5);
  EXPECT_FALSE(c->Contains(Id(4)));
  EXPECT_TRUE(c->Contains(Id(3)));
  // The LRU order the run left is 1, 2, 3: evicted in that order.
  Put(*c, 6);
  EXPECT_FALSE(c->Contains(Id(1)));
  Put(*c, 7);
  EXPECT_FALSE(c->Contains(Id(2)));
  EXPECT_TRUE(c->Contains(Id(3)));
}

// The query's PinRun names {ns, group, key} without an id array: the same
// entries, the same stops, and nothing of another namespace or group.
TEST_F(DramCacheTest, PinRunOverKeysPinsTheIdsOfItsNamespaceAndGroup) {
  auto c = Make(4 * kBlock);
  for (uint64_t v = 1; v <= 3; ++v) Put(*c, v);
  auto key = [](uint64_t v) { return Key::FromU64(v).bytes; };
  std::vector<EntryId> pinned;
  auto keep_all = [&](size_t index, const DramView& v) {
    EXPECT_EQ(index, pinned.size());
    pinned.push_back(v.id);
    return Holds(v, pinned.size());
  };
  const std::vector<BlockKey> keys = {key(1), key(2), key(99), key(3)};
  EXPECT_EQ(c->PinRun(1, 0, keys, keep_all), 2u);
  ASSERT_EQ(pinned.size(), 2u);
  EXPECT_EQ(c->stats().pinned_entries, 2u);
  c->UnpinMany(pinned);
  pinned.clear();
  // The same keys under another namespace or group are other objects.
  EXPECT_EQ(c->PinRun(2, 0, keys, keep_all), 0u);
  EXPECT_EQ(c->PinRun(1, 1, keys, keep_all), 0u);
  EXPECT_TRUE(pinned.empty());
  // A refusal unpins what it was handed.
  const std::vector<BlockKey> three = {key(3)};
  EXPECT_EQ(c->PinRun(1, 0, three, [](size_t, const DramView&) { return false; }), 0u);
  EXPECT_EQ(c->stats().pinned_entries, 0u);
}

TEST_F(DramCacheTest, ContainsDoesNotTouchTheLru) {
  auto c = Make(2 * kBlock);
  Put(*c, 1);
  Put(*c, 2);
  EXPECT_TRUE(c->Contains(Id(1)));
  Put(*c, 3);
  EXPECT_FALSE(c->Contains(Id(1)));
  EXPECT_TRUE(c->Contains(Id(2)));
}

TEST_F(DramCacheTest, PinnedAndWritebackPendingEntriesAreNeverEvicted) {
  auto c = Make(4 * kBlock);
  Put(*c, 1);
  Put(*c, 2);
  c->MarkWritebackPending(Id(2));
  Put(*c, 3);
  Put(*c, 4);
  auto pinned = c->Pin(Id(1));
  ASSERT_TRUE(pinned.has_value());
  for (uint64_t v = 5; v <= 10; ++v) Put(*c, v);  // churns the two free slots
  EXPECT_TRUE(c->Contains(Id(1)));
  EXPECT_TRUE(c->Contains(Id(2)));
  EXPECT_TRUE(Holds(*pinned, 1));
  DramStats s = c->stats();
  EXPECT_EQ(s.pinned_entries, 1u);
  EXPECT_EQ(s.pinned_bytes, kBlock);
  EXPECT_EQ(s.writeback_pending, 1u);
  EXPECT_EQ(s.evictions, 6u);

  // Once released and written back both become ordinary LRU entries.
  c->Unpin(pinned->id);
  WriteBack(*c, 2);
  s = c->stats();
  EXPECT_EQ(s.pinned_entries, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(s.writeback_pending, 0u);
  Put(*c, 11);
  Put(*c, 12);
  Put(*c, 13);
  EXPECT_FALSE(c->Contains(Id(9)));
  EXPECT_FALSE(c->Contains(Id(10)));
  EXPECT_FALSE(c->Contains(Id(1)));
  EXPECT_TRUE(c->Contains(Id(2)));
}

TEST_F(DramCacheTest, ResourceExhaustedWhenEverythingIsPinnedThenRecovers) {
  auto c = Make(4 * kBlock);
  std::vector<DramView> pins;
  for (uint64_t v = 1; v <= 4; ++v) {
    Put(*c, v);
    auto p = c->Pin(Id(v));
    ASSERT_TRUE(p.has_value());
    pins.push_back(*p);
  }
  auto full = c->BeginAssembly(Id(5), kBlock, 1);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("DRAM pool full"), std::string::npos)
      << full.status().ToString();
  EXPECT_EQ(c->InsertSealed(Id(5), Bytes(5, 100)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c->AllocateScratch(1).status().code(), StatusCode::kResourceExhausted);
  DramStats s = c->stats();
  EXPECT_EQ(s.alloc_failures, 3u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.pinned_entries, 4u);
  EXPECT_EQ(s.pinned_bytes, 4 * kBlock);
  for (uint64_t v = 1; v <= 4; ++v) EXPECT_TRUE(c->Contains(Id(v)));

  c->Unpin(pins[2].id);
  Put(*c, 5);
  EXPECT_FALSE(c->Contains(Id(3)));
  EXPECT_EQ(c->stats().evictions, 1u);
  for (uint64_t i : {0, 1, 3}) c->Unpin(pins[i].id);
  EXPECT_EQ(c->stats().pinned_entries, 0u);
}

TEST_F(DramCacheTest, ObjectLargerThanThePoolIsRejected) {
  auto c = Make(kMiB);
  auto r = c->BeginAssembly(Id(1), kMiB + 1, 1);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c->BeginAssembly(Id(1), 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->BeginAssembly(Id(1), 10, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->stats().used_bytes, 0u);
}

TEST_F(DramCacheTest, FragmentedAssemblySealsWhenTheLastPartArrives) {
  auto c = Make(kMiB);
  const uint64_t size = 4 * 10000;
  const uint32_t n = 4;
  auto v = c->BeginAssembly(Id(7), size, n);
  ASSERT_TRUE(v.ok());
  for (uint32_t part : {2u, 0u, 3u}) {
    Fill(*v, 7, part * 10000, (part + 1) * 10000);
  }
  // Parts arrive one call at a time (view re-pinned by joining), in any order,
  // and repeating one is harmless.
  const uint32_t first[] = {2, 0};
  auto r = c->CompleteParts(*v, first);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_FALSE(c->Contains(Id(7)));
  EXPECT_FALSE(c->Pin(Id(7)).has_value());
  EXPECT_EQ(c->stats().assembling_entries, 1u);
  EXPECT_EQ(c->stats().pinned_entries, 0u);

  auto v2 = c->BeginAssembly(Id(7), size, n);
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(v2->data, v->data);
  const uint32_t again[] = {0, 3, 3};
  r = c->CompleteParts(*v2, again);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_FALSE(c->Contains(Id(7)));

  auto v3 = c->BeginAssembly(Id(7), size, n);
  ASSERT_TRUE(v3.ok());
  Fill(*v3, 7, 10000, 20000);
  const uint32_t last[] = {1};
  r = c->CompleteParts(*v3, last);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  EXPECT_TRUE(c->Contains(Id(7)));
  auto pinned = c->Pin(Id(7));
  ASSERT_TRUE(pinned.has_value());
  EXPECT_EQ(pinned->size, size);
  EXPECT_TRUE(Holds(*pinned, 7));
  c->Unpin(pinned->id);

  EXPECT_EQ(c->BeginAssembly(Id(7), size, n).status().code(), StatusCode::kAlreadyExists);
  const DramStats s = c->stats();
  EXPECT_EQ(s.sealed_entries, 1u);
  EXPECT_EQ(s.assembling_entries, 0u);
  EXPECT_EQ(s.pinned_entries, 0u);
}

TEST_F(DramCacheTest, OnSealSeesTheWholeObjectOnceBeforeItIsVisible) {
  DramCacheOptions o;
  o.capacity = kMiB;
  o.lock_memory = false;
  o.clock = &clock_;
  DramCache* cache = nullptr;
  int seals = 0;
  o.on_seal = [&](std::span<uint8_t> object) {
    ++seals;
    EXPECT_EQ(object.size(), 20000u);
    object[0] = 0xAB;  // finish the object: what readers see is this
  };
  auto r = DramCache::Create(o);
  ASSERT_TRUE(r.ok());
  cache = r->get();
  auto v = cache->BeginAssembly(Id(7), 20000, 2);
  ASSERT_TRUE(v.ok());
  const uint32_t first = 0, second = 1;
  ASSERT_FALSE(*cache->CompleteParts(*v, {&first, 1}));
  EXPECT_EQ(seals, 0);
  auto v2 = cache->BeginAssembly(Id(7), 20000, 2);
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(*cache->CompleteParts(*v2, {&second, 1}));
  EXPECT_EQ(seals, 1);
  auto pinned = cache->Pin(Id(7));
  ASSERT_TRUE(pinned.has_value());
  EXPECT_EQ(pinned->data[0], 0xAB);
  cache->Unpin(pinned->id);
  // Inserted entries are complete already: no seal hook.
  std::vector<uint8_t> bytes(4096, 1);
  ASSERT_TRUE(cache->InsertSealed(Id(8), bytes).ok());
  EXPECT_EQ(seals, 1);
}

TEST_F(DramCacheTest, JoinersMustAgreeOnSizeAndPartCount) {
  auto c = Make(kMiB);
  auto a = c->BeginAssembly(Id(1), 8192, 2);
  ASSERT_TRUE(a.ok());
  auto b = c->BeginAssembly(Id(1), 8192, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(c->stats().pinned_entries, 1u);
  EXPECT_EQ(c->BeginAssembly(Id(1), 8193, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->BeginAssembly(Id(1), 8192, 3).status().code(), StatusCode::kInvalidArgument);
  // Same key in another namespace or group is another object.
  auto other_ns = c->BeginAssembly(Id(1, 2), 4096, 1);
  ASSERT_TRUE(other_ns.ok());
  EXPECT_NE(other_ns->id, a->id);
  auto other_group = c->BeginAssembly(Id(1, 1, 5), 4096, 1);
  ASSERT_TRUE(other_group.ok());
  EXPECT_NE(other_group->id, a->id);
  c->AbortAssembly(*other_ns);
  c->AbortAssembly(*other_group);

  // An out-of-range part is rejected, marks nothing, and releases the view.
  const uint32_t bad[] = {0, 2};
  auto r = c->CompleteParts(*a, bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const uint32_t both[] = {0, 1};
  r = c->CompleteParts(*b, both);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  EXPECT_EQ(c->stats().pinned_entries, 0u);
}

TEST_F(DramCacheTest, ConcurrentJoinersSealExactlyOnce) {
  auto c = Make(kMiB);
  constexpr uint32_t kWriters = 4;
  constexpr uint64_t kPart = 3000;
  const uint64_t size = kWriters * kPart;
  std::atomic<int> sealers{0};
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      auto v = c->BeginAssembly(Id(9), size, kWriters);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      Fill(*v, 9, w * kPart, (w + 1) * kPart);
      const uint32_t part = w;
      auto r = c->CompleteParts(*v, {&part, 1});
      ASSERT_TRUE(r.ok());
      if (*r) sealers.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sealers.load(), 1);
  auto p = c->Pin(Id(9));
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(Holds(*p, 9));
  c->Unpin(p->id);
  EXPECT_EQ(c->stats().used_bytes, AlignUp(size, 4096));
}

TEST_F(DramCacheTest, AbortFreesTheAssembly) {
  auto c = Make(kMiB);
  auto v = c->BeginAssembly(Id(1), 10000, 2);
  ASSERT_TRUE(v.ok());
  c->AbortAssembly(*v);
  DramStats s = c->stats();
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.assembling_entries, 0u);
  EXPECT_EQ(s.pinned_entries, 0u);
  EXPECT_FALSE(c->Contains(Id(1)));

  // A fresh assembly of the same id starts with no parts.
  auto fresh = c->BeginAssembly(Id(1), 10000, 2);
  ASSERT_TRUE(fresh.ok());
  const uint32_t one[] = {0};
  auto r = c->CompleteParts(*fresh, one);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(c->stats().assembling_entries, 1u);
}

TEST_F(DramCacheTest, AbortWithJoinedWriterFreesAtTheLastUnpin) {
  auto c = Make(kMiB);
  auto a = c->BeginAssembly(Id(1), 8192, 2);
  auto b = c->BeginAssembly(Id(1), 8192, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  c->AbortAssembly(*a);
  // b still holds the memory; nobody joins the aborted assembly.
  EXPECT_EQ(c->stats().used_bytes, 8192u);
  auto fresh = c->BeginAssembly(Id(1), 8192, 2);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->id, b->id);
  EXPECT_NE(fresh->data, b->data);
  const uint32_t both[] = {0, 1};
  auto r = c->CompleteParts(*b, both);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(c->stats().used_bytes, 8192u);  // only `fresh` is left
  r = c->CompleteParts(*fresh, both);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  EXPECT_TRUE(c->Contains(Id(1)));
  const DramStats s = c->stats();
  EXPECT_EQ(s.assembling_entries, 0u);
  EXPECT_EQ(s.sealed_entries, 1u);
  EXPECT_EQ(s.pinned_entries, 0u);
}

TEST_F(DramCacheTest, AssembliesExpireAfterTheTimeout) {
  auto c = Make(kMiB);
  auto idle = c->BeginAssembly(Id(1), 4096, 2);
  ASSERT_TRUE(idle.ok());
  const uint32_t one[] = {0};
  ASSERT_TRUE(c->CompleteParts(*idle, one).ok());  // unpinned, half done
  clock_.Advance(seconds(30));
  auto busy = c->BeginAssembly(Id(2), 4096, 1);  // still pinned by its writer
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(c->ExpireAssemblies(), 0u);

  clock_.Advance(seconds(31));  // 61 s for the first, 31 s for the second
  EXPECT_EQ(c->ExpireAssemblies(), 1u);
  EXPECT_EQ(c->stats().used_bytes, 4096u);
  EXPECT_EQ(c->stats().assembly_timeouts, 1u);

  clock_.Advance(seconds(30));
  EXPECT_EQ(c->ExpireAssemblies(), 1u);
  // Detached but its writer still holds it: memory stays until the release.
  EXPECT_EQ(c->stats().used_bytes, 4096u);
  auto again = c->BeginAssembly(Id(2), 4096, 1);  // an expired id starts afresh
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->id, busy->id);
  const uint32_t only[] = {0};
  EXPECT_EQ(c->CompleteParts(*busy, only).status().code(), StatusCode::kCancelled);
  EXPECT_FALSE(c->Contains(Id(2)));
  const DramStats s = c->stats();
  EXPECT_EQ(s.assembly_timeouts, 2u);
  EXPECT_EQ(s.used_bytes, 4096u);  // the fresh assembly of id 2
  EXPECT_EQ(s.assembling_entries, 1u);
  c->AbortAssembly(*again);
  EXPECT_EQ(c->stats().used_bytes, 0u);
}

TEST_F(DramCacheTest, ReuseAdmissionKeepsOnlyObjectsSeenBefore) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse, /*writeback_on_seal=*/true);
  Put(*c, 1);
  EXPECT_EQ(c->stats().writeback_pending, 1u);
  EXPECT_TRUE(c->Contains(Id(1)));  // visible while it waits for writeback
  WriteBack(*c, 1);
  EXPECT_FALSE(c->Contains(Id(1)));
  EXPECT_EQ(c->stats().admission_rejects, 1u);
  EXPECT_EQ(c->stats().used_bytes, 0u);

  // Second time: the ghost list remembers it.
  Put(*c, 1);
  WriteBack(*c, 1);
  EXPECT_TRUE(c->Contains(Id(1)));
  const DramStats s = c->stats();
  EXPECT_EQ(s.admission_rejects, 1u);
  EXPECT_EQ(s.sealed_entries, 1u);
  EXPECT_EQ(s.writeback_pending, 0u);
}

TEST_F(DramCacheTest, ReuseWithoutSsdDropsFirstTimeObjectsAtTheLastUnpin) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse);
  Put(*c, 1);
  EXPECT_FALSE(c->Contains(Id(1)));
  EXPECT_EQ(c->stats().admission_rejects, 1u);
  EXPECT_EQ(c->stats().used_bytes, 0u);
  Put(*c, 1);
  EXPECT_TRUE(c->Contains(Id(1)));
}

TEST_F(DramCacheTest, ReusePinDuringWritebackAdmits) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse, /*writeback_on_seal=*/true);
  Put(*c, 1);
  auto p = c->Pin(Id(1));
  ASSERT_TRUE(p.has_value());
  c->Unpin(p->id);
  WriteBack(*c, 1);
  EXPECT_TRUE(c->Contains(Id(1)));
  EXPECT_EQ(c->stats().admission_rejects, 0u);
}

// A query over budget pins a block in PinRun and lets go of it at once: that
// was counted as reuse, so kReuse kept objects nobody had read.
TEST_F(DramCacheTest, ReuseRefusedPinRunPinIsNotReuse) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse, /*writeback_on_seal=*/true);
  Put(*c, 1);
  Put(*c, 2);
  const ObjectId ids[] = {Id(1), Id(2)};
  std::vector<EntryId> kept;
  EXPECT_EQ(c->PinRun(ids,
                      [&](size_t i, const DramView& v) {
                        if (i == 1) return false;  // over the query budget
                        kept.push_back(v.id);
                        return true;
                      }),
            1u);
  c->UnpinMany(kept);
  WriteBack(*c, 1);
  WriteBack(*c, 2);
  EXPECT_TRUE(c->Contains(Id(1)));   // kept by the query: reuse
  EXPECT_FALSE(c->Contains(Id(2)));  // refused: not a use
  EXPECT_EQ(c->stats().admission_rejects, 1u);
}

// The recovery planner pins pieces it may not keep (older checkpoints, blocks
// before the window): those probes were counted as reuse.
TEST_F(DramCacheTest, ReuseProbePinCountsOnlyThroughNoteUse) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse, /*writeback_on_seal=*/true);
  Put(*c, 1);
  Put(*c, 2);
  auto p1 = c->Pin(Id(1), DramCache::PinUse::kProbe);
  auto p2 = c->Pin(Id(2), DramCache::PinUse::kProbe);
  ASSERT_TRUE(p1.has_value() && p2.has_value());
  const EntryId used[] = {p1->id};
  c->NoteUse(used);  // the plan kept piece 1 only
  c->Unpin(p1->id);
  c->Unpin(p2->id);
  WriteBack(*c, 1);
  WriteBack(*c, 2);
  EXPECT_TRUE(c->Contains(Id(1)));
  EXPECT_FALSE(c->Contains(Id(2)));
  EXPECT_EQ(c->stats().admission_rejects, 1u);
}

TEST_F(DramCacheTest, ReuseGhostListIsBounded) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse, /*writeback_on_seal=*/false, /*ghost_entries=*/2);
  for (uint64_t v = 1; v <= 3; ++v) Put(*c, v);  // ghost: 2, 3
  Put(*c, 1);                                    // forgotten: rejected again
  EXPECT_FALSE(c->Contains(Id(1)));
  Put(*c, 3);
  EXPECT_TRUE(c->Contains(Id(3)));
  EXPECT_EQ(c->stats().admission_rejects, 4u);
}

TEST_F(DramCacheTest, AllAdmissionKeepsEverySealedObject) {
  auto c = Make(kMiB, AdmissionPolicy::kAll, /*writeback_on_seal=*/true);
  Put(*c, 1);
  WriteBack(*c, 1);
  EXPECT_TRUE(c->Contains(Id(1)));
  Put(*c, 2);
  WriteBack(*c, 2, /*written=*/false);
  EXPECT_TRUE(c->Contains(Id(2)));
  const DramStats s = c->stats();
  EXPECT_EQ(s.admission_rejects, 0u);
  EXPECT_EQ(s.sealed_entries, 2u);
  EXPECT_EQ(s.writeback_pending, 0u);
}

TEST_F(DramCacheTest, ReplaceSealedSwapsInSmallerBytesAndFreesTheOldAtItsLastUnpin) {
  auto c = Make(8 * kBlock, AdmissionPolicy::kAll, /*writeback_on_seal=*/true);
  Put(*c, 1);
  auto reader = c->Pin(Id(1));  // a restore still copying the old bytes
  ASSERT_TRUE(reader.has_value());
  auto wb = c->TakeWriteback(Id(1));
  ASSERT_TRUE(wb.has_value());
  const std::vector<uint8_t> encoded = Bytes(7, kBlock / 4);
  ASSERT_TRUE(c->ReplaceSealed(*wb, encoded).ok());
  c->FinishWriteback(*wb, true);
  EXPECT_TRUE(Holds(*reader, 1));  // the reader's pin keeps the old bytes
  EXPECT_EQ(c->stats().used_bytes, kBlock + kBlock / 4);
  c->Unpin(reader->id);
  EXPECT_EQ(c->stats().used_bytes, kBlock / 4);  // the old entry went with its last pin
  EXPECT_EQ(c->stats().sealed_entries, 1u);
  auto now = c->Pin(Id(1));
  ASSERT_TRUE(now.has_value());
  EXPECT_NE(now->id, wb->id);
  ASSERT_EQ(now->size, encoded.size());
  EXPECT_EQ(std::memcmp(now->data, encoded.data(), encoded.size()), 0);
  c->Unpin(now->id);
  Drain(*c);  // the new entry is in the LRU: evictable like any other
  EXPECT_FALSE(c->Contains(Id(1)));
}

TEST_F(DramCacheTest, ReplaceSealedNeverEvictsAndRefusesEntriesThatLeft) {
  auto c = Make(2 * kBlock, AdmissionPolicy::kAll, /*writeback_on_seal=*/true);
  Put(*c, 1);
  Put(*c, 2);
  WriteBack(*c, 2);  // evictable
  auto wb = c->TakeWriteback(Id(1));
  ASSERT_TRUE(wb.has_value());
  Status full = c->ReplaceSealed(*wb, Bytes(3, 4096));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_TRUE(c->Contains(Id(2)));  // nothing evicted for it
  EXPECT_EQ(c->ReplaceSealed(*wb, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->EraseNamespace(1), 2u);
  EXPECT_EQ(c->ReplaceSealed(*wb, Bytes(3, 4096)).code(), StatusCode::kFailedPrecondition);
  c->FinishWriteback(*wb, true);
  EXPECT_EQ(c->stats().used_bytes, 0u);
}

TEST_F(DramCacheTest, DiscardedEntryIsNotFoundAndFreedAtItsLastUnpin) {
  auto c = Make(4 * kBlock);
  Put(*c, 1);
  auto a = c->Pin(Id(1));
  auto b = c->Pin(Id(1));
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(c->Discard(*a));
  EXPECT_FALSE(c->Discard(*b));  // already gone
  EXPECT_FALSE(c->Pin(Id(1)).has_value());
  EXPECT_TRUE(Holds(*b, 1));  // the other reader keeps its bytes
  c->Unpin(a->id);
  EXPECT_EQ(c->stats().used_bytes, kBlock);
  c->Unpin(b->id);
  EXPECT_EQ(c->stats().used_bytes, 0u);
  Put(*c, 1);  // the key can be stored again
  EXPECT_TRUE(c->Contains(Id(1)));
}

TEST_F(DramCacheTest, ReplaceSealedRefusesAnUnadmittedEntry) {
  auto c = Make(4 * kBlock, AdmissionPolicy::kReuse, /*writeback_on_seal=*/true);
  Put(*c, 1);  // first sight: not admitted, dropped once written back
  auto wb = c->TakeWriteback(Id(1));
  ASSERT_TRUE(wb.has_value());
  EXPECT_EQ(c->ReplaceSealed(*wb, Bytes(3, 4096)).code(), StatusCode::kFailedPrecondition);
  c->FinishWriteback(*wb, true);
  EXPECT_FALSE(c->Contains(Id(1)));
  EXPECT_EQ(c->stats().used_bytes, 0u);
}

TEST_F(DramCacheTest, TakeWritebackOnlyForPendingSealedEntries) {
  auto c = Make(kMiB);
  EXPECT_FALSE(c->TakeWriteback(Id(1)).has_value());  // absent
  Put(*c, 1);
  EXPECT_FALSE(c->TakeWriteback(Id(1)).has_value());  // not pending
  auto v = c->BeginAssembly(Id(2), 4096, 1);
  ASSERT_TRUE(v.ok());
  c->MarkWritebackPending(Id(2));  // assembling: no-op
  EXPECT_FALSE(c->TakeWriteback(Id(2)).has_value());
  EXPECT_EQ(c->stats().writeback_pending, 0u);
  c->AbortAssembly(*v);
  EXPECT_FALSE(c->TakeWriteback(Id(2)).has_value());  // gone
  c->MarkWritebackPending(Id(3));                     // absent: no-op
  const DramStats s = c->stats();
  EXPECT_EQ(s.writeback_pending, 0u);
  EXPECT_EQ(s.used_bytes, kBlock);
  EXPECT_EQ(s.pinned_entries, 0u);
}

TEST_F(DramCacheTest, InsertSealedCopiesTheBytes) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse);
  std::vector<uint8_t> bytes = Bytes(4, 12345);
  ASSERT_TRUE(c->InsertSealed(Id(4), bytes).ok());
  std::fill(bytes.begin(), bytes.end(), 0);
  EXPECT_TRUE(c->Contains(Id(4)));  // admitted even under kReuse
  auto p = c->Pin(Id(4));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->size, 12345u);
  EXPECT_EQ(p->capacity, AlignUp(12345, 4096));
  EXPECT_TRUE(Holds(*p, 4));
  c->Unpin(p->id);
  EXPECT_EQ(c->InsertSealed(Id(4), Bytes(4, 10)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(c->InsertSealed(Id(5), {}).code(), StatusCode::kInvalidArgument);
  auto v = c->BeginAssembly(Id(6), 100, 1);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(c->InsertSealed(Id(6), Bytes(6, 100)).code(), StatusCode::kAlreadyExists);
  c->AbortAssembly(*v);
  const DramStats s = c->stats();
  EXPECT_EQ(s.sealed_entries, 1u);
  EXPECT_EQ(s.pinned_entries, 0u);
  EXPECT_EQ(s.used_bytes, AlignUp(12345, 4096));
}

TEST_F(DramCacheTest, ScratchEvictsEntriesButIsNeverEvicted) {
  auto c = Make(4 * kBlock);
  for (uint64_t v = 1; v <= 3; ++v) Put(*c, v);
  auto s1 = c->AllocateScratch(2 * kBlock);  // needs 1 and 2 evicted
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  EXPECT_FALSE(c->Contains(Id(1)));
  EXPECT_FALSE(c->Contains(Id(2)));
  EXPECT_TRUE(c->Contains(Id(3)));
  std::memset(s1->data, 0xAB, s1->size);
  DramStats s = c->stats();
  EXPECT_EQ(s.used_bytes, 3 * kBlock);
  EXPECT_EQ(s.scratch_bytes, 2 * kBlock);
  EXPECT_EQ(s.pinned_entries, 0u);  // scratch is not an entry

  // One free slot plus one evictable entry can't make three slots.
  auto s2 = c->AllocateScratch(3 * kBlock);
  EXPECT_EQ(s2.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(c->Contains(Id(3))) << "a hopeless request must not evict";
  EXPECT_EQ(c->stats().evictions, 2u);
  auto s3 = c->AllocateScratch(2 * kBlock);
  ASSERT_TRUE(s3.ok());
  EXPECT_FALSE(c->Contains(Id(3)));
  // Scratch fills the pool and nothing is evictable.
  EXPECT_EQ(c->BeginAssembly(Id(9), kBlock, 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(std::all_of(s1->data, s1->data + s1->size, [](uint8_t b) { return b == 0xAB; }));
  c->ReleaseScratch(*s1);
  c->ReleaseScratch(*s3);
  s = c->stats();
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.scratch_bytes, 0u);
  auto all = c->AllocateScratch(4 * kBlock);
  ASSERT_TRUE(all.ok());
  c->ReleaseScratch(*all);
}

TEST_F(DramCacheTest, FreedRangesCoalesce) {
  const uint64_t pages = 256;
  auto c = Make(pages * 4096);
  std::vector<DramView> bufs;
  for (uint64_t i = 0; i < pages; ++i) {
    auto s = c->AllocateScratch(4096);
    ASSERT_TRUE(s.ok()) << i;
    bufs.push_back(*s);
  }
  // Free every other page: half the pool is free but no 8 KiB range is.
  for (uint64_t i = 0; i < pages; i += 2) c->ReleaseScratch(bufs[i]);
  EXPECT_EQ(c->stats().used_bytes, pages / 2 * 4096);
  EXPECT_EQ(c->AllocateScratch(8192).status().code(), StatusCode::kResourceExhausted);
  // A freed page still fits a page-sized request exactly.
  auto page = c->AllocateScratch(4096);
  ASSERT_TRUE(page.ok());
  c->ReleaseScratch(*page);
  // Free the rest in a scattered order; every gap merges with both neighbours.
  for (uint64_t i = 1; i < pages; i += 4) c->ReleaseScratch(bufs[i]);
  for (int64_t i = pages - 1; i >= 0; i -= 4) c->ReleaseScratch(bufs[i]);
  EXPECT_EQ(c->stats().used_bytes, 0u);
  auto big = c->AllocateScratch(pages * 4096);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->data, c->arena_base());
  c->ReleaseScratch(*big);
}

TEST_F(DramCacheTest, EvictionCoalescesIntoALargeBlock) {
  auto c = Make(kMiB);
  for (uint64_t v = 0; v < 16; ++v) Put(*c, v);  // 16 x 64 KiB fills the pool
  auto big = c->BeginAssembly(Id(100), 512 * kKiB, 1);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(c->stats().evictions, 8u);
  for (uint64_t v = 0; v < 8; ++v) EXPECT_FALSE(c->Contains(Id(v)));
  for (uint64_t v = 8; v < 16; ++v) EXPECT_TRUE(c->Contains(Id(v)));
  c->AbortAssembly(*big);
}

TEST_F(DramCacheTest, StatsReturnToZero) {
  auto c = Make(kMiB, AdmissionPolicy::kReuse, /*writeback_on_seal=*/true);
  Put(*c, 1);
  Put(*c, 2);
  auto p = c->Pin(Id(2));
  ASSERT_TRUE(p.has_value());
  auto a = c->BeginAssembly(Id(3), 5000, 3);
  ASSERT_TRUE(a.ok());
  auto s = c->AllocateScratch(7000);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(c->InsertSealed(Id(4), Bytes(4, 3000)).ok());
  DramStats st = c->stats();
  EXPECT_EQ(st.sealed_entries, 3u);
  EXPECT_EQ(st.assembling_entries, 1u);
  EXPECT_EQ(st.pinned_entries, 2u);
  EXPECT_EQ(st.writeback_pending, 2u);  // not 4: InsertSealed needs no writeback

  c->Unpin(p->id);
  WriteBack(*c, 1);  // rejected
  WriteBack(*c, 2);  // admitted by the pin
  c->AbortAssembly(*a);
  c->ReleaseScratch(*s);
  Drain(*c);  // evicts 2 and 4
  st = c->stats();
  EXPECT_EQ(st.capacity, kMiB);
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.scratch_bytes, 0u);
  EXPECT_EQ(st.sealed_entries, 0u);
  EXPECT_EQ(st.assembling_entries, 0u);
  EXPECT_EQ(st.pinned_entries, 0u);
  EXPECT_EQ(st.pinned_bytes, 0u);
  EXPECT_EQ(st.writeback_pending, 0u);
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.admission_rejects, 1u);
}

// Four threads pin, read, assemble (sharing parts), abort, insert, write back,
// take scratch and expire assemblies over a small pool. Run under TSan; the
// content checks catch a freed or reused range that is still pinned.
void Stress(AdmissionPolicy admission, bool writeback_on_seal) {
  ManualClock clock;
  DramCacheOptions o;
  o.capacity = 256 * kKiB;  // about a third of the ~800 KiB working set
  o.lock_memory = false;
  o.admission = admission;
  o.writeback_on_seal = writeback_on_seal;
  o.ghost_entries = 16;
  o.clock = &clock;
  o.assembly_timeout = seconds(5);
  auto r = DramCache::Create(o);
  ASSERT_TRUE(r.ok());
  DramCache& c = **r;
  // Ids [0, kShared) are published in kThreads parts, part t by thread t
  // (writers own disjoint parts, as TP/PP ranks do); ids [kShared, kIds) in
  // one part, each by one owning thread. Any thread reads or inserts any id.
  constexpr uint32_t kThreads = 4;
  constexpr int kOps = 3000;
  constexpr uint64_t kShared = 8;
  constexpr uint64_t kPerThread = 8;
  constexpr uint64_t kIds = kShared + kThreads * kPerThread;
  auto size_of = [](uint64_t v) { return 4096 * (1 + v % 8) + v * 13; };
  std::atomic<uint64_t> corrupt{0};
  std::atomic<uint64_t> sealed{0};
  // Quiet the expiry warnings this test provokes by the hundred.
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);

  auto worker = [&](uint32_t t) {
    std::mt19937_64 rng(t + 1);
    // Entry whose part this thread already completed, per shared id: a
    // writer never rewrites a part it handed over.
    std::vector<EntryId> done_in(kShared, 0);
    auto publish = [&](uint64_t v, uint32_t num_parts, uint32_t part) {
      const uint64_t size = size_of(v);
      auto view = c.BeginAssembly(Id(v), size, num_parts);
      if (!view.ok()) return;
      const bool fresh = num_parts == 1 || done_in[v] != view->id;
      if (fresh) Fill(*view, v, part * size / num_parts, (part + 1) * size / num_parts);
      if (rng() % 10 == 0) {
        c.AbortAssembly(*view);
        return;
      }
      auto done = c.CompleteParts(*view, {&part, 1});
      if (num_parts > 1) done_in[v] = view->id;
      if (done.ok() && *done) {
        sealed.fetch_add(1);
        // Whoever seals writes back (a no-op without writeback_on_seal).
        if (auto wb = c.TakeWriteback(Id(v))) {
          if (!Holds(*wb, v)) corrupt.fetch_add(1);
          c.FinishWriteback(*wb, rng() % 4 != 0);
        }
      }
    };
    for (int op = 0; op < kOps; ++op) {
      const uint64_t v = rng() % kIds;
      const uint64_t size = size_of(v);
      switch (rng() % 8) {
        case 0:
        case 1: {
          if (auto p = c.Pin(Id(v))) {
            if (p->size != size || !Holds(*p, v)) corrupt.fetch_add(1);
            c.Unpin(p->id);
          }
          break;
        }
        case 2:
          publish(rng() % kShared, kThreads, t);
          break;
        case 3:
          publish(kShared + t * kPerThread + rng() % kPerThread, 1, 0);
          break;
        case 4: {
          std::vector<uint8_t> bytes = Bytes(v, size);
          c.InsertSealed(Id(v), bytes).IgnoreError("stress: present or full is fine");
          break;
        }
        case 5: {
          auto s = c.AllocateScratch(4096 * (1 + rng() % 16));
          if (s.ok()) {
            std::memset(s->data, t, s->size);
            for (uint64_t i = 0; i < s->size; i += 512) {
              if (s->data[i] != t) corrupt.fetch_add(1);
            }
            c.ReleaseScratch(*s);
          }
          break;
        }
        case 6: {  // an explicit re-write of a sealed entry
          (void)c.Contains(Id(v));
          (void)c.stats();
          c.MarkWritebackPending(Id(v));
          if (auto wb = c.TakeWriteback(Id(v))) {
            if (!Holds(*wb, v)) corrupt.fetch_add(1);
            c.FinishWriteback(*wb, true);
          }
          break;
        }
        case 7: {
          if (t == 0 && op % 4 == 0) clock.Advance(seconds(1));
          c.ExpireAssemblies();
          break;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  spdlog::set_level(level);

  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_GT(sealed.load(), 0u);
  const DramStats busy = c.stats();
  std::printf(
      "stress: sealed %llu, evictions %llu, timeouts %llu, alloc failures %llu, rejects %llu\n",
      static_cast<unsigned long long>(sealed.load()),
      static_cast<unsigned long long>(busy.evictions),
      static_cast<unsigned long long>(busy.assembly_timeouts),
      static_cast<unsigned long long>(busy.alloc_failures),
      static_cast<unsigned long long>(busy.admission_rejects));
  clock.Advance(seconds(60));
  c.ExpireAssemblies();
  DramStats s = c.stats();
  EXPECT_EQ(s.pinned_entries, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(s.scratch_bytes, 0u);
  EXPECT_EQ(s.assembling_entries, 0u);
  EXPECT_EQ(s.writeback_pending, 0u);  // every sealer takes the writeback
  // Everything left is evictable and the free map coalesces back to one range.
  auto all = c.AllocateScratch(256 * kKiB);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  c.ReleaseScratch(*all);
  s = c.stats();
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.sealed_entries, 0u);
}

TEST(DramCacheStressTest, FourThreadsAdmitAllNoSsd) { Stress(AdmissionPolicy::kAll, false); }
TEST(DramCacheStressTest, FourThreadsAdmitAllWithWriteback) { Stress(AdmissionPolicy::kAll, true); }
TEST(DramCacheStressTest, FourThreadsAdmitOnReuseWithWriteback) {
  Stress(AdmissionPolicy::kReuse, true);
}

// EraseNamespace: every entry of the namespace leaves at once; a pinned one
// stays readable to its holder and is freed at its last unpin; a pending
// writeback finds nothing; other namespaces keep theirs.
TEST_F(DramCacheTest, EraseNamespaceDropsItsEntriesAndFreesPinnedOnesAtTheirLastUnpin) {
  auto c = Make(8 * kBlock, AdmissionPolicy::kAll, /*writeback_on_seal=*/true);
  for (uint64_t v : {1, 2, 3, 5}) Put(*c, v);  // namespace 1, writeback pending
  WriteBack(*c, 1);
  auto writer = c->TakeWriteback(Id(5));  // a writeback in flight
  ASSERT_TRUE(writer.has_value());
  ASSERT_TRUE(c->InsertSealed(Id(10, 2), Bytes(10, kBlock)).ok());  // namespace 2
  auto partial = c->BeginAssembly(Id(4), kBlock, 2);                // assembling in ns 1
  ASSERT_TRUE(partial.ok());
  auto pinned = c->Pin(Id(2));
  ASSERT_TRUE(pinned.has_value());

  EXPECT_EQ(c->EraseNamespace(1), 4u);
  for (uint64_t v = 1; v <= 5; ++v) EXPECT_FALSE(c->Contains(Id(v))) << v;
  EXPECT_FALSE(c->Pin(Id(1)).has_value());
  EXPECT_FALSE(c->TakeWriteback(Id(3)).has_value());
  EXPECT_TRUE(c->Contains(Id(10, 2)));
  EXPECT_TRUE(Holds(*pinned, 2));  // still the holder's
  const uint32_t part = 0;
  EXPECT_EQ(c->CompleteParts(*partial, {&part, 1}).status().code(), StatusCode::kCancelled);
  DramStats s = c->stats();
  EXPECT_EQ(s.sealed_entries, 3u);  // the pinned one, the writer's and namespace 2's
  EXPECT_EQ(s.writeback_pending, 0u);
  c->FinishWriteback(*writer, true);
  c->Unpin(pinned->id);
  s = c->stats();
  EXPECT_EQ(s.sealed_entries, 1u);
  EXPECT_EQ(s.assembling_entries, 0u);
  EXPECT_EQ(s.pinned_entries, 0u);
  EXPECT_EQ(s.used_bytes, kBlock);
  // The key can be cached again.
  Put(*c, 1);
  EXPECT_TRUE(c->Contains(Id(1)));
  EXPECT_EQ(c->EraseNamespace(3), 0u);
}

}  // namespace
}  // namespace orbitkv

namespace orbitkv {
namespace {

// Checkpoints (SetCheckpointGroups) hold at most checkpoint_capacity bytes of
// the LRU: a stream of them demotes the least recently used ones and leaves
// the attention blocks resident, even in a pool they would otherwise flush.
TEST(DramCacheCheckpointTest, CheckpointsStreamingInDoNotFlushAttentionBlocks) {
  ManualClock clock;
  DramCacheOptions o;
  o.capacity = 1 * kMiB;
  o.lock_memory = false;
  o.clock = &clock;
  o.writeback_on_seal = true;          // an SSD tier: checkpoints leave after writeback
  o.checkpoint_capacity = 2 * kBlock;  // two checkpoints
  auto made = DramCache::Create(o);
  ASSERT_TRUE(made.ok());
  DramCache& c = **made;
  c.SetCheckpointGroups(/*ns=*/1, /*groups=*/1u << 2);
  auto put = [&](uint64_t v, uint32_t group) {
    const ObjectId id{1, group, Key::FromU64(v)};
    auto view = c.BeginAssembly(id, kBlock, 1);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    const uint32_t part = 0;
    ASSERT_TRUE(*c.CompleteParts(*view, {&part, 1}));
    auto wb = c.TakeWriteback(id);
    ASSERT_TRUE(wb.has_value());
    c.FinishWriteback(*wb, true);
  };
  for (uint64_t v = 0; v < 8; ++v) put(v, 0);      // attention blocks: half the pool
  for (uint64_t v = 100; v < 140; ++v) put(v, 2);  // 40 checkpoints: 2.5x the pool
  for (uint64_t v = 0; v < 8; ++v) EXPECT_TRUE(c.Contains({1, 0, Key::FromU64(v)})) << v;
  EXPECT_TRUE(c.Contains({1, 2, Key::FromU64(139)}));  // the newest two stay
  EXPECT_TRUE(c.Contains({1, 2, Key::FromU64(138)}));
  EXPECT_FALSE(c.Contains({1, 2, Key::FromU64(137)}));
  DramStats s = c.stats();
  EXPECT_EQ(s.checkpoint_bytes, 2 * kBlock);
  EXPECT_EQ(s.checkpoints_demoted, 38u);
  EXPECT_EQ(s.checkpoint_demoted_bytes, 38 * kBlock);
  EXPECT_EQ(s.evictions, 0u);  // nothing left by LRU eviction: the attention blocks stayed
  // A pinned checkpoint is in use, not counted; a used one becomes the newest.
  auto pinned = c.Pin({1, 2, Key::FromU64(138)});
  ASSERT_TRUE(pinned.has_value());
  EXPECT_EQ(c.stats().checkpoint_bytes, kBlock);
  c.Unpin(pinned->id);
  put(140, 2);  // demotes 139, the least recently used now
  EXPECT_TRUE(c.Contains({1, 2, Key::FromU64(138)}));
  EXPECT_FALSE(c.Contains({1, 2, Key::FromU64(139)}));
  // Another namespace's group 2 is not a checkpoint group.
  for (uint64_t v = 200; v < 204; ++v) {
    const ObjectId id{7, 2, Key::FromU64(v)};
    auto view = c.BeginAssembly(id, kBlock, 1);
    ASSERT_TRUE(view.ok());
    const uint32_t part = 0;
    ASSERT_TRUE(*c.CompleteParts(*view, {&part, 1}));
    auto wb = c.TakeWriteback(id);
    c.FinishWriteback(*wb, true);
    EXPECT_TRUE(c.Contains(id));
  }
}

}  // namespace
}  // namespace orbitkv

namespace orbitkv {
namespace {

// The sanitizers' runtimes turn mlock into a no-op (ASan: "ignores
// mlock/mlockall/munlock/munlockall"), so VmLck cannot show the lock there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kMlockIsReal = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kMlockIsReal = false;
#else
constexpr bool kMlockIsReal = true;
#endif
#else
constexpr bool kMlockIsReal = true;
#endif

uint64_t LockedKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// The pool is locked on several threads (one thread took up to 80 s for a
// 4 GB pool on a busy machine): every page of every part ends up locked.
TEST(LockMemoryTest, LocksEveryPartOnSeveralThreads) {
  if (!kMlockIsReal) GTEST_SKIP() << "mlock is a no-op under this sanitizer";
  constexpr uint64_t kBytes = 64ull << 20;
  void* base = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  const uint64_t before = LockedKiB();
  Result<uint32_t> threads =
      LockMemory(base, kBytes, {/*max_threads=*/4, /*min_part_bytes=*/4 << 20});
  if (!threads.ok()) {
    ::munmap(base, kBytes);
    GTEST_SKIP() << "this process may not lock 64 MiB: " << threads.status().ToString();
  }
  EXPECT_EQ(*threads, std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_GE(LockedKiB() - before, kBytes / 1024);
  ::munlock(base, kBytes);
  EXPECT_LT(LockedKiB(), before + kBytes / 1024);
  ::munmap(base, kBytes);
}

// A size that does not split evenly: the last part is shorter, none past the end.
TEST(LockMemoryTest, UnevenSizeLocksExactlyTheRange) {
  if (!kMlockIsReal) GTEST_SKIP() << "mlock is a no-op under this sanitizer";
  constexpr uint64_t kBytes = (10ull << 20) + 4096 * 3;
  void* base = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  const uint64_t before = LockedKiB();
  Result<uint32_t> threads =
      LockMemory(base, kBytes, {/*max_threads=*/3, /*min_part_bytes=*/1 << 20});
  if (!threads.ok()) {
    ::munmap(base, kBytes);
    GTEST_SKIP() << threads.status().ToString();
  }
  EXPECT_EQ(LockedKiB() - before, kBytes / 1024);
  ::munlock(base, kBytes);
  ::munmap(base, kBytes);
}

}  // namespace
}  // namespace orbitkv
