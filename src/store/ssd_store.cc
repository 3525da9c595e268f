#include "store/ssd_store.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "io/coalesce.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"

namespace orbitkv {
namespace {

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Result<std::unique_ptr<SsdStore>> SsdStore::Open(const SsdStoreOptions& options) {
  if (options.shards == 0) return Status::InvalidArgument("--ssd-shards must be at least 1");
  const uint64_t per_shard = AlignDown(options.capacity / options.shards, kExtentAlign);
  if (per_shard == 0) {
    return Status::InvalidArgument("--ssd-cache-capacity " + FormatByteSize(options.capacity) +
                                   " is too small for " + std::to_string(options.shards) +
                                   " shards of at least 4 KiB");
  }
  if (options.max_read_bytes == 0 || options.max_read_bytes % kExtentAlign != 0 ||
      options.write_chunk_bytes == 0 || options.write_chunk_bytes % kExtentAlign != 0) {
    return Status::InvalidArgument("read and write chunk sizes must be multiples of 4 KiB");
  }
  ShardSetOptions so;
  so.base_path = options.path;
  so.count = options.shards;
  so.data_capacity = per_shard;
  so.reserve_capacity = options.reserve_capacity;
  so.direct_io = options.direct_io;
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<ShardSet> shards, ShardSet::Create(options.fs, so));
  CatalogOptions co;
  co.shards = options.shards;
  co.shard_capacity = per_shard;
  co.clock = options.clock;
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<SsdCatalog> catalog, SsdCatalog::Create(co));
  std::unique_ptr<SsdStore> store(
      new SsdStore(options, per_shard, std::move(shards), std::move(catalog)));
  return store;
}

SsdStore::SsdStore(SsdStoreOptions options, uint64_t shard_capacity,
                   std::unique_ptr<ShardSet> shards, std::unique_ptr<SsdCatalog> catalog)
    : options_(std::move(options)),
      shard_capacity_(shard_capacity),
      shards_(std::move(shards)),
      catalog_(std::move(catalog)),
      metrics_(options_.metrics ? options_.metrics : &own_metrics_) {
  RegisterMetrics();
}

SsdStore::~SsdStore() { metrics_->RemoveCollector(collector_id_); }

