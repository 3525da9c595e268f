#include "store/catalog.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/flat_index.h"
#include "orbitkv/units.h"

namespace orbitkv {
namespace {

// kDropped: published, then found damaged (Drop); kept only while pinned.
enum class ExtentState : uint8_t { kWriting, kPublished, kDropped };

struct Extent {
  uint32_t shard = 0;
  uint64_t offset = 0;  // its key in its ring's map
  uint64_t length = 0;
  uint64_t object_size = 0;
  uint64_t generation = 0;
  Key key;
  uint64_t tag = 0;
  ExtentState state = ExtentState::kWriting;
  // A writing extent whose tag DropTag cleared: its Publish aborts it.
  bool cleared = false;
  uint32_t pin_count = 0;  // one per (lease, ref) naming this extent
};

// One shard's ring: extents keyed by offset, never overlapping.
struct Ring {
  uint64_t head = 0;  // where the next reservation starts, unless it must wrap
  std::map<uint64_t, Extent> extents;
};

// Open reservations of one key, and the newest generation of it published
// while any of them was open.
struct KeyWriters {
  uint32_t open = 0;
  uint64_t newest_published = 0;
};

// A lease holds its extents by address: a pinned extent is never erased (nor
// is any extent while a lease lives, Clear() aside, which requires none).
struct Lease {
  LeaseId id = 0;
  SessionId session = 0;
  std::vector<Extent*> extents;  // kept (with its capacity) when the lease is recycled
  uint32_t pending = 0;
  uint32_t submitted = 0;
  Clock::TimePoint deadline{};
};

ExtentRef MakeRef(const Extent& e) {
  return ExtentRef{e.shard, e.offset, e.length, e.object_size, e.generation};
}

// The indexes (common/flat_index.h): the directory over published extents,
// by key; the live leases, by id.
struct ExtentByKey {
  using Key = orbitkv::Key;
  static const Key& KeyOf(const Extent& e) { return e.key; }
  static uint64_t Hash(const Key& k) { return KeyHash{}(k); }
};
struct LeaseById {
  using Key = LeaseId;
  static const Key& KeyOf(const Lease& l) { return l.id; }
  static uint64_t Hash(const Key& id) { return id; }
};

}  // namespace

struct SsdCatalog::Impl {
  explicit Impl(const CatalogOptions& o) : options(o), rings(o.shards) {}

  // Constant after construction.
  const CatalogOptions options;

  mutable std::mutex mu;
  // Everything below is guarded by mu. Helpers below REQUIRE mu held.
  std::vector<Ring> rings;
  // key -> its current published extent (in its ring). Flat: a chain query
  // looks up every key of an SSD-resident prefix here.
  FlatIndex<Extent, ExtentByKey> directory;
  // Keys with open reservations only, so bounded by writing extents.
  std::unordered_map<Key, KeyWriters, KeyHash> open_writers;
  // The live ones, in lease_slab; at its peak size, as the slab is (a query
  // of thousands of SSD blocks fills it and its release empties it).
  FlatIndex<Lease, LeaseById> leases{FlatIndex<Lease, LeaseById>::Shrink::kKeepPeak};
  // Every Lease ever allocated (a deque never moves its elements); the ones
  // not live are in free_leases, reused before the slab grows, so a query of
  // thousands of SSD blocks allocates nothing per lease once warm. It keeps
  // the peak number of live leases (about 80 bytes each) until Clear().
  std::deque<Lease> lease_slab;
  std::vector<Lease*> free_leases;
  uint32_t cursor = 0;           // first shard the next Reserve tries
  uint64_t next_generation = 1;  // never reset, so refs from before Clear() stay stale
  LeaseId next_lease = 1;
  // Gauges maintained incrementally so stats() is O(1) on a large cache.
  uint64_t published_bytes = 0;
  uint64_t writing_extents = 0;
  uint64_t writing_bytes = 0;
  uint64_t pending_interests = 0;
  uint64_t submitted_interests = 0;
  uint64_t pinned_extents = 0;
  uint64_t pinned_bytes = 0;
  CatalogStats counters;  // only the cumulative fields are used

