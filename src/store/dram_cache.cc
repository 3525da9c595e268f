#include "store/dram_cache.h"

#include <sys/mman.h>

#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "common/flat_index.h"
#include "common/intrusive_list.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/lock_memory.h"

namespace orbitkv {
namespace {

constexpr uint64_t kAlign = 4096;

std::string Describe(const ObjectId& id) {
  return "object ns=" + std::to_string(id.ns) + " group=" + std::to_string(id.group) +
         " key=" + id.key.ShortHex();
}

std::string ErrnoText(int err) {
  return std::system_category().message(err) + " (errno " + std::to_string(err) + ")";
}

// Free ranges of [0, capacity), 4 KiB granular. Best fit (smallest range that
// holds the request, lowest offset on ties) keeps large ranges whole; freeing
// coalesces with both neighbours, so the free map never holds two adjacent
// ranges. Every operation is O(log ranges). Not thread-safe.
class RangeAllocator {
 public:
  explicit RangeAllocator(uint64_t capacity) : free_bytes_(capacity) {
    if (capacity > 0) Insert(0, capacity);
  }

  // REQUIRES: len is a positive multiple of 4096.
  std::optional<uint64_t> Allocate(uint64_t len) {
    auto it = by_size_.lower_bound({len, 0});
    if (it == by_size_.end()) return std::nullopt;
    const auto [range_len, offset] = *it;
    by_size_.erase(it);
    by_offset_.erase(offset);
    if (range_len > len) Insert(offset + len, range_len - len);
    free_bytes_ -= len;
    return offset;
  }

  // REQUIRES: [offset, offset + len) was allocated and is not free.
  void Free(uint64_t offset, uint64_t len) {
    free_bytes_ += len;
    auto next = by_offset_.lower_bound(offset);
    assert(next == by_offset_.end() || next->first >= offset + len);
    if (next != by_offset_.end() && next->first == offset + len) {
      len += next->second;
      next = Erase(next);
    }
    if (next != by_offset_.begin()) {
      auto prev = std::prev(next);
      assert(prev->first + prev->second <= offset);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        len += prev->second;
        Erase(prev);
      }
    }
    Insert(offset, len);
  }

  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

 private:
  void Insert(uint64_t offset, uint64_t len) {
    by_offset_.emplace(offset, len);
    by_size_.emplace(len, offset);
  }
  std::map<uint64_t, uint64_t>::iterator Erase(std::map<uint64_t, uint64_t>::iterator it) {
    by_size_.erase({it->second, it->first});
    return by_offset_.erase(it);
  }

  std::map<uint64_t, uint64_t> by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
  uint64_t free_bytes_;
};

enum class EntryState { kAssembling, kSealed };

struct Entry {
  EntryId id = 0;
  ObjectId object;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t capacity = 0;
  EntryState state = EntryState::kAssembling;
  uint32_t pins = 0;
  std::vector<bool> parts;
  uint32_t parts_done = 0;
  uint32_t num_parts = 0;
  Clock::TimePoint started;
  bool writeback_pending = false;
  bool admitted = false;
  // Aborted or expired: out of the directory, freed at the last unpin.
  bool detached = false;
  // InsertSealed is copying bytes in outside the lock: nobody may join.
  bool inserting = false;
  // In the LRU (sealed, unpinned, admitted, not writeback-pending): an
  // intrusive list, so a pin and its unpin allocate nothing.
  ListHook<Entry> lru;
  // A checkpoint (DramCache::SetCheckpointGroups): while in the LRU, also in
  // the checkpoint LRU (intrusive too).
  bool checkpoint = false;
  ListHook<Entry> ckpt_lru;
  // Position in assembling_ (assembling, not detached, not inserting).
  bool in_assembling = false;
  std::list<Entry*>::iterator assembling_it;
};

struct Scratch {
  uint64_t offset = 0;
  uint64_t capacity = 0;
};

}  // namespace

// The two indexes over the entries (common/flat_index.h).
struct EntryById {
  using Key = EntryId;
  static const Key& KeyOf(const Entry& e) { return e.id; }
  static uint64_t Hash(const Key& id) { return id; }
};
struct EntryByObject {
  using Key = ObjectId;
  static const Key& KeyOf(const Entry& e) { return e.object; }
  static uint64_t Hash(const Key& id) { return ObjectIdHash{}(id); }
};

