// Randomised model test for SsdCatalog: random operation sequences over small
// shards, checked step by step against an independent reference model (plain
// vectors and linear scans), plus a multithreaded smoke test for TSan.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "orbitkv/units.h"
#include "store/catalog.h"

namespace orbitkv {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr uint64_t kShardCapacity = 64 * 1024;
constexpr uint64_t kMaxObject = 20000;
constexpr uint64_t kKeys = 48;
constexpr size_t kMaxLeases = 24;

// What the model believes one live extent (in the catalog's rings) is.
struct ModelExtent {
  ExtentRef ref;
  Key key;
  bool published = false;
  bool superseded = false;  // a newer reservation of the key published first
  uint32_t pins = 0;
};

struct ModelLease {
  SessionId session = 0;
  std::vector<ExtentRef> refs;
  uint32_t pending = 0;
  uint32_t submitted = 0;
  Clock::TimePoint deadline{};
};

bool SameExtent(const ExtentRef& a, const ExtentRef& b) {
  return a.shard == b.shard && a.offset == b.offset && a.generation == b.generation;
}

bool Overlaps(const ExtentRef& e, uint64_t start, uint64_t end) {
  return e.offset < end && start < e.offset + e.length;
}

// The reference model. It knows the placement rule (ring head, wrap to 0,
// round-robin cursor) but none of the catalog's data structures.
class Model {
 public:
  explicit Model(uint32_t shards) : rings_(shards), heads_(shards, 0) {}

  // Where Reserve must place `len` bytes: (shard, offset), or nullopt for Busy.
  // Also records the expected skip counters.
  std::optional<std::pair<uint32_t, uint64_t>> Place(uint64_t len) {
    const uint32_t shards = static_cast<uint32_t>(rings_.size());
    const uint32_t first = cursor_;
    cursor_ = (cursor_ + 1) % shards;
    for (uint32_t i = 0; i < shards; ++i) {
      const uint32_t s = (first + i) % shards;
      uint64_t start = heads_[s];
      if (start + len > kShardCapacity) start = 0;
      bool blocked = false;
      for (const ModelExtent& e : rings_[s]) {
        if (Overlaps(e.ref, start, start + len) && (!e.published || e.pins > 0)) blocked = true;
      }
      if (!blocked) return std::make_pair(s, start);
      ++expected.shard_skips;
    }
    ++expected.pinned_write_skips;
    return std::nullopt;
  }

  // Applies a successful reservation; checks nothing writing or pinned is lost.
  void ApplyReserve(const ExtentRef& ref, const Key& key) {
    auto& ring = rings_[ref.shard];
    for (auto it = ring.begin(); it != ring.end();) {
      if (!Overlaps(it->ref, ref.offset, ref.offset + ref.length)) {
        ++it;
        continue;
      }
      EXPECT_TRUE(it->published) << "a reservation overwrote a writing extent";
      EXPECT_EQ(it->pins, 0u) << "a reservation overwrote a pinned extent";
      ++expected.evictions;
      auto cur = current.find(it->key);
      if (cur != current.end() && SameExtent(cur->second, it->ref)) current.erase(cur);
      it = ring.erase(it);
    }
    for (const ModelExtent& e : ring) {
      EXPECT_FALSE(Overlaps(e.ref, ref.offset, ref.offset + ref.length)) << "overlap";
    }
    ring.push_back(ModelExtent{ref, key});
    heads_[ref.shard] = ref.offset + ref.length;
    ++expected.reservations;
  }

  ModelExtent* Find(const ExtentRef& ref) {
    if (ref.shard >= rings_.size()) return nullptr;
    for (ModelExtent& e : rings_[ref.shard]) {
      if (e.ref == ref) return &e;
    }
    return nullptr;
  }

  bool IsCurrent(const ExtentRef& ref) {
    const ModelExtent* e = Find(ref);
    return e != nullptr && e->published;
  }

