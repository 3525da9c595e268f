// DramCache: the pinned DRAM tier. Owns one locked host arena of --pool-size
// bytes (mmap + mlock; registered with CUDA by the GPU tier through
// Options::on_arena) and the objects stored in it, keyed by ObjectId.
//
// An entry is *assembling* (fragments of a group arriving, invisible) or
// *sealed* (complete, visible to Lookup). Readers Pin an entry and read its
// bytes; pinned entries are never evicted or freed. Eviction is LRU over
// sealed, unpinned entries that are not waiting for SSD writeback; it runs
// when an allocation needs room. Allocations are 4 KiB aligned (the SSD store
// writes straight from them). Admission policy: kAll keeps every sealed
// object; kReuse keeps an object in DRAM only if its id was seen before (a
// bounded ghost list of recent ids), others are dropped once written back;
// with no SSD tier (writeback_on_seal off) they are dropped at their last
// unpin, so a first-time object is not kept at all and its second publish
// is. A use of an unadmitted entry (a kUse pin, a kept PinRun pin, NoteUse)
// counts as reuse and admits it; a refused or probing pin does not.
// Checkpoints (objects of the storage groups SetCheckpointGroups names: a
// hybrid model's recurrent state, tens of MiB each) may hold at most
// checkpoint_capacity bytes of the LRU: when one more settles there, the least
// recently used checkpoints leave DRAM (their SSD copy stays) until the rest
// fit, so checkpoints never flush the pool's attention blocks. Pinned and
// writeback-pending checkpoints are not counted (they are in use).
// Thread-safe: one mutex; no call blocks on I/O or copies bytes under it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/clock.h"
#include "orbitkv/status.h"
#include "store/object_id.h"

namespace orbitkv {

enum class AdmissionPolicy { kAll, kReuse };

struct DramCacheOptions {
  uint64_t capacity = 0;    // arena bytes (--pool-size), multiple of 4096
  bool lock_memory = true;  // mlock the arena; failure is logged, not fatal
  AdmissionPolicy admission = AdmissionPolicy::kAll;
  uint64_t ghost_entries = 1 << 16;  // kReuse: ids remembered
  // Bytes of unpinned checkpoints the LRU may hold (see above); >= capacity: no cap.
  uint64_t checkpoint_capacity = UINT64_MAX;
  Clock* clock = Clock::Real();
  // Assembling entries not sealed within this time are dropped (a writer died).
  Clock::Duration assembly_timeout = std::chrono::seconds(60);
  // An SSD tier is on: an entry sealed by CompleteParts is writeback-pending
  // from the moment it seals (so it can't be evicted or dropped before the
  // writer takes it); the caller whose CompleteParts returned true then calls
  // TakeWriteback + FinishWriteback. InsertSealed entries are never pending.
  bool writeback_on_seal = false;
  // Called by the CompleteParts that completes an assembly, with the whole
  // object, under the cache's lock and before the entry becomes visible: the
  // last chance to finish bytes that depend on every part (the Manager seals
  // the object header over the parts' payload CRCs). Must be short (a few
  // KiB of work) and must not call into the cache.
  std::function<void(std::span<uint8_t> object)> on_seal;
  // Called once with the arena after it is mapped (CUDA host registration).
  std::function<Status(void* base, uint64_t size)> on_arena;
  // Called with the arena before it is unmapped (undo on_arena).
  std::function<void(void* base)> on_arena_release;
};

using EntryId = uint64_t;

// A pinned view of one entry. Valid until Unpin(id).
struct DramView {
  EntryId id = 0;
  uint8_t* data = nullptr;  // 4 KiB aligned
  uint64_t size = 0;        // object bytes
  uint64_t capacity = 0;    // allocated bytes (>= AlignUp(size, 4096))
};

struct DramStats {
  uint64_t capacity = 0;
  uint64_t used_bytes = 0;     // allocated: entries (sealed + assembling) and scratch
  uint64_t scratch_bytes = 0;  // of used_bytes, held by scratch buffers
  uint64_t sealed_entries = 0;
  uint64_t assembling_entries = 0;
  uint64_t pinned_entries = 0;
  uint64_t pinned_bytes = 0;
  uint64_t writeback_pending = 0;
  // Cumulative.
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t admission_rejects = 0;    // kReuse: sealed but not kept after writeback
  uint64_t checkpoint_bytes = 0;     // gauge: unpinned checkpoints in the LRU
  uint64_t checkpoints_demoted = 0;  // checkpoints that left DRAM for checkpoint_capacity
  uint64_t checkpoint_demoted_bytes = 0;
  uint64_t alloc_failures = 0;  // no room even after eviction
  uint64_t assembly_timeouts = 0;
};

class DramCache {
 public:
  static Result<std::unique_ptr<DramCache>> Create(const DramCacheOptions& options);
  // REQUIRES: nothing pinned, no scratch outstanding (the arena is unmapped).
  ~DramCache();