// How many keys ahead PinRun and UnpinMany load an entry (and twice that, its slot).
constexpr size_t kPrefetchAhead = 4;

using Lru = IntrusiveList<Entry, &Entry::lru>;
using CheckpointLru = IntrusiveList<Entry, &Entry::ckpt_lru>;

// All state behind one mutex. Methods named *Locked REQUIRE mu_ held.
struct DramCache::Impl {
  Impl(const DramCacheOptions& options, uint8_t* base)
      : options_(options), base_(base), capacity_(options.capacity), alloc_(options.capacity) {}

  ~Impl() {
    if (pinned_entries_ != 0 || !scratch_.empty()) {
      OKV_LOG_ERROR("DramCache destroyed with {} pinned entries ({}) and {} scratch buffers ({})",
                    pinned_entries_, FormatByteSize(pinned_bytes_), scratch_.size(),
                    FormatByteSize(scratch_bytes_));
      assert(false && "DramCache destroyed while in use");
    }
    entries_.ForEach([](Entry* e) { delete e; });
    if (options_.on_arena_release) options_.on_arena_release(base_);
    if (munmap(base_, capacity_) != 0) {
      OKV_LOG_ERROR("munmap of the DRAM pool failed: {}", ErrnoText(errno));
    }
  }

  DramView ViewOf(const Entry& e) const {
    return DramView{e.id, base_ + e.offset, e.size, e.capacity};
  }

  Entry* FindLocked(EntryId id) { return entries_.Find(id); }

  Entry* LookupLocked(const ObjectId& id) const { return directory_.Find(id); }

  // Returns the offset of `len` bytes (a multiple of 4096), evicting LRU
  // entries while no free range fits. Eviction is skipped when even evicting
  // everything evictable could not make room.
  Result<uint64_t> AllocateLocked(uint64_t len) {
    std::optional<uint64_t> offset;
    if (len <= capacity_) offset = alloc_.Allocate(len);
    if (!offset && len <= capacity_ && alloc_.free_bytes() + evictable_bytes_ >= len) {
      while (!offset && !lru_.empty()) {
        Entry* victim = lru_.front();
        ++evictions_;
        evicted_bytes_ += victim->capacity;
        FreeEntryLocked(*victim);
        if (alloc_.largest_free() >= len) offset = alloc_.Allocate(len);
      }
    }
    if (!offset) {
      ++alloc_failures_;
      return Status::ResourceExhausted(
          "DRAM pool full: " + FormatByteSize(len) + " requested, " +
          FormatByteSize(pinned_bytes_) + " pinned, " + std::to_string(writeback_pending_) +
          " entries awaiting writeback, " + FormatByteSize(scratch_bytes_) + " scratch, " +
          FormatByteSize(alloc_.free_bytes()) + " free (largest range " +
          FormatByteSize(alloc_.largest_free()) + ") of " + FormatByteSize(capacity_));
    }
    used_bytes_ += len;
    return *offset;
  }

  Entry& NewEntryLocked(const ObjectId& id, uint64_t offset, uint64_t size, uint64_t capacity,
                        uint32_t num_parts, bool inserting) {
    const EntryId eid = next_id_++;
    Entry& e = *new Entry;  // freed by FreeEntryLocked (or ~Impl)
    e.id = eid;
    entries_.Put(&e);
    e.object = id;
    e.offset = offset;
    e.size = size;
    e.capacity = capacity;
    e.num_parts = num_parts;
    e.parts.assign(num_parts, false);
    e.started = options_.clock->Now();
    e.inserting = inserting;
    if (auto c = ckpt_groups_.find(id.ns); c != ckpt_groups_.end() && id.group < 64) {
      e.checkpoint = (c->second >> id.group) & 1;
    }
    directory_.Put(&e);  // a replaced entry was detached by the caller
    ++assembling_entries_;
    if (!inserting) {
      e.assembling_it = assembling_.insert(assembling_.end(), &e);
      e.in_assembling = true;
    }
    return e;
  }

