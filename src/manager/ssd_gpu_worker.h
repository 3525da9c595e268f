// SsdGpuWorker: the cuFile route of one instance/device (spec "Data flow and
// ownership"). Reads SSD extents into registered GPU staging and scatters
// their component bytes into engine pages; writes complete groups gathered
// from engine pages into staging and then to an unpublished SSD extent.
//
// Geometry: two staging slots of `slot_bytes` (4 MiB), each registered with
// cuFile and owning its own stream, an I/O event and a scatter event, plus
// address-stable AsyncIo storage (cuFile reads sizes and offsets when the
// operation runs). 2 x 4 MiB per instance/device, outside --pool-size.
//
// Scheduling (one thread, polling): a slot holds one batch: a read batch
// (up to slot_bytes of extent pieces from any queued restores, sorted by file
// and offset; adjacent pieces in one file become one read, at most 4 MiB;
// different files and gaps stay separate reads; io/coalesce.h) or one write chunk. At most
// two batches are in flight, at most one of them a write; after
// `reads_before_write` read submissions a waiting write gets the next free
// slot. An extent larger than a slot is split into slot-sized pieces.
//
// Completion: the I/O event completes, every read's bytes_done is checked
// against its size (short or failed: the pieces in it fail, nothing of them
// is scattered). Then the batch is verified on the GPU before a byte reaches
// a page: the header of every object whose first piece is in the batch is
// copied to pinned host memory and a CRC32C kernel runs over every segment
// fragment in staging; on the host the header is parsed and matched against
// the item's id and shape (Corruption otherwise), and an object whose
// fragments are all known is checked against the header's payload CRCs
// (Corruption, nothing scattered). An object larger than a slot is header-
// checked before its first scatter and CRC-checked at its last piece, so a
// mismatch there fails the item after earlier pieces were scattered: the
// pages of a failed item hold unspecified bytes, as after a short read of a
// later piece. Then the scatter of good pieces is enqueued and a second event
// proves it finished before the slot is reused or the item reported. A
// refused submission fails its read and the ones after it; reads already
// submitted drain. Writes: memset + header + gather into staging, then
// cuFileWriteAsync; the object is published only after its last chunk wrote
// in full; a failed or short chunk aborts the reservation.
//
// Encoded writes (SubmitEncodedWrite, after EnableEncode): the group is
// encoded on the GPU encode lane (gpu_encode_lane.h) from its pages into the
// lane's arena; the write then gathers the header (pinned host) and the
// frames (arena) into staging chunk by chunk like any write, and the arena
// range is given back when the write's done runs. An encoded object larger
// than a slot is written in slot-sized chunks.
//
// Encoded reads (GpuReadItem::codec, after EnableDecode): the pieces of an
// encoded object are read into the slots as above, but, as the segments'
// places come with the header, nothing is CRC-checked per piece: the first
// piece takes a range of the GPU decode lane's arena (gpu_decode_lane.h; the
// queue waits while none is free), its header is checked (id, slot count,
// codec id and version), and each piece is copied to its place in the range.
// Once all arrived the lane checks every segment's CRC32C on the GPU, decodes
// the frames into the pages and reports the item, while this thread goes on
// with its slots.
//
// Ownership: the caller keeps a read item's source lease and destination
// pages until item_done ran for it, and a write's source pages and header
// until its done ran. Close() stops unsubmitted work (Cancelled) and drains
// submitted batches; the destructor then deregisters and frees staging.
// Callbacks run on the worker thread (or, for CancelRead and Close, on the
// caller's) and must not call back into the worker.
//
// Thread-safe. The worker thread calls CUDA and cuFile with its mutex
// released (ssd_gpu_worker_impl.h), so SubmitRead, SubmitWrite, CancelRead and
// stats() never wait behind the device. Shard file offsets come from the store
// (SsdStore::FileRange) and adjacent pieces merge through io/coalesce.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "codec/codec.h"
#include "gpu/platform.h"
#include "manager/storage_codec.h"
#include "orbitkv/clock.h"
#include "orbitkv/metrics.h"
#include "orbitkv/status.h"
#include "store/catalog.h"
#include "store/key.h"
#include "store/object_id.h"