  void ApplyPublish(const ExtentRef& ref) {
    ModelExtent* e = Find(ref);
    e->published = true;
    // Publishing supersedes the key's older open reservations: they will
    // publish dead, so the key's generation never goes back.
    for (auto& ring : rings_) {
      for (ModelExtent& other : ring) {
        if (!other.published && other.key == e->key && other.ref.generation < ref.generation) {
          other.superseded = true;
        }
      }
    }
    if (!e->superseded) {
      auto it = current.find(e->key);
      if (it != current.end()) {
        EXPECT_LT(it->second.generation, ref.generation);
      }
      current[e->key] = ref;
    }
    ++expected.publishes;
  }

  void ApplyAbort(const ExtentRef& ref) {
    auto& ring = rings_[ref.shard];
    ring.erase(
        std::find_if(ring.begin(), ring.end(), [&](const ModelExtent& e) { return e.ref == ref; }));
    ++expected.aborts;
  }

  void ApplyLease(LeaseId id, ModelLease lease) {
    for (const ExtentRef& r : lease.refs) ++Find(r)->pins;
    EXPECT_TRUE(leases.emplace(id, std::move(lease)).second) << "lease id reused";
  }

  void MaybeRelease(LeaseId id) {
    auto it = leases.find(id);
    if (it == leases.end() || it->second.pending + it->second.submitted > 0) return;
    for (const ExtentRef& r : it->second.refs) --Find(r)->pins;
    leases.erase(it);
  }

  // Expected gauges, computed from scratch.
  CatalogStats Gauges() const {
    CatalogStats g;
    g.published_objects = current.size();
    for (const auto& [key, ref] : current) g.published_bytes += ref.length;
    for (const auto& ring : rings_) {
      for (const ModelExtent& e : ring) {
        if (!e.published) {
          ++g.writing_extents;
          g.writing_bytes += e.ref.length;
        }
        if (e.pins > 0) {
          ++g.pinned_extents;
          g.pinned_bytes += e.ref.length;
        }
      }
    }
    g.active_leases = leases.size();
    for (const auto& [id, l] : leases) {
      g.pending_interests += l.pending;
      g.submitted_interests += l.submitted;
    }
    return g;
  }

  std::vector<ExtentRef> AllExtents() const {
    std::vector<ExtentRef> out;
    for (const auto& ring : rings_) {
      for (const ModelExtent& e : ring) out.push_back(e.ref);
    }
    return out;
  }

  std::map<Key, ExtentRef> current;  // the directory as the model sees it
  std::map<LeaseId, ModelLease> leases;
  CatalogStats expected;  // cumulative counters only

 private:
  std::vector<std::vector<ModelExtent>> rings_;
  std::vector<uint64_t> heads_;
  uint32_t cursor_ = 0;
};

void ExpectStatsMatch(const CatalogStats& got, const Model& model) {
  const CatalogStats want = model.Gauges();
  EXPECT_EQ(got.published_objects, want.published_objects);
  EXPECT_EQ(got.published_bytes, want.published_bytes);
  EXPECT_EQ(got.writing_extents, want.writing_extents);
  EXPECT_EQ(got.writing_bytes, want.writing_bytes);
  EXPECT_EQ(got.active_leases, want.active_leases);
  EXPECT_EQ(got.pending_interests, want.pending_interests);
  EXPECT_EQ(got.submitted_interests, want.submitted_interests);
  EXPECT_EQ(got.pinned_extents, want.pinned_extents);
  EXPECT_EQ(got.pinned_bytes, want.pinned_bytes);
  const CatalogStats& c = model.expected;
  EXPECT_EQ(got.reservations, c.reservations);
  EXPECT_EQ(got.publishes, c.publishes);
  EXPECT_EQ(got.aborts, c.aborts);
  EXPECT_EQ(got.evictions, c.evictions);
  EXPECT_EQ(got.pinned_write_skips, c.pinned_write_skips);
  EXPECT_EQ(got.shard_skips, c.shard_skips);
  EXPECT_EQ(got.expired_interests, c.expired_interests);
}

class Runner {
 public:
  explicit Runner(uint64_t seed)
      : rng_(seed), shards_(2 + static_cast<uint32_t>(seed % 2)), model_(shards_) {
    CatalogOptions o;
    o.shards = shards_;
    o.shard_capacity = kShardCapacity;
    o.clock = &clock_;
    auto c = SsdCatalog::Create(o);
    EXPECT_TRUE(c.ok());
    catalog_ = std::move(c).value();
  }