  void LruRemoveLocked(Entry& e) {
    if (!Lru::Linked(e)) return;
    lru_.Remove(e);
    evictable_bytes_ -= e.capacity;
    if (CheckpointLru::Linked(e)) {
      ckpt_lru_.Remove(e);
      ckpt_lru_bytes_ -= e.capacity;
    }
  }

  // A checkpoint joined the LRU: the least recently used checkpoints leave
  // until the rest fit checkpoint_capacity (possibly `e` itself).
  void AdmitCheckpointLocked(Entry& e) {
    ckpt_lru_.PushBack(e);
    ckpt_lru_bytes_ += e.capacity;
    while (ckpt_lru_bytes_ > options_.checkpoint_capacity && !ckpt_lru_.empty()) {
      Entry* victim = ckpt_lru_.front();
      ++checkpoints_demoted_;
      checkpoint_demoted_bytes_ += victim->capacity;
      FreeEntryLocked(*victim);
    }
  }

  // Pin's work: the sealed entry of `id`, pinned, or null. Not yet a use (UseLocked).
  Entry* PinSealedLocked(const ObjectId& id) {
    Entry* e = LookupLocked(id);
    if (e == nullptr || e->state != EntryState::kSealed) return nullptr;
    PinLocked(*e);  // leaves the LRU; rejoins at the MRU end on the last unpin
    return e;
  }

