// SsdCatalog: the SSD cache's metadata, with no I/O. Owns, per shard, a ring of
// 4 KiB aligned extents; the directory key -> current extent; and the leases
// that pin extents. The SsdStore pairs it with files and an io engine.
//
// Lifecycle of an extent: Reserve() puts a *writing* extent at the shard's ring
// head (at offset 0 when it does not fit before the shard's end), stamped with
// a new generation (catalog-wide, from 1, never reused, not even after Clear());
// Publish() makes it the key's current extent atomically; Abort() drops it. A
// published extent is overwritten (and leaves the directory if it is still the
// key's current extent) only when a later reservation needs its space and no
// lease pins it. Republishing a key leaves the old extent *dead* in its ring:
// out of the directory, but intact and still current for IsCurrent() and
// AcquireLease() until the ring overwrites it. Drop() removes a damaged
// extent: out of the directory and no longer current at once; a lease that
// pins it keeps its range from reuse until released. A reservation whose range would
// cover a pinned or writing extent tries the next shard; when every shard is
// blocked the reservation fails with Busy and `pinned_write_skips` counts it.
// Nothing here blocks.
//
// A lease pins (shard, offset, generation) extents for a number of interests.
// Each interest is pending (Cancel, expiry and session release drop it) or
// submitted (only Complete drops it). Extents stay pinned while any interest
// remains; when none does, the lease is gone and its id unknown.
// Thread-safe: one mutex guards everything; no call does I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/clock.h"
#include "orbitkv/status.h"
#include "store/key.h"

namespace orbitkv {

inline constexpr uint64_t kExtentAlign = 4096;

// Names one extent at one generation. `object_size` is the stored object's
// length (<= length); `length` is object_size rounded up to kExtentAlign.
struct ExtentRef {
  uint32_t shard = 0;
  uint64_t offset = 0;  // within the shard's data region; multiple of kExtentAlign
  uint64_t length = 0;
  uint64_t object_size = 0;
  uint64_t generation = 0;
  friend bool operator==(const ExtentRef&, const ExtentRef&) = default;
};

using LeaseId = uint64_t;

struct LeaseSpec {
  SessionId session = 0;
  uint32_t interests = 1;       // > 0
  Clock::TimePoint deadline{};  // pending interests expire at this time; {} = never
};

struct CatalogOptions {
  uint32_t shards = 1;          // >= 1
  uint64_t shard_capacity = 0;  // data bytes per shard; multiple of kExtentAlign, > 0
  Clock* clock = Clock::Real();
};

struct CatalogStats {
  uint64_t published_objects = 0;  // extents in the directory
  uint64_t published_bytes = 0;    // sum of their lengths
  uint64_t writing_extents = 0;    // reservations not yet published or aborted
  uint64_t writing_bytes = 0;
  uint64_t active_leases = 0;
  uint64_t pending_interests = 0;
  uint64_t submitted_interests = 0;
  uint64_t pinned_extents = 0;  // distinct extents with a lease pin
  uint64_t pinned_bytes = 0;    // their lengths (orbitkv_ssd_read_pinned_bytes)
  // Cumulative counters.
  uint64_t reservations = 0;
  uint64_t publishes = 0;
  uint64_t aborts = 0;
  uint64_t evictions = 0;           // published extents overwritten by the ring
  uint64_t pinned_write_skips = 0;  // reservations refused to protect leases/in-flight writes
  uint64_t shard_skips = 0;         // times a shard was passed over for the same reason
  uint64_t expired_interests = 0;
  uint64_t dropped_extents = 0;  // damaged extents removed by Drop
};

class SsdCatalog {
 public:
  // InvalidArgument if shards is 0, shard_capacity is 0 or unaligned, or clock is null.
  static Result<std::unique_ptr<SsdCatalog>> Create(const CatalogOptions& options);
  ~SsdCatalog();