  void Run(int ops) {
    for (int i = 0; i < ops && !::testing::Test::HasFailure(); ++i) {
      const uint64_t dice = Uniform(0, 99);
      if (dice < 24) {
        DoReserve();
      } else if (dice < 42) {
        DoPublish();
      } else if (dice < 46) {
        DoAbort();
      } else if (dice < 58) {
        DoLookup(Key::FromU64(Uniform(0, kKeys - 1)));
      } else if (dice < 70) {
        DoAcquireLease();
      } else if (dice < 78) {
        DoSubmit();
      } else if (dice < 86) {
        DoComplete();
      } else if (dice < 90) {
        DoCancel();
      } else if (dice < 95) {
        DoExpire();
      } else if (dice < 97) {
        DoReleaseSession();
      } else {
        DoBadPublish();
      }
      CheckLeasedRefsStayCurrent();
      ExpectStatsMatch(catalog_->stats(), model_);
      if (i % 64 == 0) CheckEverything();
    }
    CheckEverything();
    Drain();
  }

 private:
  uint64_t Uniform(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }
  template <typename Map>
  auto PickFrom(Map& m) {
    auto it = m.begin();
    std::advance(it, Uniform(0, m.size() - 1));
    return it;
  }
  void Remember(const ExtentRef& ref) {
    if (history_.size() < 256) {
      history_.push_back(ref);
    } else {
      history_[Uniform(0, history_.size() - 1)] = ref;
    }
  }

  void DoReserve() {
    const Key key = Key::FromU64(Uniform(0, kKeys - 1));
    const uint64_t size =
        Uniform(0, 9) == 0 ? Uniform(1, 4) * kExtentAlign : Uniform(1, kMaxObject);
    const uint64_t len = AlignUp(size, kExtentAlign);
    auto want = model_.Place(len);
    auto got = catalog_->Reserve(key, size);
    if (!want) {
      ASSERT_EQ(got.status().code(), StatusCode::kBusy) << got.status().ToString();
      return;
    }
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const ExtentRef expect{want->first, want->second, len, size, ++last_generation_};
    ASSERT_EQ(*got, expect);
    ASSERT_EQ(got->offset % kExtentAlign, 0u);
    ASSERT_LE(got->offset + got->length, kShardCapacity);
    model_.ApplyReserve(*got, key);
    open_.push_back(*got);
    Remember(*got);
    EXPECT_FALSE(catalog_->IsCurrent(*got));
  }

  void DoPublish() {
    if (open_.empty()) return;
    const size_t i = Uniform(0, open_.size() - 1);
    const ExtentRef ref = open_[i];
    open_.erase(open_.begin() + i);
    ASSERT_TRUE(catalog_->Publish(ref).ok());
    model_.ApplyPublish(ref);
    EXPECT_TRUE(catalog_->IsCurrent(ref));
  }

  void DoAbort() {
    if (open_.empty()) return;
    const size_t i = Uniform(0, open_.size() - 1);
    const ExtentRef ref = open_[i];
    open_.erase(open_.begin() + i);
    catalog_->Abort(ref);
    model_.ApplyAbort(ref);
    catalog_->Abort(ref);  // a second abort is ignored
    EXPECT_FALSE(catalog_->IsCurrent(ref));
  }