  // DramCache::PinRun over n ids, the i-th being id_at(i).
  template <typename IdAt>
  size_t PinRunOf(size_t n_ids, const IdAt& id_at,
                  const std::function<bool(size_t, const DramView&)>& keep) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t n = 0; n < n_ids; ++n) {
      // A long chain misses the cache at every slot and entry: load them ahead.
      if (n + 2 * kPrefetchAhead < n_ids) directory_.PrefetchSlot(id_at(n + 2 * kPrefetchAhead));
      if (n + kPrefetchAhead < n_ids) directory_.PrefetchElement(id_at(n + kPrefetchAhead));
      Entry* e = PinSealedLocked(id_at(n));
      if (e == nullptr) return n;
      if (!keep(n, ViewOf(*e))) {
        UnpinLocked(*e);
        return n;
      }
      UseLocked(*e);
    }
    return n_ids;
  }

  // A use of a pinned entry: under kReuse, a use while present is reuse.
  void UseLocked(Entry& e) {
    if (options_.admission != AdmissionPolicy::kReuse) return;
    GhostTouchLocked(e.object);
    e.admitted = true;
  }

  void PinLocked(Entry& e) {
    LruRemoveLocked(e);
    if (e.pins++ == 0) {
      ++pinned_entries_;
      pinned_bytes_ += e.capacity;
    }
  }

  void UnpinLocked(Entry& e) {
    if (e.pins == 0) {
      OKV_LOG_ERROR("DramCache: unpin of unpinned entry {} ({})", e.id, Describe(e.object));
      assert(false && "DramCache: unbalanced unpin");
      return;
    }
    if (--e.pins > 0) return;
    --pinned_entries_;
    pinned_bytes_ -= e.capacity;
    if (e.detached) {
      FreeEntryLocked(e);
    } else if (e.state == EntryState::kSealed && !e.writeback_pending) {
      SettleLocked(e);
    }
  }

  // A sealed, unpinned entry with no writeback pending: kept as an LRU
  // candidate if admitted, else dropped.
  void SettleLocked(Entry& e) {
    if (!e.admitted) {
      ++admission_rejects_;
      FreeEntryLocked(e);
      return;
    }
    lru_.PushBack(e);
    evictable_bytes_ += e.capacity;
    if (e.checkpoint) AdmitCheckpointLocked(e);  // may free `e`
  }

  // Takes an entry out of the directory so nobody finds or joins it.
  void DetachLocked(Entry& e) {
    directory_.Remove(&e);
    if (e.in_assembling) {
      assembling_.erase(e.assembling_it);
      e.in_assembling = false;
    }
    e.detached = true;
  }

  // Takes `e` out of the directory and the LRU for good (erased, discarded):
  // its memory goes now, or at the last unpin of whoever still holds it.
  void DropLocked(Entry& e) {
    if (e.writeback_pending) {  // never written now; a writer holding it finishes as usual
      e.writeback_pending = false;
      --writeback_pending_;
    }
    DetachLocked(e);
    LruRemoveLocked(e);
    if (e.pins == 0) FreeEntryLocked(e);
  }

  // by_insert: InsertSealed (restore/warm-up) always admits and never needs
  // writeback; CompleteParts follows the admission policy and writeback_on_seal.
  void SealLocked(Entry& e, bool by_insert) {
    e.state = EntryState::kSealed;
    e.inserting = false;
    --assembling_entries_;
    ++sealed_entries_;
    if (e.in_assembling) {
      assembling_.erase(e.assembling_it);
      e.in_assembling = false;
    }
    if (by_insert || options_.admission == AdmissionPolicy::kAll) {
      e.admitted = true;
    } else {
      e.admitted = GhostTouchLocked(e.object);
    }
    if (!by_insert && options_.writeback_on_seal) {
      e.writeback_pending = true;
      ++writeback_pending_;
    }
  }

  // Removes `e` everywhere and returns its memory. REQUIRES: e.pins == 0.
  void FreeEntryLocked(Entry& e) {
    assert(e.pins == 0);
    LruRemoveLocked(e);
    if (e.in_assembling) assembling_.erase(e.assembling_it);
    directory_.Remove(&e);
    if (e.state == EntryState::kSealed) {
      --sealed_entries_;
    } else {
      --assembling_entries_;
    }
    if (e.writeback_pending) --writeback_pending_;
    alloc_.Free(e.offset, e.capacity);
    used_bytes_ -= e.capacity;
    entries_.Remove(&e);
    delete &e;  // `e` dies here
  }

  // kReuse: records a use of `id`; returns whether it was already remembered.
  bool GhostTouchLocked(const ObjectId& id) {
    auto it = ghost_index_.find(id);
    if (it != ghost_index_.end()) {
      ghost_.splice(ghost_.end(), ghost_, it->second);
      return true;
    }
    if (options_.ghost_entries == 0) return false;
    ghost_index_.emplace(id, ghost_.insert(ghost_.end(), id));
    if (ghost_.size() > options_.ghost_entries) {
      ghost_index_.erase(ghost_.front());
      ghost_.pop_front();
    }
    return false;
  }

  // Constant after construction.
  const DramCacheOptions options_;
  uint8_t* const base_;
  const uint64_t capacity_;

  mutable std::mutex mu_;
  // Everything below is guarded by mu_.
  RangeAllocator alloc_;
  EntryId next_id_ = 1;
  // Every entry, detached ones too; owns them (allocated in NewEntryLocked).
  FlatIndex<Entry, EntryById> entries_;
  FlatIndex<Entry, EntryByObject> directory_;  // live (not detached)
  Lru lru_;                                    // evictable, least recently used first
  std::list<Entry*> assembling_;               // by start time (the clock is monotonic)
  std::unordered_map<EntryId, Scratch> scratch_;
  CheckpointLru ckpt_lru_;                              // the checkpoints of lru_, in its order
  std::unordered_map<uint64_t, uint64_t> ckpt_groups_;  // ns -> checkpoint storage groups
  std::list<ObjectId> ghost_;                           // kReuse: recently used ids, oldest first
  std::unordered_map<ObjectId, std::list<ObjectId>::iterator, ObjectIdHash> ghost_index_;
  // Gauges.
  uint64_t used_bytes_ = 0;
  uint64_t scratch_bytes_ = 0;
  uint64_t evictable_bytes_ = 0;
  uint64_t ckpt_lru_bytes_ = 0;
  uint64_t sealed_entries_ = 0;
  uint64_t assembling_entries_ = 0;  // includes detached ones still pinned
  uint64_t pinned_entries_ = 0;
  uint64_t pinned_bytes_ = 0;
  uint64_t writeback_pending_ = 0;
  // Counters.
  uint64_t evictions_ = 0;
  uint64_t evicted_bytes_ = 0;
  uint64_t admission_rejects_ = 0;
  uint64_t checkpoints_demoted_ = 0;
  uint64_t checkpoint_demoted_bytes_ = 0;
  uint64_t alloc_failures_ = 0;
  uint64_t assembly_timeouts_ = 0;
};