  // The extent ref names at ref's generation, or null. REQUIRES: mu held.
  Extent* FindExtent(const ExtentRef& ref) {
    if (ref.shard >= rings.size()) return nullptr;
    auto& extents = rings[ref.shard].extents;
    auto it = extents.find(ref.offset);
    if (it == extents.end() || it->second.generation != ref.generation) return nullptr;
    return &it->second;
  }

  bool IsCurrentLocked(const ExtentRef& ref) {
    const Extent* e = FindExtent(ref);
    return e != nullptr && e->state == ExtentState::kPublished;
  }

  // Tries to place a len-byte extent in `shard`. Returns the offset, or nullopt
  // if the range it would take holds a writing or pinned extent. REQUIRES: mu held.
  std::optional<uint64_t> TryPlace(uint32_t shard, const Key& key, uint64_t tag,
                                   uint64_t object_size, uint64_t len, uint64_t generation) {
    Ring& ring = rings[shard];
    uint64_t start = ring.head;
    if (start + len > options.shard_capacity) start = 0;
    const uint64_t end = start + len;

    // The first extent that may overlap [start, end): the one before `start`
    // when it reaches past `start`, else the first at or after `start`. (Ring
    // placement never leaves an extent straddling the head; this keeps the
    // search right without relying on that.)
    auto first = ring.extents.lower_bound(start);
    if (first != ring.extents.begin()) {
      auto prev = std::prev(first);
      if (prev->first + prev->second.length > start) first = prev;
    }
    auto last = first;
    for (; last != ring.extents.end() && last->first < end; ++last) {
      const Extent& e = last->second;
      if (e.state == ExtentState::kWriting || e.pin_count > 0) return std::nullopt;
    }

    for (auto it = first; it != last; ++it) {
      const Extent& e = it->second;  // published and unpinned (dropped ones are erased then)
      ++counters.evictions;
      if (directory.Remove(&e)) published_bytes -= e.length;  // it was the key's current one
    }
    ring.extents.erase(first, last);
    ring.extents.emplace(start, Extent{shard, start, len, object_size, generation, key, tag,
                                       ExtentState::kWriting, false, 0});
    ring.head = end;
    return start;
  }

  // Ends one open reservation of the key `it` names.
  void DropWriter(std::unordered_map<Key, KeyWriters, KeyHash>::iterator it) {
    if (--it->second.open == 0) open_writers.erase(it);
  }

  // Drops the writing extent `e` at (shard, offset): Abort, or a Publish
  // whose tag DropTag cleared.
  void AbortLocked(uint32_t shard, uint64_t offset, const Extent& e) {
    --writing_extents;
    writing_bytes -= e.length;
    ++counters.aborts;
    DropWriter(open_writers.find(e.key));
    rings[shard].extents.erase(offset);
  }

  void PinExtent(Extent* e) {
    if (e->pin_count++ == 0) {
      ++pinned_extents;
      pinned_bytes += e->length;
    }
  }

  void UnpinExtent(Extent* e) {
    if (--e->pin_count == 0) {
      --pinned_extents;
      pinned_bytes -= e->length;
      // A dropped extent's range is free once no lease pins it.
      if (e->state == ExtentState::kDropped) rings[e->shard].extents.erase(e->offset);
    }
  }

  // Drop of the published extent `it` (in its ring). REQUIRES: it is published.
  // Returns whether it left the directory.
  bool DropLocked(std::map<uint64_t, Extent>::iterator it) {
    Extent& e = it->second;
    ++counters.dropped_extents;
    const bool listed = directory.Remove(&e);
    if (listed) published_bytes -= e.length;
    if (e.pin_count == 0) {
      rings[e.shard].extents.erase(it);
    } else {
      e.state = ExtentState::kDropped;  // erased by the last Unpin
    }
    return listed;
  }

  // A new live lease with no extents yet; the caller pins and adds them.
  Lease& NewLeaseLocked(const LeaseSpec& spec) {
    Lease* l;
    if (free_leases.empty()) {
      l = &lease_slab.emplace_back();
    } else {
      l = free_leases.back();
      free_leases.pop_back();
    }
    l->id = next_lease++;
    l->session = spec.session;
    l->extents.clear();
    l->pending = spec.interests;
    l->submitted = 0;
    l->deadline = spec.deadline;
    leases.Put(l);
    pending_interests += spec.interests;
    return *l;
  }