void SsdStore::RegisterMetrics() {
  MetricsRegistry& m = *metrics_;
  read_bytes_ = m.GetCounter("orbitkv_ssd_uring_read_bytes_total",
                             "Bytes read from SSD shards through io_uring, including alignment.");
  read_ops_ = m.GetCounter("orbitkv_ssd_uring_read_ops_total",
                           "io_uring read operations after coalescing.");
  read_failures_ =
      m.GetCounter("orbitkv_ssd_uring_read_failures_total", "Failed or short io_uring reads.");
  write_bytes_ = m.GetCounter("orbitkv_ssd_uring_write_bytes_total",
                              "Bytes written to SSD shards through io_uring, including padding.");
  write_ops_ = m.GetCounter("orbitkv_ssd_uring_write_ops_total", "io_uring write operations.");
  write_failures_ =
      m.GetCounter("orbitkv_ssd_uring_write_failures_total", "Failed or short io_uring writes.");
  published_ =
      m.GetCounter("orbitkv_ssd_objects_written_total", "Objects written to SSD and published.");
  const char* drop_help =
      "SSD writes dropped, by reason (pinned: every shard's ring head "
      "was leased or being written; nospace: file system full; io_error).";
  drops_pinned_ = m.GetCounter("orbitkv_ssd_write_drops_total", drop_help, {{"reason", "pinned"}});
  drops_nospace_ =
      m.GetCounter("orbitkv_ssd_write_drops_total", drop_help, {{"reason", "nospace"}});
  drops_io_ = m.GetCounter("orbitkv_ssd_write_drops_total", drop_help, {{"reason", "io_error"}});
  read_seconds_ = m.GetHistogram("orbitkv_ssd_uring_read_seconds",
                                 "Latency of one ReadExtents call (all its coalesced reads).");
  write_seconds_ = m.GetHistogram("orbitkv_ssd_uring_write_seconds",
                                  "Latency of one write batch (all chunks of its objects).");
  const uint64_t capacity = shard_capacity_ * shards_->count();
  collector_id_ = m.AddCollector([this, capacity](MetricWriter& w) {
    CatalogStats s = catalog_->stats();
    auto gauge = [&](std::string_view name, std::string_view help, double v) {
      w.Family(name, help, "gauge");
      w.Sample(name, {}, v);
    };
    auto counter = [&](std::string_view name, std::string_view help, double v) {
      w.Family(name, help, "counter");
      w.Sample(name, {}, v);
    };
    gauge("orbitkv_ssd_capacity_bytes", "Configured SSD cache data capacity.",
          static_cast<double>(capacity));
    gauge("orbitkv_ssd_used_bytes", "Bytes of published SSD objects (4 KiB aligned).",
          static_cast<double>(s.published_bytes));
    gauge("orbitkv_ssd_objects", "Objects in the SSD directory.",
          static_cast<double>(s.published_objects));
    gauge("orbitkv_ssd_reservations_inflight", "Unpublished SSD extents being written.",
          static_cast<double>(s.writing_extents));
    gauge("orbitkv_ssd_leases_active", "Live SSD extent leases.",
          static_cast<double>(s.active_leases));
    w.Family("orbitkv_ssd_lease_interests", "Unreleased lease interests by state.", "gauge");
    w.Sample("orbitkv_ssd_lease_interests", {{"state", "pending"}},
             static_cast<double>(s.pending_interests));
    w.Sample("orbitkv_ssd_lease_interests", {{"state", "submitted"}},
             static_cast<double>(s.submitted_interests));
    gauge("orbitkv_ssd_read_pinned_bytes", "SSD bytes held by restore leases.",
          static_cast<double>(s.pinned_bytes));
    counter("orbitkv_ssd_pinned_write_skips_total",
            "Reservations rejected to protect reads or in-flight writes.",
            static_cast<double>(s.pinned_write_skips));
    counter("orbitkv_ssd_evictions_total", "Published SSD extents overwritten by the ring.",
            static_cast<double>(s.evictions));
    counter("orbitkv_ssd_expired_interests_total", "Lease interests released by expiry.",
            static_cast<double>(s.expired_interests));
    counter("orbitkv_ssd_corrupt_objects_dropped_total",
            "SSD objects a read found damaged (CRC or identity mismatch), dropped from the "
            "directory so the key can be stored again.",
            static_cast<double>(s.dropped_extents));
  });
}

bool SsdStore::DropIfCorrupt(const ExtentRef& ref, const ObjectId& id, const Status& why) {
  if (why.code() != StatusCode::kCorruption || !catalog_->Drop(ref)) return false;
  OKV_LOG_WARN(
      "SSD object ns {} group {} key {} (shard {} offset {} generation {}) is damaged: {}; "
      "dropped from the SSD cache, its next publish stores it again",
      id.ns, id.group, id.key.ShortHex(), ref.shard, ref.offset, ref.generation, why.ToString());
  return true;
}

void SsdStore::CountDrop(std::string_view reason) {
  const Status why = Status::Internal("dropped by the caller");
  if (reason == "pinned")
    Dropped(kDropPinned, why);
  else if (reason == "nospace")
    Dropped(kDropNoSpace, why);
  else
    Dropped(kDropIo, why);
}

void SsdStore::Dropped(DropReason reason, const Status& why) {
  static constexpr const char* kNames[kDropReasons] = {"pinned", "nospace", "io_error"};
  static constexpr const char* kHints[kDropReasons] = {
      "every shard's ring head was leased or being written",
      "the file system is full: choose an --ssd-cache-capacity that fits it", "I/O errors"};
  (reason == kDropPinned    ? drops_pinned_
   : reason == kDropNoSpace ? drops_nospace_
                            : drops_io_)
      ->Inc();
  const Clock::TimePoint now = options_.clock->Now();
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> l(drop_log_mu_);
    ++drops_unlogged_[reason];
    std::optional<Clock::TimePoint>& last = drop_logged_[reason];
    if (last && now - *last < kDropLogInterval) return;
    last = now;
    n = drops_unlogged_[reason];
    drops_unlogged_[reason] = 0;
  }
  OKV_LOG_WARN(
      "SSD writes dropped (reason {}): {} since the last report; {}; last: {} "
      "(orbitkv_ssd_write_drops_total{{reason=\"{}\"}})",
      kNames[reason], n, kHints[reason], why.ToString(), kNames[reason]);
}