Result<std::unique_ptr<DramCache>> DramCache::Create(const DramCacheOptions& options) {
  if (options.capacity == 0 || options.capacity % kAlign != 0) {
    return Status::InvalidArgument("DRAM pool size " + std::to_string(options.capacity) +
                                   " must be a positive multiple of 4 KiB");
  }
  if (options.clock == nullptr) return Status::InvalidArgument("DramCache needs a clock");
  void* base =
      mmap(nullptr, options.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    return Status::ResourceExhausted("mmap of the " + FormatByteSize(options.capacity) +
                                     " DRAM pool failed: " + ErrnoText(err));
  }
  // From here the Impl owns the mapping and unmaps it on every failure path.
  auto impl = std::make_unique<Impl>(options, static_cast<uint8_t*>(base));
  if (madvise(base, options.capacity, MADV_HUGEPAGE) != 0) {
    OKV_LOG_DEBUG("madvise(MADV_HUGEPAGE) on the DRAM pool failed: {}", ErrnoText(errno));
  }
  if (options.lock_memory) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<uint32_t> locked = LockMemory(base, options.capacity);
    if (!locked.ok()) {
      OKV_LOG_WARN(
          "locking the {} DRAM pool failed: {}; continuing with pageable memory (raise "
          "RLIMIT_MEMLOCK, e.g. ulimit -l or LimitMEMLOCK=infinity)",
          FormatByteSize(options.capacity), locked.status().message());
    } else {
      OKV_LOG_INFO(
          "locked the {} DRAM pool in {:.2f} s on {} thread(s)", FormatByteSize(options.capacity),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), *locked);
    }
  }
  if (options.on_arena) {
    Status st = options.on_arena(base, options.capacity);
    if (!st.ok()) return st.WithContext("registering the DRAM pool");
  }
  return std::unique_ptr<DramCache>(new DramCache(std::move(impl)));
}

DramCache::DramCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DramCache::~DramCache() = default;

std::optional<DramView> DramCache::Pin(const ObjectId& id, PinUse use) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.PinSealedLocked(id);
  if (e == nullptr) return std::nullopt;
  if (use == PinUse::kUse) m.UseLocked(*e);
  return m.ViewOf(*e);
}

void DramCache::NoteUse(std::span<const EntryId> ids) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  for (EntryId id : ids) {
    Entry* e = m.FindLocked(id);
    assert(e != nullptr && e->pins > 0 && "DramCache::NoteUse: entry not pinned");
    if (e != nullptr) m.UseLocked(*e);
  }
}

size_t DramCache::PinRun(std::span<const ObjectId> ids,
                         const std::function<bool(size_t, const DramView&)>& keep) {
  return impl_->PinRunOf(
      ids.size(), [&](size_t i) -> const ObjectId& { return ids[i]; }, keep);
}

size_t DramCache::PinRun(uint64_t ns, uint32_t group, std::span<const BlockKey> keys,
                         const std::function<bool(size_t, const DramView&)>& keep) {
  return impl_->PinRunOf(
      keys.size(),
      [&](size_t i) {
        return ObjectId{ns, group, ToKey(keys[i])};
      },
      keep);
}

void DramCache::Unpin(EntryId id) { UnpinMany({&id, 1}); }

void DramCache::UnpinMany(std::span<const EntryId> ids) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  for (size_t n = 0; n < ids.size(); ++n) {
    if (n + 2 * kPrefetchAhead < ids.size()) m.entries_.PrefetchSlot(ids[n + 2 * kPrefetchAhead]);
    if (n + kPrefetchAhead < ids.size()) m.entries_.PrefetchElement(ids[n + kPrefetchAhead]);
    const EntryId id = ids[n];
    Entry* e = m.FindLocked(id);
    if (e == nullptr) {
      OKV_LOG_ERROR("DramCache::Unpin: unknown entry {}", id);
      assert(false && "DramCache::Unpin: unknown entry");
      continue;
    }
    m.UnpinLocked(*e);
  }
}

bool DramCache::Contains(const ObjectId& id) const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  const Entry* e = impl_->LookupLocked(id);
  return e != nullptr && e->state == EntryState::kSealed;
}