  // Publishing anything but an open reservation fails and changes nothing.
  void DoBadPublish() {
    if (history_.empty()) return;
    const ExtentRef ref = history_[Uniform(0, history_.size() - 1)];
    if (std::find(open_.begin(), open_.end(), ref) != open_.end()) return;
    EXPECT_EQ(catalog_->Publish(ref).code(), StatusCode::kFailedPrecondition);
  }

  std::optional<ExtentRef> DoLookup(const Key& key) {
    const std::optional<ExtentRef> got = catalog_->Lookup(key);
    auto want = model_.current.find(key);
    if (want == model_.current.end()) {
      EXPECT_FALSE(got.has_value());
    } else {
      EXPECT_EQ(got, want->second);
    }
    if (got) {
      EXPECT_TRUE(catalog_->IsCurrent(*got));
      uint64_t& seen = last_seen_gen_[key];
      EXPECT_GE(got->generation, seen) << "a key's generation went backwards";
      seen = got->generation;
      Remember(*got);
    }
    return got;
  }

  void DoAcquireLease() {
    if (model_.leases.size() >= kMaxLeases) return;
    std::vector<ExtentRef> refs;
    const uint64_t n = Uniform(1, 3);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t how = Uniform(0, 99);
      if (how < 65) {
        if (auto r = DoLookup(Key::FromU64(Uniform(0, kKeys - 1)))) refs.push_back(*r);
      } else if (how < 90) {
        if (!history_.empty()) refs.push_back(history_[Uniform(0, history_.size() - 1)]);
      } else if (!open_.empty()) {
        refs.push_back(open_[Uniform(0, open_.size() - 1)]);  // writing: not leasable
      }
    }
    LeaseSpec spec;
    spec.session = Uniform(1, 4);
    spec.interests = static_cast<uint32_t>(Uniform(1, 3));
    // Whole milliseconds, so Now() often lands exactly on a deadline.
    if (Uniform(0, 1) == 0) spec.deadline = clock_.Now() + milliseconds(Uniform(1, 8));
    auto got = catalog_->AcquireLease(refs, spec);
    if (refs.empty()) {
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
      return;
    }
    const bool all_current = std::all_of(refs.begin(), refs.end(),
                                         [&](const ExtentRef& r) { return model_.IsCurrent(r); });
    if (!all_current) {
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
      return;
    }
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(catalog_->LeaseExtents(*got), refs);
    model_.ApplyLease(*got, ModelLease{spec.session, refs, spec.interests, 0, spec.deadline});
  }

  // A live lease id, or (sometimes) one that never existed or is gone.
  LeaseId PickLease() {
    if (model_.leases.empty() || Uniform(0, 19) == 0) return Uniform(0, 1) ? 0 : ~LeaseId{0};
    return PickFrom(model_.leases)->first;
  }

  void DoSubmit() {
    const LeaseId id = PickLease();
    const uint32_t n = static_cast<uint32_t>(Uniform(1, 3));
    const Status st = catalog_->Submit(id, n);
    auto it = model_.leases.find(id);
    if (it == model_.leases.end() || it->second.pending < n) {
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
      return;
    }
    EXPECT_TRUE(st.ok()) << st.ToString();
    it->second.pending -= n;
    it->second.submitted += n;
  }

  void DoComplete() {
    const LeaseId id = PickLease();
    const uint32_t n = static_cast<uint32_t>(Uniform(1, 3));
    catalog_->Complete(id, n);
    auto it = model_.leases.find(id);
    if (it == model_.leases.end()) return;
    it->second.submitted -= std::min(n, it->second.submitted);
    model_.MaybeRelease(id);
  }

  void DoCancel() {
    const LeaseId id = PickLease();
    catalog_->Cancel(id);
    auto it = model_.leases.find(id);
    if (it == model_.leases.end()) return;
    it->second.pending = 0;
    model_.MaybeRelease(id);
  }