namespace orbitkv {

class SsdStore;

// The cuFile series of one device (every pointer required).
struct GpuWorkerMetrics {
  Counter* read_bytes = nullptr;
  Counter* write_bytes = nullptr;
  Counter* read_failures = nullptr;
  Counter* write_failures = nullptr;
  Histogram* read_seconds = nullptr;
  Histogram* write_seconds = nullptr;
  Gauge* inflight_batches = nullptr;
  Gauge* staging_bytes = nullptr;
  // GPU encode (EnableEncode): groups admitted and not yet written (queued,
  // encoding, or their encoded object waiting for or under its disk write),
  // and one group's encode (GPU encode, CRCs, header).
  Gauge* encode_pending = nullptr;
  Histogram* encode_seconds = nullptr;
};

struct GpuWorkerOptions {
  gpu::Device* device = nullptr;
  std::vector<gpu::StorageFile*> files;  // one per shard, registered with cuFile
  SsdStore* store = nullptr;             // extents for writes
  uint64_t slot_bytes = 4u << 20;
  uint32_t max_write_jobs = 8;      // queued or active
  uint32_t reads_before_write = 4;  // read submissions a waiting write yields to
  GpuWorkerMetrics metrics;
  Clock* clock = Clock::Real();  // the latency histograms
  // Called (on the worker thread) after a cuFile I/O failure, with the error.
  std::function<void(const Status&)> on_io_failure;
  // Encoded reads (EnableDecode): the share of --codec-budget the worker's
  // GPU decode lane holds (codec arena + decoder scratch), from
  // `codec_budget`, counted on `codec_metrics`. 0: no GPU decode.
  uint64_t codec_budget_bytes = 0;
  // Encoded writes (EnableEncode): the share its GPU encode lane holds
  // (encode arena + encoder scratch), from the same budget. 0: no GPU encode.
  uint64_t encode_budget_bytes = 0;
  CodecBudget* codec_budget = nullptr;
  const CodecMetrics* codec_metrics = nullptr;
};

// Where the component bytes of one object go: object bytes
// [object_offset, +bytes) to device address dst.
struct ScatterSpan {
  uint64_t object_offset = 0;
  uint64_t bytes = 0;
  gpu::DevPtr dst = 0;
};

// An encoded item's slot `slot` decodes into device address dst (16-byte
// aligned, slot_bytes[slot] bytes).
struct DecodeTarget {
  uint32_t slot = 0;
  gpu::DevPtr dst = 0;
};

struct GpuReadItem {
  ExtentRef ref;  // the leased extent (data-region offset, 4 KiB aligned length)
  // What the extent must hold: an object of this id with these slot sizes
  // (store/object_format.h), checked before anything is scattered.
  ObjectId id;
  std::vector<uint64_t> slot_bytes;
  // Raw objects (codec.raw()): the object bytes each span receives.
  std::vector<ScatterSpan> scatter;
  // Encoded objects: `codec` wrote the object (its id and version are
  // checked against the header); its pieces are assembled in the GPU decode
  // lane's arena, CRC-checked on the GPU and decoded into `decode`'s targets
  // (scatter empty). REQUIRES: EnableDecode succeeded and ref.length is at
  // most the capacity it returned.
  NamespaceCodec codec;
  std::vector<DecodeTarget> decode;
};

struct GpuReadRequest {
  std::vector<GpuReadItem> items;
  // Exactly once per item: OK, the read or scatter error, or Cancelled.
  std::function<void(size_t item, Status status)> item_done;
};

// Object bytes [object_offset, +bytes) come from device address src.
struct GatherSpan {
  uint64_t object_offset = 0;
  uint64_t bytes = 0;
  gpu::DevPtr src = 0;
};

struct GpuWriteRequest {
  Key key;
  uint64_t ns = 0;  // the object's namespace: its extent's tag
  uint64_t object_size = 0;
  const uint8_t* header = nullptr;  // pinned host bytes [0, header_bytes) of the object
  uint64_t header_bytes = 0;
  std::vector<GatherSpan> gather;
  std::function<void(Result<ExtentRef>)> done;  // published ref or the error
};

// An encoded group, once its frames are in the GPU encode lane's arena.
struct EncodedObjectView {
  uint64_t object_size = 0;         // header + frames
  std::span<const uint8_t> header;  // the object's header bytes
  // Copies the whole object to pinned host memory [dst, +object_size).
  std::function<Status(uint8_t* dst)> copy_to_host;
};

// A complete group of an encoded namespace, encoded on the GPU from its
// pages (GpuEncodeLane) and written like a GpuWriteRequest.
struct GpuEncodedWriteRequest {
  Key key;
  uint64_t ns = 0;
  ObjectId id;
  NamespaceCodec codec;              // !raw()
  std::vector<uint64_t> slot_bytes;  // the raw slot sizes
  std::vector<gpu::DevPtr> sources;  // each whole slot, 16-byte aligned, slot order
  // Runs on the encode lane's thread once the group is encoded: returns
  // pinned host memory holding the object's header for the write (e.g. a
  // DRAM copy made with view.copy_to_host), valid until `done`; an error
  // ends the write with it.
  std::function<Result<const uint8_t*>(const EncodedObjectView&)> encoded;
  // Exactly once: the published ref or the error, and the encoded object's
  // size (0 when it was not encoded). The arena range is back by then.
  std::function<void(Result<ExtentRef>, uint64_t object_size)> done;
};

struct GpuWorkerStats {
  uint64_t queued_reads = 0;  // read pieces (<= one slot each) not yet submitted
  uint32_t write_jobs = 0;    // admitted, not yet done
  uint32_t inflight_batches = 0;
  uint64_t read_submissions = 0, write_submissions = 0;
};

class SsdGpuWorker {
 public:
  using JobId = uint64_t;