Result<DramView> DramCache::BeginAssembly(const ObjectId& id, uint64_t size, uint32_t num_parts,
                                          std::span<const uint8_t> prefix) {
  if (prefix.size() > size)
    return Status::InvalidArgument("assembly prefix larger than the object");
  if (size == 0 || num_parts == 0) {
    return Status::InvalidArgument("assembly of " + Describe(id) +
                                   " needs a positive size and part count");
  }
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  if (Entry* e = m.LookupLocked(id)) {
    if (e->state == EntryState::kSealed || e->inserting) {
      return Status::AlreadyExists(Describe(id) + " is already in DRAM");
    }
    if (e->size != size || e->num_parts != num_parts) {
      return Status::InvalidArgument(
          "assembly of " + Describe(id) + " is under way with " + std::to_string(e->size) +
          " bytes in " + std::to_string(e->num_parts) + " parts; asked for " +
          std::to_string(size) + " bytes in " + std::to_string(num_parts));
    }
    m.PinLocked(*e);
    return m.ViewOf(*e);
  }
  if (size > m.capacity_) {
    ++m.alloc_failures_;
    return Status::ResourceExhausted(Describe(id) + " (" + FormatByteSize(size) +
                                     ") is larger than the DRAM pool");
  }
  const uint64_t capacity = AlignUp(size, kAlign);
  ORBITKV_ASSIGN_OR_RETURN(const uint64_t offset, m.AllocateLocked(capacity));
  Entry& e = m.NewEntryLocked(id, offset, size, capacity, num_parts, /*inserting=*/false);
  // Written once, by the creator, before anyone can join: joiners never race on it.
  if (!prefix.empty()) std::memcpy(m.base_ + offset, prefix.data(), prefix.size());
  m.PinLocked(e);
  return m.ViewOf(e);
}

Result<bool> DramCache::CompleteParts(const DramView& view, std::span<const uint32_t> parts) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.FindLocked(view.id);
  if (e == nullptr) {
    return Status::FailedPrecondition("CompleteParts: unknown DRAM entry " +
                                      std::to_string(view.id));
  }
  // The view is released on every path below.
  if (e->detached) {
    const std::string what = Describe(e->object);
    m.UnpinLocked(*e);
    return Status::Cancelled("assembly of " + what + " was aborted or expired");
  }
  for (uint32_t p : parts) {
    if (p >= e->num_parts) {
      const std::string what = Describe(e->object);
      const uint32_t n = e->num_parts;
      m.UnpinLocked(*e);
      return Status::InvalidArgument("part " + std::to_string(p) + " of " + what +
                                     " is out of range (" + std::to_string(n) + " parts)");
    }
  }
  bool sealed_now = false;
  if (e->state == EntryState::kAssembling) {
    for (uint32_t p : parts) {
      if (!e->parts[p]) {
        e->parts[p] = true;
        ++e->parts_done;
      }
    }
    if (e->parts_done == e->num_parts) {
      if (m.options_.on_seal) m.options_.on_seal({view.data, view.size});
      m.SealLocked(*e, /*by_insert=*/false);
      sealed_now = true;
    }
  }
  m.UnpinLocked(*e);
  return sealed_now;
}

void DramCache::AbortAssembly(const DramView& view) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.FindLocked(view.id);
  if (e == nullptr) {
    OKV_LOG_ERROR("DramCache::AbortAssembly: unknown entry {}", view.id);
    assert(false && "DramCache::AbortAssembly: unknown entry");
    return;
  }
  // Another writer may have sealed it meanwhile; a sealed entry stays.
  if (e->state == EntryState::kAssembling) m.DetachLocked(*e);
  m.UnpinLocked(*e);
}

bool DramCache::AbortAssemblyEntry(EntryId id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.FindLocked(id);
  if (e == nullptr || e->state != EntryState::kAssembling || e->detached || e->inserting) {
    return false;
  }
  m.DetachLocked(*e);
  if (e->pins == 0) m.FreeEntryLocked(*e);
  return true;
}

bool DramCache::Assembling(EntryId id) const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  const Entry* e = m.FindLocked(id);
  return e != nullptr && e->state == EntryState::kAssembling && !e->detached && !e->inserting;
}