  void DoExpire() {
    clock_.Advance(milliseconds(Uniform(0, 4)));
    const Clock::TimePoint now = clock_.Now();
    size_t want = 0;
    std::vector<LeaseId> touched;
    for (auto& [id, l] : model_.leases) {
      if (l.deadline != Clock::TimePoint{} && now >= l.deadline && l.pending > 0) {
        want += l.pending;
        l.pending = 0;
        touched.push_back(id);
      }
    }
    for (LeaseId id : touched) model_.MaybeRelease(id);
    model_.expected.expired_interests += want;
    EXPECT_EQ(catalog_->ExpireLeases(), want);
  }

  void DoReleaseSession() {
    const SessionId session = Uniform(1, 5);  // 5 never has leases
    catalog_->ReleaseSession(session);
    std::vector<LeaseId> touched;
    for (auto& [id, l] : model_.leases) {
      if (l.session == session) {
        l.pending = 0;
        touched.push_back(id);
      }
    }
    for (LeaseId id : touched) model_.MaybeRelease(id);
  }

  // Pinned extents are never overwritten: every leased ref stays current.
  void CheckLeasedRefsStayCurrent() {
    for (const auto& [id, l] : model_.leases) {
      for (const ExtentRef& r : l.refs) {
        ASSERT_TRUE(catalog_->IsCurrent(r)) << "leased extent lost, lease " << id;
      }
    }
  }

  // Full cross-check of the directory, every extent and every lease.
  void CheckEverything() {
    for (uint64_t k = 0; k < kKeys; ++k) DoLookup(Key::FromU64(k));
    for (const ExtentRef& r : model_.AllExtents()) {
      EXPECT_EQ(catalog_->IsCurrent(r), model_.IsCurrent(r));
    }
    for (const ExtentRef& r : history_) EXPECT_EQ(catalog_->IsCurrent(r), model_.IsCurrent(r));
    for (const auto& [id, l] : model_.leases) EXPECT_EQ(catalog_->LeaseExtents(id), l.refs);
  }

  // Releases everything; the gauges must return to zero.
  void Drain() {
    while (!model_.leases.empty()) {
      const LeaseId id = model_.leases.begin()->first;
      catalog_->Cancel(id);
      catalog_->Complete(id, model_.leases.begin()->second.submitted);
      model_.leases.erase(model_.leases.begin());
      EXPECT_TRUE(catalog_->LeaseExtents(id).empty());
    }
    for (const ExtentRef& r : open_) catalog_->Abort(r);
    const CatalogStats st = catalog_->stats();
    EXPECT_EQ(st.active_leases, 0u);
    EXPECT_EQ(st.pending_interests, 0u);
    EXPECT_EQ(st.submitted_interests, 0u);
    EXPECT_EQ(st.pinned_extents, 0u);
    EXPECT_EQ(st.pinned_bytes, 0u);
    EXPECT_EQ(st.writing_extents, 0u);
    EXPECT_EQ(st.writing_bytes, 0u);
    EXPECT_EQ(st.published_objects, model_.current.size());
    EXPECT_EQ(st.reservations, model_.expected.reservations);
    // The skip counters are the interesting part of a run: make sure the seed
    // exercised blocking, eviction and expiry.
    EXPECT_GT(st.pinned_write_skips, 0u);
    EXPECT_GT(st.shard_skips, 0u);
    EXPECT_GT(st.evictions, 0u);
    EXPECT_GT(st.expired_interests, 0u);
  }

  std::mt19937_64 rng_;
  const uint32_t shards_;
  ManualClock clock_;
  std::unique_ptr<SsdCatalog> catalog_;
  Model model_;
  std::vector<ExtentRef> open_;     // reserved, not yet published or aborted
  std::vector<ExtentRef> history_;  // refs seen at some point (many now stale)
  std::map<Key, uint64_t> last_seen_gen_;
  uint64_t last_generation_ = 0;
};

TEST(CatalogModelTest, RandomOperationsMatchReferenceModel) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Runner runner(seed);
    runner.Run(5000);
    if (::testing::Test::HasFailure()) return;
  }
}