  // Pins `e` for `l`.
  void AddExtent(Lease& l, Extent* e) {
    PinExtent(e);
    l.extents.push_back(e);
  }

  // Unpins the lease's extents and forgets it once no interest remains.
  void MaybeRelease(Lease& l) {
    if (l.pending + l.submitted > 0) return;
    for (Extent* e : l.extents) UnpinExtent(e);
    leases.Remove(&l);
    l.extents.clear();
    free_leases.push_back(&l);
  }

  // Drops a lease's pending interests; returns how many. May release the lease.
  uint32_t DropPending(Lease& l) {
    const uint32_t n = l.pending;
    l.pending = 0;
    pending_interests -= n;
    MaybeRelease(l);
    return n;
  }

  // The live leases that `pick` selects (collected first: releasing one
  // changes the index).
  template <typename Pred>
  std::vector<Lease*> LeasesWhere(Pred pick) const {
    std::vector<Lease*> out;
    leases.ForEach([&](Lease* l) {
      if (pick(*l)) out.push_back(l);
    });
    return out;
  }
};

Result<std::unique_ptr<SsdCatalog>> SsdCatalog::Create(const CatalogOptions& options) {
  if (options.shards == 0) return Status::InvalidArgument("ssd catalog: shards must be >= 1");
  if (options.shard_capacity == 0 || options.shard_capacity % kExtentAlign != 0) {
    return Status::InvalidArgument(
        "ssd catalog: shard_capacity " + std::to_string(options.shard_capacity) +
        " must be a positive multiple of " + std::to_string(kExtentAlign));
  }
  if (options.clock == nullptr) return Status::InvalidArgument("ssd catalog: clock is null");
  return std::unique_ptr<SsdCatalog>(new SsdCatalog(std::make_unique<Impl>(options)));
}

SsdCatalog::SsdCatalog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SsdCatalog::~SsdCatalog() = default;

Result<ExtentRef> SsdCatalog::Reserve(const Key& key, uint64_t object_size, uint64_t tag) {
  Impl& s = *impl_;
  const uint64_t capacity = s.options.shard_capacity;
  // Compare before aligning: AlignUp would overflow near 2^64.
  if (object_size == 0 || object_size > capacity) {
    return Status::InvalidArgument("ssd catalog: object size " + std::to_string(object_size) +
                                   " must be in [1, shard capacity " + std::to_string(capacity) +
                                   "]");
  }
  const uint64_t len = AlignUp(object_size, kExtentAlign);  // <= capacity: capacity is aligned

  std::lock_guard lock(s.mu);
  const uint32_t shards = s.options.shards;
  const uint32_t first = s.cursor;
  s.cursor = (s.cursor + 1) % shards;
  for (uint32_t i = 0; i < shards; ++i) {
    const uint32_t shard = (first + i) % shards;
    const uint64_t generation = s.next_generation;
    std::optional<uint64_t> offset = s.TryPlace(shard, key, tag, object_size, len, generation);
    if (!offset) {
      ++s.counters.shard_skips;
      continue;
    }
    ++s.next_generation;
    ++s.open_writers[key].open;
    ++s.counters.reservations;
    ++s.writing_extents;
    s.writing_bytes += len;
    return ExtentRef{shard, *offset, len, object_size, generation};
  }
  ++s.counters.pinned_write_skips;
  return Status::Busy("ssd catalog: no room for a " + std::to_string(len) + "-byte extent: all " +
                      std::to_string(shards) +
                      " shards are pinned by leases or in-flight writes at their ring head");
}

Status SsdCatalog::Publish(const ExtentRef& ref) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  Extent* e = s.FindExtent(ref);
  if (e == nullptr || e->state != ExtentState::kWriting) {
    return Status::FailedPrecondition("ssd catalog: publish of shard " + std::to_string(ref.shard) +
                                      " offset " + std::to_string(ref.offset) + " generation " +
                                      std::to_string(ref.generation) + ": not an open reservation");
  }
  if (e->cleared) {
    // Its namespace was cleared while the bytes were written: publishing it
    // would bring back an object the clear dropped.
    s.AbortLocked(ref.shard, ref.offset, *e);
    return Status::Cancelled("ssd catalog: publish of shard " + std::to_string(ref.shard) +
                             " offset " + std::to_string(ref.offset) +
                             ": its namespace was cleared while it was written");
  }
  e->state = ExtentState::kPublished;
  --s.writing_extents;
  s.writing_bytes -= e->length;
  ++s.counters.publishes;
  const ExtentRef current = MakeRef(*e);
  auto writers = s.open_writers.find(e->key);
  // A later reservation of this key published first (it may be evicted since):
  // this one is dead at once, so the key's generation never goes back.
  const bool superseded = current.generation < writers->second.newest_published;
  writers->second.newest_published = std::max(writers->second.newest_published, current.generation);
  s.DropWriter(writers);
  if (superseded) return Status::OK();
  // The old extent stays in its ring, readable by leases, until overwritten.
  if (const Extent* old = s.directory.Put(e)) s.published_bytes -= old->length;
  s.published_bytes += current.length;
  return Status::OK();
}