  // Allocates and registers both slots and their streams and events.
  // Errors (allocation, cuFile buffer or stream registration) release what
  // was made and are returned as is.
  static Result<std::unique_ptr<SsdGpuWorker>> Create(GpuWorkerOptions options);
  ~SsdGpuWorker();  // Close(), then deregisters and frees staging

  // Queues a restore's reads. InvalidArgument (nothing queued) for a scatter
  // span outside its object, an unknown shard, or an item without slots or
  // whose object header does not fit a slot; Cancelled after Close.
  Result<JobId> SubmitRead(GpuReadRequest request);
  // Reserves an extent and queues the write. ResourceExhausted when
  // max_write_jobs are admitted (nothing reserved); the store's error when no
  // extent can be reserved; Cancelled after Close.
  Status SubmitWrite(GpuWriteRequest request);
  // Admits an encoded group (a write permit, as SubmitWrite, and its range of
  // the encode lane's arena) and queues its encode; once encoded, its extent
  // is reserved and the write queued as SubmitWrite's. ResourceExhausted
  // when max_write_jobs are admitted, Busy when the arena has no room now
  // (nothing taken); FailedPrecondition without EnableEncode; InvalidArgument for a
  // group the lane cannot encode; Cancelled after Close. Later failures
  // (encode, extent, write) come to `done`.
  Status SubmitEncodedWrite(GpuEncodedWriteRequest request);
  // Creates the GPU encode lane for encoded writes, once (later calls return
  // the first outcome): the arena's capacity. ResourceExhausted when the
  // codec budget cannot hold its share; the platform's errors (Unavailable:
  // no frame encoder).
  Result<uint64_t> EnableEncode();
  // Creates the GPU decode lane for encoded reads, once (later calls return
  // the first outcome's capacity or error): the largest encoded object it can
  // stage. ResourceExhausted when the codec budget cannot hold its share
  // (then encoded reads take the host reader); the platform's errors.
  Result<uint64_t> EnableDecode();
  // Cancels the job's items of which no byte was submitted (item_done with
  // Cancelled runs for each before this returns). Returns how many.
  uint32_t CancelRead(JobId job);
  // Stops unsubmitted work (Cancelled) and waits for submitted batches.
  void Close();

  GpuWorkerStats stats() const;

 private:
  struct Impl;
  explicit SsdGpuWorker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orbitkv