Result<ExtentRef> SsdStore::Reserve(const Key& key, uint64_t size, uint64_t tag) {
  Result<ExtentRef> ref = catalog_->Reserve(key, size, tag);
  if (!ref.ok() && ref.status().IsBusy()) Dropped(kDropPinned, ref.status());
  return ref;
}

Status SsdStore::WriteChunk(IoEngine& io, const ExtentRef& ref, uint64_t offset, const void* buf,
                            size_t len) {
  if (ref.shard >= shards_->count() || offset % kExtentAlign != 0 || len % kExtentAlign != 0 ||
      offset + len > ref.length) {
    return Status::InvalidArgument("write chunk [" + std::to_string(offset) + ", +" +
                                   std::to_string(len) + ") outside extent of " +
                                   std::to_string(ref.length) + " bytes or unaligned");
  }
  IoRequest req;
  req.op = IoOp::kWrite;
  req.fd = shards_->fd(ref.shard);
  req.offset = ShardSet::FileOffset(ref.offset + offset);
  req.buf = const_cast<void*>(buf);
  req.len = len;
  req.file = shards_->path(ref.shard);
  write_ops_->Inc();
  Status st = io.Run({&req, 1});
  write_bytes_->Inc(req.done);
  if (!st.ok()) write_failures_->Inc();
  return st;
}

Status SsdStore::Publish(const ExtentRef& ref) {
  ORBITKV_RETURN_IF_ERROR(catalog_->Publish(ref));
  published_->Inc();
  return Status::OK();
}

void SsdStore::Abort(const ExtentRef& ref, const Status& why) {
  catalog_->Abort(ref);
  Dropped(why.IsNoSpace() ? kDropNoSpace : kDropIo, why);
  OKV_LOG_DEBUG("SSD write to shard {} aborted: {}", ref.shard, why.ToString());
}

Result<ExtentRef> SsdStore::WriteObject(IoEngine& io, const Key& key, const void* data,
                                        uint64_t size) {
  ObjectWrite w{key, data, size};
  WriteObjects(io, {&w, 1});
  return std::move(w.result);
}

void SsdStore::WriteObjects(IoEngine& io, std::span<ObjectWrite> objects) {
  const Clock::TimePoint start = options_.clock->Now();
  std::vector<IoRequest> reqs;
  std::vector<size_t> owner;  // request -> object
  for (size_t i = 0; i < objects.size(); ++i) {
    ObjectWrite& w = objects[i];
    if (w.data == nullptr || reinterpret_cast<uintptr_t>(w.data) % kExtentAlign != 0) {
      w.result = Status::InvalidArgument("object buffer must be 4 KiB aligned");
      continue;
    }
    w.result = Reserve(w.key, w.size, w.tag);
    if (!w.result.ok()) continue;
    const ExtentRef& ref = *w.result;
    // The caller's buffer covers AlignUp(size); zero the padding in the last
    // block so no stale memory reaches the disk.
    auto* bytes = static_cast<uint8_t*>(const_cast<void*>(w.data));
    std::fill(bytes + w.size, bytes + ref.length, uint8_t{0});
    for (uint64_t off = 0; off < ref.length; off += options_.write_chunk_bytes) {
      IoRequest q;
      q.op = IoOp::kWrite;
      q.fd = shards_->fd(ref.shard);
      q.offset = ShardSet::FileOffset(ref.offset + off);
      q.buf = bytes + off;
      q.len = std::min<uint64_t>(options_.write_chunk_bytes, ref.length - off);
      q.file = shards_->path(ref.shard);
      reqs.push_back(q);
      owner.push_back(i);
    }
  }
  write_ops_->Inc(reqs.size());
  io.Run(reqs).IgnoreError("statuses are per request");
  std::vector<Status> failed(objects.size());
  for (size_t r = 0; r < reqs.size(); ++r) {
    write_bytes_->Inc(reqs[r].done);
    if (!reqs[r].status.ok()) {
      write_failures_->Inc();
      if (failed[owner[r]].ok()) failed[owner[r]] = reqs[r].status;
    }
  }
  for (size_t i = 0; i < objects.size(); ++i) {
    ObjectWrite& w = objects[i];
    if (!w.result.ok()) continue;
    if (!failed[i].ok()) {
      Abort(*w.result, failed[i]);
      w.result = failed[i];
      continue;
    }
    if (Status st = Publish(*w.result); !st.ok()) w.result = st;
  }
  write_seconds_->Observe(Seconds(options_.clock->Now() - start));
}