void SsdCatalog::Abort(const ExtentRef& ref) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  Extent* e = s.FindExtent(ref);
  if (e == nullptr || e->state != ExtentState::kWriting) return;
  s.AbortLocked(ref.shard, ref.offset, *e);
}

bool SsdCatalog::Drop(const ExtentRef& ref) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (!s.IsCurrentLocked(ref)) return false;
  s.DropLocked(s.rings[ref.shard].extents.find(ref.offset));
  return true;
}

size_t SsdCatalog::DropTag(uint64_t tag) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  size_t listed = 0;
  for (uint32_t shard = 0; shard < s.rings.size(); ++shard) {
    auto& extents = s.rings[shard].extents;
    for (auto it = extents.begin(); it != extents.end();) {
      auto next = std::next(it);  // DropLocked may erase `it`
      Extent& e = it->second;
      if (e.tag == tag && e.state == ExtentState::kPublished) {
        listed += s.DropLocked(it);
      } else if (e.tag == tag && e.state == ExtentState::kWriting) {
        e.cleared = true;  // its Publish aborts it
      }
      it = next;
    }
  }
  return listed;
}

std::optional<ExtentRef> SsdCatalog::Lookup(const Key& key) const {
  std::lock_guard lock(impl_->mu);
  const Extent* e = impl_->directory.Find(key);
  if (e == nullptr) return std::nullopt;
  return MakeRef(*e);
}

bool SsdCatalog::IsCurrent(const ExtentRef& ref) const {
  std::lock_guard lock(impl_->mu);
  return impl_->IsCurrentLocked(ref);
}

Result<LeaseId> SsdCatalog::AcquireLease(std::span<const ExtentRef> refs, const LeaseSpec& spec) {
  if (refs.empty()) return Status::InvalidArgument("ssd catalog: lease needs at least one extent");
  if (spec.interests == 0) return Status::InvalidArgument("ssd catalog: lease needs interests > 0");
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  // Every ref current before anything is pinned, each looked up once. The
  // common lease (Prepare's, per block) has one extent: no heap allocation.
  constexpr size_t kInline = 8;
  std::array<Extent*, kInline> inline_extents;
  std::vector<Extent*> heap_extents;
  if (refs.size() > kInline) heap_extents.resize(refs.size());
  const std::span<Extent*> extents = refs.size() > kInline
                                         ? std::span<Extent*>(heap_extents)
                                         : std::span<Extent*>(inline_extents).first(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    const ExtentRef& ref = refs[i];
    Extent* e = s.FindExtent(ref);
    if (e == nullptr || e->state != ExtentState::kPublished) {
      return Status::NotFound("ssd catalog: extent shard " + std::to_string(ref.shard) +
                              " offset " + std::to_string(ref.offset) + " generation " +
                              std::to_string(ref.generation) + " is no longer current");
    }
    extents[i] = e;
  }
  Lease& l = s.NewLeaseLocked(spec);
  for (Extent* e : extents) s.AddExtent(l, e);
  return l.id;
}

std::optional<SsdCatalog::Leased> SsdCatalog::LookupAndLease(const Key& key,
                                                             const LeaseSpec& spec) {
  assert(spec.interests > 0);
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  Extent* e = s.directory.Find(key);  // published: Drop takes it out first
  if (e == nullptr) return std::nullopt;
  assert(e->state == ExtentState::kPublished);
  Lease& l = s.NewLeaseLocked(spec);
  s.AddExtent(l, e);
  return Leased{MakeRef(*e), l.id};
}