// Four threads reserve, publish, lease, read and release against one catalog.
// The invariant checked under concurrency: a leased ref stays current until
// its lease is gone, whatever the other threads write.
TEST(CatalogModelTest, ConcurrentSmoke) {
  ManualClock clock;
  CatalogOptions o;
  o.shards = 3;
  o.shard_capacity = 256 * 1024;
  o.clock = &clock;
  auto created = SsdCatalog::Create(o);
  ASSERT_TRUE(created.ok());
  SsdCatalog& catalog = **created;
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 2500;
  std::atomic<uint64_t> lost_pins{0};
  std::atomic<uint64_t> leases_taken{0};
  std::latch start(kThreads);  // make the threads overlap

  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    auto uniform = [&](uint64_t lo, uint64_t hi) {
      return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
    };
    const SessionId session = t + 1;
    struct Held {
      LeaseId id;
      std::vector<ExtentRef> refs;
      bool submitted;
    };
    std::vector<Held> held;
    start.arrive_and_wait();
    auto release = [&](size_t i) {
      if (held[i].submitted) {
        catalog.Complete(held[i].id);
      } else {
        catalog.Cancel(held[i].id);
      }
      held.erase(held.begin() + i);
    };
    for (int i = 0; i < kOpsPerThread; ++i) {
      const uint64_t dice = uniform(0, 99);
      const Key key = Key::FromU64(uniform(0, 63));
      if (dice < 35) {
        auto r = catalog.Reserve(key, uniform(1, 40000));
        if (!r.ok()) continue;  // Busy: everything pinned right now
        if (uniform(0, 9) == 0) {
          catalog.Abort(*r);
        } else {
          EXPECT_TRUE(catalog.Publish(*r).ok());
        }
      } else if (dice < 60 && held.size() < 4) {
        auto ref = catalog.Lookup(key);
        if (!ref) continue;
        LeaseSpec spec{session, 1, {}};
        if (uniform(0, 3) == 0) spec.deadline = clock.Now() + microseconds(uniform(0, 200));
        auto lease = catalog.AcquireLease({&*ref, 1}, spec);
        if (!lease.ok()) continue;  // overwritten since the lookup
        leases_taken.fetch_add(1, std::memory_order_relaxed);
        held.push_back(Held{*lease, {*ref}, false});
      } else if (dice < 75 && !held.empty()) {
        Held& h = held[uniform(0, held.size() - 1)];
        if (!h.submitted) h.submitted = catalog.Submit(h.id).ok();  // may have expired
      } else if (dice < 90 && !held.empty()) {
        const size_t idx = uniform(0, held.size() - 1);
        // A submitted interest keeps the extent; a pending one may have expired.
        if (held[idx].submitted) {
          for (const ExtentRef& r : held[idx].refs) {
            if (!catalog.IsCurrent(r)) lost_pins.fetch_add(1);
          }
        }
        release(idx);
      } else if (dice < 95) {
        clock.Advance(microseconds(uniform(0, 50)));
        catalog.ExpireLeases();
      } else if (dice < 97) {
        catalog.ReleaseSession(session);  // submitted interests survive this
        std::erase_if(held, [](const Held& h) { return !h.submitted; });
      } else {
        (void)catalog.stats();
      }
    }
    while (!held.empty()) release(held.size() - 1);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(lost_pins.load(), 0u);
  EXPECT_GT(leases_taken.load(), 0u);
  const CatalogStats st = catalog.stats();
  EXPECT_EQ(st.active_leases, 0u);
  EXPECT_EQ(st.pending_interests, 0u);
  EXPECT_EQ(st.submitted_interests, 0u);
  EXPECT_EQ(st.pinned_extents, 0u);
  EXPECT_EQ(st.pinned_bytes, 0u);
  EXPECT_EQ(st.writing_extents, 0u);
  EXPECT_GT(st.publishes, 0u);
}

}  // namespace
}  // namespace orbitkv