Status DramCache::InsertSealed(const ObjectId& id, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::InvalidArgument("InsertSealed of empty " + Describe(id));
  Impl& m = *impl_;
  DramView view;
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    if (m.LookupLocked(id) != nullptr) {
      return Status::AlreadyExists(Describe(id) + " is already in DRAM");
    }
    if (bytes.size() > m.capacity_) {
      ++m.alloc_failures_;
      return Status::ResourceExhausted(Describe(id) + " (" + FormatByteSize(bytes.size()) +
                                       ") is larger than the DRAM pool");
    }
    const uint64_t capacity = AlignUp(bytes.size(), kAlign);
    ORBITKV_ASSIGN_OR_RETURN(const uint64_t offset, m.AllocateLocked(capacity));
    Entry& e = m.NewEntryLocked(id, offset, bytes.size(), capacity, 1, /*inserting=*/true);
    m.PinLocked(e);
    view = m.ViewOf(e);
  }
  // Copy without the lock; the pin and the inserting flag keep the entry ours.
  std::memcpy(view.data, bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.FindLocked(view.id);
  assert(e != nullptr && e->inserting);
  e->parts[0] = true;
  e->parts_done = 1;
  m.SealLocked(*e, /*by_insert=*/true);
  m.UnpinLocked(*e);
  return Status::OK();
}

Status DramCache::ReplaceSealed(const DramView& view, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::InvalidArgument("ReplaceSealed with empty bytes");
  Impl& m = *impl_;
  const uint64_t capacity = AlignUp(bytes.size(), kAlign);
  auto current = [&]() -> Entry* {
    Entry* e = m.FindLocked(view.id);
    if (e == nullptr || e->detached || e->state != EntryState::kSealed || !e->admitted ||
        m.LookupLocked(e->object) != e) {
      return nullptr;
    }
    return e;
  };
  uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    Entry* e = current();
    if (e == nullptr) {
      return Status::FailedPrecondition("entry " + std::to_string(view.id) +
                                        " is no longer a sealed, admitted DRAM entry");
    }
    std::optional<uint64_t> at = m.alloc_.Allocate(capacity);  // free space only: no eviction
    if (!at) {
      return Status::ResourceExhausted("no free DRAM range of " + FormatByteSize(capacity) +
                                       " to replace " + Describe(e->object));
    }
    offset = *at;
    m.used_bytes_ += capacity;
  }
  // Copy without the lock into the range nobody else knows of.
  std::memcpy(m.base_ + offset, bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* old = current();
  if (old == nullptr) {  // erased or replaced meanwhile
    m.alloc_.Free(offset, capacity);
    m.used_bytes_ -= capacity;
    return Status::FailedPrecondition("entry " + std::to_string(view.id) +
                                      " left the directory while it was replaced");
  }
  const ObjectId id = old->object;
  m.DetachLocked(*old);  // freed at its last unpin (the caller holds one)
  Entry& e = m.NewEntryLocked(id, offset, bytes.size(), capacity, 1, /*inserting=*/true);
  e.parts[0] = true;
  e.parts_done = 1;
  m.SealLocked(e, /*by_insert=*/true);
  m.SettleLocked(e);
  return Status::OK();
}

bool DramCache::Discard(const DramView& view) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.FindLocked(view.id);
  if (e == nullptr || e->detached || m.LookupLocked(e->object) != e) return false;
  m.DropLocked(*e);
  return true;
}

Result<DramView> DramCache::AllocateScratch(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("AllocateScratch of 0 bytes");
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  if (bytes > m.capacity_) {
    ++m.alloc_failures_;
    return Status::ResourceExhausted("scratch buffer of " + FormatByteSize(bytes) +
                                     " is larger than the DRAM pool");
  }
  const uint64_t capacity = AlignUp(bytes, kAlign);
  ORBITKV_ASSIGN_OR_RETURN(const uint64_t offset, m.AllocateLocked(capacity));
  const EntryId id = m.next_id_++;
  m.scratch_.emplace(id, Scratch{offset, capacity});
  m.scratch_bytes_ += capacity;
  return DramView{id, m.base_ + offset, bytes, capacity};
}