namespace {
Status LeaseGone(LeaseId lease) {
  return Status::FailedPrecondition("ssd catalog: lease " + std::to_string(lease) +
                                    " is gone (expired, cancelled or released)");
}
}  // namespace

Status SsdCatalog::Submit(LeaseId lease, uint32_t n) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  Lease* found = s.leases.Find(lease);
  if (found == nullptr) return LeaseGone(lease);
  Lease& l = *found;
  if (l.pending < n) {
    return Status::FailedPrecondition("ssd catalog: lease " + std::to_string(lease) + " has " +
                                      std::to_string(l.pending) + " pending interests, " +
                                      std::to_string(n) + " requested");
  }
  l.pending -= n;
  l.submitted += n;
  s.pending_interests -= n;
  s.submitted_interests += n;
  return Status::OK();
}

Status SsdCatalog::KeepUntilDone(LeaseId lease) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  Lease* l = s.leases.Find(lease);
  if (l == nullptr) return LeaseGone(lease);
  l->deadline = Clock::TimePoint{};
  return Status::OK();
}

void SsdCatalog::Complete(LeaseId lease, uint32_t n) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  Lease* l = s.leases.Find(lease);
  if (l == nullptr) return;
  const uint32_t dropped = std::min(n, l->submitted);
  l->submitted -= dropped;
  s.submitted_interests -= dropped;
  s.MaybeRelease(*l);
}

void SsdCatalog::Cancel(LeaseId lease) { CancelMany({&lease, 1}); }

void SsdCatalog::CancelMany(std::span<const LeaseId> leases) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  for (LeaseId lease : leases) {
    if (Lease* l = s.leases.Find(lease)) s.DropPending(*l);
  }
}

size_t SsdCatalog::ExpireLeases() {
  Impl& s = *impl_;
  const Clock::TimePoint now = s.options.clock->Now();
  std::lock_guard lock(s.mu);
  size_t expired = 0;
  for (Lease* l : s.LeasesWhere([&](const Lease& l) {
         return l.deadline != Clock::TimePoint{} && now >= l.deadline && l.pending > 0;
       })) {
    expired += s.DropPending(*l);
  }
  s.counters.expired_interests += expired;
  return expired;
}

void SsdCatalog::ReleaseSession(SessionId session) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  for (Lease* l : s.LeasesWhere([&](const Lease& l) { return l.session == session; })) {
    s.DropPending(*l);
  }
}

std::vector<ExtentRef> SsdCatalog::LeaseExtents(LeaseId lease) const {
  std::lock_guard lock(impl_->mu);
  const Lease* l = impl_->leases.Find(lease);
  if (l == nullptr) return {};
  std::vector<ExtentRef> refs;
  refs.reserve(l->extents.size());
  for (const Extent* e : l->extents) refs.push_back(MakeRef(*e));
  return refs;
}

void SsdCatalog::Clear() {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  s.directory.Clear();  // before the extents it points at
  s.leases.Clear();
  for (Ring& ring : s.rings) ring = Ring{};
  s.open_writers.clear();
  s.lease_slab.clear();
  s.free_leases.clear();
  s.cursor = 0;
  s.published_bytes = s.writing_extents = s.writing_bytes = 0;
  s.pending_interests = s.submitted_interests = 0;
  s.pinned_extents = s.pinned_bytes = 0;
  s.counters = CatalogStats{};
  // next_generation and next_lease keep counting: a ref or lease id from before
  // Clear() must never name something created after it.
}

CatalogStats SsdCatalog::stats() const {
  const Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  CatalogStats out = s.counters;
  out.published_objects = s.directory.size();
  out.published_bytes = s.published_bytes;
  out.writing_extents = s.writing_extents;
  out.writing_bytes = s.writing_bytes;
  out.active_leases = s.leases.size();
  out.pending_interests = s.pending_interests;
  out.submitted_interests = s.submitted_interests;
  out.pinned_extents = s.pinned_extents;
  out.pinned_bytes = s.pinned_bytes;
  return out;
}

const CatalogOptions& SsdCatalog::options() const { return impl_->options; }

}  // namespace orbitkv
