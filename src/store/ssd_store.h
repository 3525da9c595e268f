// SsdStore: the SSD cache over real files. Pairs the ShardSet (files) with the
// SsdCatalog (rings, directory, leases) and moves bytes through a caller's
// IoEngine, so each worker thread keeps its own ring (one engine per worker).
//
// Writes: WriteObject reserves an unpublished extent, writes it chunk by chunk
// and publishes it only after every chunk completed in full. A failed or short
// write aborts the reservation (other objects stay valid). A reservation blocked
// by leases or in-flight writes on every shard, or ENOSPC in io_uring mode
// (logical sizing), drops the write and counts it; neither is fatal.
// Reads: ReadExtents reads whole extents a caller holds a lease on; extents
// adjacent in one shard are read with one larger read (<= 4 MiB) into the
// callers' buffers through readv, never reading bytes outside the extents.
// Thread-safe; the engine passed to a call must be the calling thread's own.
#pragma once

#include <mutex>
#include <optional>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/coalesce.h"
#include "io/file_system.h"
#include "io/io_engine.h"
#include "orbitkv/clock.h"
#include "orbitkv/metrics.h"
#include "orbitkv/status.h"
#include "store/catalog.h"
#include "store/object_id.h"
#include "store/shard_file.h"

namespace orbitkv {

struct SsdStoreOptions {
  std::string path;               // --ssd-cache-path (shard 0; others are path.N)
  uint64_t capacity = 0;          // --ssd-cache-capacity, split evenly over shards
  uint32_t shards = 4;            // --ssd-shards
  bool reserve_capacity = false;  // fallocate every shard up front (cuFile modes)
  bool direct_io = true;
  uint64_t max_read_bytes = 4u << 20;  // coalesced read cap
  uint64_t write_chunk_bytes = 1u << 20;
  FileSystem* fs = FileSystem::Default();
  Clock* clock = Clock::Real();
  MetricsRegistry* metrics = nullptr;  // optional; the store registers its series there
};

// One extent to read, and where its bytes go. buf must be 4 KiB aligned and
// hold ref.length bytes; on success its first ref.object_size bytes are the object.
struct ExtentRead {
  ExtentRef ref;        // input
  void* buf = nullptr;  // input; owned by the caller
  Status status;        // output
};

class SsdStore {
 public:
  static Result<std::unique_ptr<SsdStore>> Open(const SsdStoreOptions& options);
  ~SsdStore();

  SsdCatalog& catalog() { return *catalog_; }
  // ShardSet::Reserve of every shard's capacity (cuFile modes; see there).
  Status ReserveCapacity() { return shards_->Reserve(shard_capacity_); }
  const ShardSet& shards() const { return *shards_; }
  const SsdStoreOptions& options() const { return options_; }
  uint64_t shard_capacity() const { return shard_capacity_; }

  // Stores `size` bytes from `data` (4 KiB aligned; AlignUp(size, 4096) bytes
  // readable; bytes past size are written as zeros). Returns the published ref.
  // Busy: dropped to protect leases/in-flight writes. NoSpace: dropped, the
  // file system is full. IOError: aborted. Each drop is counted by reason.
  Result<ExtentRef> WriteObject(IoEngine& io, const Key& key, const void* data, uint64_t size);

  // One object of a batch write: inputs key/data/size, output result.
  struct ObjectWrite {
    Key key;
    const void* data = nullptr;
    uint64_t size = 0;
    uint64_t tag = 0;  // the object's namespace (SsdCatalog::DropTag)
    Result<ExtentRef> result = Status::Internal("not written");
  };
  // WriteObject for many objects at once: every chunk of every reserved object
  // goes to the engine in one batch (up to its queue depth in flight); each
  // object is published or aborted on its own.
  void WriteObjects(IoEngine& io, std::span<ObjectWrite> objects);

  // The pieces of WriteObject for writers that move bytes themselves (cuFile):
  // Reserve, write [offset, +len) of the extent, then Publish or Abort.
  Result<ExtentRef> Reserve(const Key& key, uint64_t size, uint64_t tag = 0);
  Status WriteChunk(IoEngine& io, const ExtentRef& ref, uint64_t offset, const void* buf,
                    size_t len);
  Status Publish(const ExtentRef& ref);
  void Abort(const ExtentRef& ref, const Status& why);

  // Where bytes [offset, +length) of extent `ref` lie in its shard's file:
  // for writers and readers that move bytes themselves (cuFile).
  static ReadRange FileRange(const ExtentRef& ref, uint64_t offset, uint64_t length) {
    return {ref.shard, ShardSet::FileOffset(ref.offset + offset), length};
  }

  // REQUIRES: the caller holds a lease on every ref with a submitted interest
  // (SsdCatalog::Submit), released with Complete after this returns.
  // Returns the first failure; each ExtentRead has its own status. A bad read
  // (outside the store, unaligned, or overlapping another of a different
  // length) is InvalidArgument for every read, with nothing read.
  Status ReadExtents(IoEngine& io, std::span<ExtentRead> reads);

  // A read of `ref`, the object `id`, failed with `why`. When that is
  // Corruption (a header or payload CRC mismatch, or another object's bytes),
  // the extent is dropped (SsdCatalog::Drop: the key is absent, so its next
  // write is stored; leases that pin it keep it until released), counted in
  // orbitkv_ssd_corrupt_objects_dropped_total and logged as a warning naming
  // the object. Returns whether this call dropped it; other statuses and
  // refs dropped already change nothing. A DRAM copy is not the store's: it stays.
  bool DropIfCorrupt(const ExtentRef& ref, const ObjectId& id, const Status& why);

  // Counters a caller adds to when it drops a write for its own reasons.
  void CountDrop(std::string_view reason);

  // Every drop is counted (orbitkv_ssd_write_drops_total{reason}) and, per
  // reason, logged as a warning at most once per kDropLogInterval with the
  // number of drops since the previous line and the last one's cause.
  static constexpr Clock::Duration kDropLogInterval = std::chrono::seconds(10);

 private:
  SsdStore(SsdStoreOptions options, uint64_t shard_capacity, std::unique_ptr<ShardSet> shards,
           std::unique_ptr<SsdCatalog> catalog);
  void RegisterMetrics();
  enum DropReason { kDropPinned, kDropNoSpace, kDropIo, kDropReasons };
  void Dropped(DropReason reason, const Status& why);

  const SsdStoreOptions options_;
  const uint64_t shard_capacity_;
  std::unique_ptr<ShardSet> shards_;
  std::unique_ptr<SsdCatalog> catalog_;
  MetricsRegistry own_metrics_;  // used when options_.metrics is null
  MetricsRegistry* metrics_;
  uint64_t collector_id_ = 0;
  Counter* read_bytes_;
  Counter* read_ops_;
  Counter* read_failures_;
  Counter* write_bytes_;
  Counter* write_ops_;
  Counter* write_failures_;
  Counter* published_;
  Counter* drops_pinned_;
  Counter* drops_nospace_;
  Counter* drops_io_;
  std::mutex drop_log_mu_;
  std::optional<Clock::TimePoint> drop_logged_[kDropReasons];  // guarded by drop_log_mu_
  uint64_t drops_unlogged_[kDropReasons] = {};                 // guarded by drop_log_mu_
  Histogram* read_seconds_;
  Histogram* write_seconds_;
};

}  // namespace orbitkv