Status SsdStore::ReadExtents(IoEngine& io, std::span<ExtentRead> reads) {
  const Clock::TimePoint start = options_.clock->Now();
  // A bad read fails every read, nothing read: its caller takes each read's
  // status as the verdict on its buffer, so none may stay OK unread.
  auto refuse = [&](Status why) {
    for (ExtentRead& r : reads) r.status = why;
    return why;
  };
  // Live extents of one shard never overlap, so two reads either name the same
  // extent or disjoint ones. The same extent named twice is read once and copied.
  std::vector<ReadRange> ranges;
  std::vector<size_t> range_owner;                // range -> index in reads
  std::vector<std::pair<size_t, size_t>> copies;  // (duplicate, original)
  std::map<std::pair<uint32_t, uint64_t>, size_t> first;
  ranges.reserve(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    ExtentRead& r = reads[i];
    r.status = Status::OK();
    if (r.ref.shard >= shards_->count() || r.ref.length == 0 || r.ref.length % kExtentAlign != 0 ||
        r.ref.offset % kExtentAlign != 0 || r.ref.offset + r.ref.length > shard_capacity_ ||
        r.buf == nullptr || reinterpret_cast<uintptr_t>(r.buf) % kExtentAlign != 0) {
      return refuse(Status::InvalidArgument("extent read outside the store or unaligned buffer"));
    }
    auto [it, inserted] = first.emplace(std::make_pair(r.ref.shard, r.ref.offset), i);
    if (!inserted) {
      if (reads[it->second].ref.length != r.ref.length) {
        return refuse(
            Status::InvalidArgument("two reads name overlapping extents of different lengths"));
      }
      copies.emplace_back(i, it->second);
      continue;
    }
    ranges.push_back({r.ref.shard, r.ref.offset, r.ref.length});
    range_owner.push_back(i);
  }
  std::vector<CoalescedRead> groups = CoalesceReads(ranges, kExtentAlign, options_.max_read_bytes);
  // Each coalesced read covers whole, disjoint extents, so it is a vectored read
  // into the members' own buffers: no bounce copy. An extent larger than
  // max_read_bytes appears in several groups, each covering a piece of it.
  std::vector<std::vector<iovec>> iovs(groups.size());
  std::vector<IoRequest> reqs(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const CoalescedRead& c = groups[g];
    for (size_t m : c.members) {
      const ExtentRead& r = reads[range_owner[m]];
      const uint64_t begin = std::max(c.offset, r.ref.offset);
      const uint64_t end = std::min(c.offset + c.length, r.ref.offset + r.ref.length);
      iovs[g].push_back({static_cast<uint8_t*>(r.buf) + (begin - r.ref.offset), end - begin});
    }
    IoRequest& q = reqs[g];
    q.op = IoOp::kRead;
    q.fd = shards_->fd(c.file);
    q.offset = ShardSet::FileOffset(c.offset);
    q.len = c.length;
    q.iov = iovs[g];
    q.file = shards_->path(c.file);
  }
  read_ops_->Inc(reqs.size());
  Status first_error = io.Run(reqs);
  for (size_t g = 0; g < groups.size(); ++g) {
    read_bytes_->Inc(reqs[g].done);
    if (reqs[g].status.ok()) continue;
    read_failures_->Inc();
    for (size_t m : groups[g].members) {
      ExtentRead& r = reads[range_owner[m]];
      if (r.status.ok()) r.status = reqs[g].status;
    }
  }
  for (auto [dup, orig] : copies) {
    reads[dup].status = reads[orig].status;
    if (reads[orig].status.ok())
      std::memcpy(reads[dup].buf, reads[orig].buf, reads[dup].ref.length);
  }
  read_seconds_->Observe(Seconds(options_.clock->Now() - start));
  return first_error;
}

}  // namespace orbitkv