  // Lookup + pin of a sealed entry. kUse: the pin is a use of the object
  // (kReuse admission: reuse; ghost list). kProbe: the caller may still let go
  // of it unused (a recovery planner asking what is here); it counts as a use
  // only through a later NoteUse. Every pin moves the entry out of the LRU and
  // back to its MRU end at the last unpin.
  enum class PinUse { kUse, kProbe };
  std::optional<DramView> Pin(const ObjectId& id, PinUse use = PinUse::kUse);
  // Pin of ids[0], ids[1], ... under one lock, each view handed to
  // keep(index, view) under the cache's lock (it must not call into the
  // cache). Stops at the first id that is not sealed here (not touched) or
  // whose keep() returns false (pinned, then unpinned again, and not counted
  // as a use). Returns how many stay pinned: ids[0, n), each counted as a use.
  size_t PinRun(std::span<const ObjectId> ids,
                const std::function<bool(size_t index, const DramView& view)>& keep);
  // PinRun over the ids {ns, group, keys[i]}, with no id array built (a
  // query of a 128k-token chain names 8192 keys).
  size_t PinRun(uint64_t ns, uint32_t group, std::span<const BlockKey> keys,
                const std::function<bool(size_t index, const DramView& view)>& keep);
  // Counts the pinned entries `ids` (from Pin(kProbe)) as used, under one lock.
  void NoteUse(std::span<const EntryId> ids);
  void Unpin(EntryId id);
  // Unpin of each, under one lock.
  void UnpinMany(std::span<const EntryId> ids);
  bool Contains(const ObjectId& id) const;  // sealed only; no LRU touch

  // Starts (or joins) assembly of `id` with `size` bytes and `num_parts` parts;
  // returns a pinned view to write parts into. AlreadyExists if `id` is sealed;
  // InvalidArgument if an assembly of `id` exists with another size/num_parts;
  // ResourceExhausted if no room after eviction.
  // `prefix` (e.g. the object header) is copied to the start of a newly created
  // assembly under the cache's lock; joiners of an existing assembly skip it.
  Result<DramView> BeginAssembly(const ObjectId& id, uint64_t size, uint32_t num_parts,
                                 std::span<const uint8_t> prefix = {});
  // Marks parts as written (idempotent per part). Returns true when this call
  // completed the object: it is sealed and visible (an unadmitted kReuse entry
  // that is not writeback-pending is dropped at once). Releases the view on
  // every return, error or not: InvalidArgument for a part >= num_parts (no
  // part is marked), Cancelled if the assembly was aborted or expired.
  // REQUIRES: view came from BeginAssembly and was not released.
  Result<bool> CompleteParts(const DramView& view, std::span<const uint32_t> parts);
  // Drops an assembly (a writer failed). Unpins the view. Writers that joined
  // keep their pins; the memory is freed at the last unpin and nobody else
  // joins (a new BeginAssembly starts afresh).
  void AbortAssembly(const DramView& view);
  // Drops entry `id` if it is still assembling (its writer's session ended):
  // it leaves the directory at once and its memory is freed now, or at the
  // last unpin of a writer still copying into it. False (no-op) if the entry
  // is gone, sealed or already detached. No view is needed.
  bool AbortAssemblyEntry(EntryId id);
  // True while entry `id` is assembling (not sealed, aborted or expired).
  bool Assembling(EntryId id) const;

  // Inserts a sealed entry by copying `bytes` (SSD warm-up / restore admission).
  // AlreadyExists if present; ResourceExhausted if no room.
  Status InsertSealed(const ObjectId& id, std::span<const uint8_t> bytes);

  // Replaces the sealed, admitted entry of `view` (pinned by the caller: the
  // writeback lane between TakeWriteback and FinishWriteback) with `bytes`
  // (its encoded form): a new sealed entry takes its place in the directory,
  // at the LRU's MRU end once unpinned, in free pool space only (nothing is
  // evicted for it). The old entry leaves the directory and is freed at its
  // last unpin (readers that pinned it keep its bytes); the caller's pin stays
  // on it. FailedPrecondition (nothing changed) when the entry is not the
  // directory's sealed, admitted entry any more; ResourceExhausted when no
  // free range fits; InvalidArgument for empty bytes.
  Status ReplaceSealed(const DramView& view, std::span<const uint8_t> bytes);

  // Drops the entry of `view` (pinned by the caller) from the directory, e.g.
  // an encoded copy that failed its checks: Pin and Lookup no longer find it
  // and it is freed at its last unpin. False when it had already left.
  bool Discard(const DramView& view);

  // Objects of namespace `ns` in the storage groups of bit mask `groups` (bit
  // g: group g) are checkpoints from now on (entries created later); 0 forgets
  // the namespace. The Manager calls it when a hybrid instance registers.
  void SetCheckpointGroups(uint64_t ns, uint64_t groups);

  // Temporary 4 KiB aligned buffers from the arena for SSD reads (not entries,
  // never evicted, freed by ReleaseScratch). ResourceExhausted if no room.
  Result<DramView> AllocateScratch(uint64_t bytes);
  void ReleaseScratch(const DramView& view);

  // SSD writeback bookkeeping: sealed entries wait for writeback; they are not
  // evicted meanwhile. TakeWriteback pins the entry for the writer.
  // MarkWritebackPending: no-op unless `id` is sealed. The caller that marks
  // must take and finish the writeback (see also writeback_on_seal).
  void MarkWritebackPending(const ObjectId& id);
  // nullopt if `id` is absent, assembling or not writeback-pending.
  std::optional<DramView> TakeWriteback(const ObjectId& id);
  // Unpins and clears pending; under kReuse an unadmitted entry is dropped now.
  void FinishWriteback(const DramView& view, bool written);

  // Drops every entry of namespace `ns` (sealed or assembling): each leaves
  // the directory at once (a Pin or TakeWriteback no longer finds it) and its
  // memory is freed now, or at the last unpin of a reader or writer still
  // holding it. An InsertSealed copying in meanwhile is not touched. Returns
  // how many sealed entries it dropped.
  size_t EraseNamespace(uint64_t ns);

  // Drops assembling entries older than assembly_timeout; returns how many.
  // One still pinned by a writer is detached now and freed at its last unpin.
  size_t ExpireAssemblies();

  DramStats stats() const;
  uint8_t* arena_base() const;

 private:
  struct Impl;
  explicit DramCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orbitkv