void DramCache::ReleaseScratch(const DramView& view) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  auto it = m.scratch_.find(view.id);
  if (it == m.scratch_.end() || m.base_ + it->second.offset != view.data) {
    OKV_LOG_ERROR("DramCache::ReleaseScratch: unknown scratch buffer {}", view.id);
    assert(false && "DramCache::ReleaseScratch: unknown buffer");
    return;
  }
  m.alloc_.Free(it->second.offset, it->second.capacity);
  m.used_bytes_ -= it->second.capacity;
  m.scratch_bytes_ -= it->second.capacity;
  m.scratch_.erase(it);
}

void DramCache::MarkWritebackPending(const ObjectId& id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.LookupLocked(id);
  if (e == nullptr || e->state != EntryState::kSealed || e->writeback_pending) return;
  e->writeback_pending = true;
  ++m.writeback_pending_;
  m.LruRemoveLocked(*e);
}

std::optional<DramView> DramCache::TakeWriteback(const ObjectId& id) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.LookupLocked(id);
  if (e == nullptr || e->state != EntryState::kSealed || !e->writeback_pending) {
    return std::nullopt;
  }
  m.PinLocked(*e);  // not a use: no LRU or ghost touch
  return m.ViewOf(*e);
}

void DramCache::FinishWriteback(const DramView& view, bool written) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  Entry* e = m.FindLocked(view.id);
  if (e == nullptr) {
    OKV_LOG_ERROR("DramCache::FinishWriteback: unknown entry {}", view.id);
    assert(false && "DramCache::FinishWriteback: unknown entry");
    return;
  }
  if (!written) {
    OKV_LOG_DEBUG("writeback of {} failed; DRAM copy kept only if admitted", Describe(e->object));
  }
  if (e->writeback_pending) {
    e->writeback_pending = false;
    --m.writeback_pending_;
  }
  m.UnpinLocked(*e);  // at zero pins: into the LRU if admitted, else dropped
}

void DramCache::SetCheckpointGroups(uint64_t ns, uint64_t groups) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  if (groups == 0) {
    m.ckpt_groups_.erase(ns);
  } else {
    m.ckpt_groups_[ns] = groups;
  }
}

size_t DramCache::EraseNamespace(uint64_t ns) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  std::vector<Entry*> doomed;
  m.directory_.ForEach([&](Entry* e) {
    if (e->object.ns == ns && !e->inserting) doomed.push_back(e);
  });
  size_t sealed = 0;
  for (Entry* e : doomed) {
    if (e->state == EntryState::kSealed) ++sealed;
    m.DropLocked(*e);
  }
  return sealed;
}

size_t DramCache::ExpireAssemblies() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  const Clock::TimePoint now = m.options_.clock->Now();
  size_t expired = 0;
  while (!m.assembling_.empty()) {
    Entry* e = m.assembling_.front();
    if (now - e->started < m.options_.assembly_timeout) break;
    OKV_LOG_WARN("assembly of {} expired with {}/{} parts after {} s", Describe(e->object),
                 e->parts_done, e->num_parts,
                 std::chrono::duration<double>(now - e->started).count());
    ++expired;
    ++m.assembly_timeouts_;
    m.DetachLocked(*e);
    if (e->pins == 0) m.FreeEntryLocked(*e);
  }
  return expired;
}

DramStats DramCache::stats() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu_);
  DramStats s;
  s.capacity = m.capacity_;
  s.used_bytes = m.used_bytes_;
  s.scratch_bytes = m.scratch_bytes_;
  s.sealed_entries = m.sealed_entries_;
  s.assembling_entries = m.assembling_entries_;
  s.pinned_entries = m.pinned_entries_;
  s.pinned_bytes = m.pinned_bytes_;
  s.writeback_pending = m.writeback_pending_;
  s.evictions = m.evictions_;
  s.evicted_bytes = m.evicted_bytes_;
  s.admission_rejects = m.admission_rejects_;
  s.checkpoint_bytes = m.ckpt_lru_bytes_;
  s.checkpoints_demoted = m.checkpoints_demoted_;
  s.checkpoint_demoted_bytes = m.checkpoint_demoted_bytes_;
  s.alloc_failures = m.alloc_failures_;
  s.assembly_timeouts = m.assembly_timeouts_;
  return s;
}

uint8_t* DramCache::arena_base() const { return impl_->base_; }

}  // namespace orbitkv