  // Reserves an unpublished extent of AlignUp(object_size) bytes, trying shards
  // round-robin from an internal cursor (advanced once per call). A shard is
  // blocked when the range at its ring head holds a writing or pinned extent;
  // otherwise the published extents in that range are evicted. InvalidArgument
  // if object_size is 0 or exceeds shard_capacity; Busy if every shard is blocked.
  // `tag` (the object's namespace) is what DropTag matches.
  Result<ExtentRef> Reserve(const Key& key, uint64_t object_size, uint64_t tag = 0);
  // REQUIRES: ref came from Reserve and was neither published nor aborted
  // (FailedPrecondition otherwise, changing nothing). Cancelled (and ref
  // aborted) if DropTag cleared its tag since the Reserve.
  // Makes it the key's current extent; the key's previous extent (if any) leaves
  // the directory (its bytes stay readable by existing leases until overwritten).
  // Exception: if a later reservation of the same key was published while this
  // one was open (two writers racing), Publish succeeds but ref is dead at once
  // (IsCurrent, not in the directory): a key's generation never goes back.
  Status Publish(const ExtentRef& ref);
  // Drops a reservation (failed or short write); the ring head does not move
  // back. Unknown, published or already aborted refs are ignored.
  void Abort(const ExtentRef& ref);

  // A read found ref's extent damaged: it leaves the directory if it is its
  // key's current extent (so the key is absent and its next Publish is its
  // current extent again) and is no longer IsCurrent (no new lease takes it).
  // Leases that pin it keep its range from being reused until the last is
  // released; then the range is free, as an evicted extent's. Returns false,
  // changing nothing, unless ref names a published extent (unknown,
  // overwritten, open, aborted or already dropped refs are ignored).
  bool Drop(const ExtentRef& ref);
  // Drop of every published extent reserved with `tag` (current or dead);
  // returns how many left the directory. Open reservations of `tag` stay
  // writable, but their Publish aborts them and returns Cancelled, so a write
  // that was under way when its namespace was cleared never brings its object
  // back.
  size_t DropTag(uint64_t tag);

  // The key's current published extent, if any.
  std::optional<ExtentRef> Lookup(const Key& key) const;
  // True if ref's extent is still present, published, at ref's generation. Also
  // true for a dead extent (its key was republished) until the ring overwrites
  // it: its bytes are intact and immutable.
  bool IsCurrent(const ExtentRef& ref) const;

  // Pins every ref for spec.interests pending interests. NotFound (and nothing
  // pinned) if any ref is not IsCurrent(). InvalidArgument if refs is empty or
  // interests is 0. A ref named twice is pinned (and later unpinned) twice.
  Result<LeaseId> AcquireLease(std::span<const ExtentRef> refs, const LeaseSpec& spec);
  // Lookup(key) and AcquireLease of that one extent, atomically (one lock):
  // nullopt if the key has no current published extent.
  struct Leased {
    ExtentRef ref;
    LeaseId lease = 0;
  };
  std::optional<Leased> LookupAndLease(const Key& key, const LeaseSpec& spec);
  // Moves n pending interests to submitted. FailedPrecondition if the lease is
  // gone or fewer than n are pending (e.g. they expired): the caller must not
  // read then.
  Status Submit(LeaseId lease, uint32_t n = 1);
  // The lease's pending interests no longer expire (a restore took them: they
  // live until it reads, completes or is cancelled, not until the query's
  // TTL). Cancel and ReleaseSession still drop them. FailedPrecondition if the
  // lease is gone.
  Status KeepUntilDone(LeaseId lease);
  // Drops min(n, submitted) interests (the read finished, successfully or not).
  // Complete, Cancel and ReleaseSession ignore unknown leases and sessions.
  void Complete(LeaseId lease, uint32_t n = 1);
  // Drops every pending interest; submitted ones stay until Complete.
  void Cancel(LeaseId lease);
  // Cancel of each, under one lock.
  void CancelMany(std::span<const LeaseId> leases);
  // Drops pending interests whose deadline is <= clock->Now(); returns how many.
  size_t ExpireLeases();
  // Cancels every lease of the session (teardown, or a client that died).
  void ReleaseSession(SessionId session);
  // The refs a live lease pins (empty if the lease is gone).
  std::vector<ExtentRef> LeaseExtents(LeaseId lease) const;

  // Forgets every extent, lease and directory entry and zeroes stats (store
  // recreated empty). Generations and lease ids keep counting, so older refs and
  // ids stay unknown. REQUIRES: no lease or reservation is live.
  void Clear();

  // O(1): the gauges are maintained as state changes.
  CatalogStats stats() const;
  const CatalogOptions& options() const;

 private:
  struct Impl;
  explicit SsdCatalog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orbitkv
