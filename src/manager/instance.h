// Instance: one registered engine instance (DESIGN.md "instance"): its layout,
// its mapped page memory (memfd regions for host instances; CUDA IPC mappings
// and two copy streams for "cuda:N" ones), the shapes of its groups, and the
// copies between objects in pinned host memory and its pages. Create()
// validates a RegisterRequest and maps its regions; SessionTable::Add gives it
// an id and a namespace. InstanceGuard holds it open for one operation:
// BeginClose() waits until no guard is left, and only then ReleaseDevice()
// unmaps what the operations used. Thread-safe as annotated.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "gpu/platform.h"
#include "manager/host_copier.h"
#include "manager/host_region.h"
#include "manager/storage_codec.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/metrics.h"
#include "orbitkv/model_description.h"
#include "orbitkv/status.h"
#include "recovery/model_description.h"
#include "store/dram_cache.h"
#include "store/object_format.h"
#include "store/object_id.h"

namespace orbitkv {

class Instance {
 public:
  // Validates `request` (namespace, device, layout, one memfd per region for
  // host instances, one IPC handle per region for CUDA ones) and maps every
  // region; `fds` are closed in every case. `gpu` may be null (`no_gpu` says
  // why CUDA instances are refused then).
  static Result<std::shared_ptr<Instance>> Create(SessionId session, const RegisterRequest& request,
                                                  std::vector<int> fds, gpu::Platform* gpu,
                                                  const std::string& no_gpu);
  ~Instance() { ReleaseDevice(); }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  // ---- constant once registered (Create, then SessionTable::Add) ----------
  InstanceId id = 0;
  SessionId session = 0;
  uint64_t ns = 0;  // the interned namespace
  std::string ns_name;
  uint32_t rank = 0;
  std::string device_name;  // as registered ("host", "cuda:0")
  InstanceLayout layout;
  std::map<uint32_t, const GroupLayout*> groups;  // into layout.groups
  std::map<uint32_t, std::shared_ptr<const ObjectShape>> shapes;
  // What the namespace is interned under: the name and, for a hybrid model,
  // the fingerprint of its description (recovery::MakeNamespaceKey).
  recovery::NamespaceKey ns_key;
  // A hybrid model (absent: dense): its validated description, the object-key
  // mask of each of its groups (recovery::GroupMasks, in group order), and the
  // description group that each storage group holds.
  std::optional<ModelDescription> model;
  std::vector<BlockKey> masks;
  std::map<uint32_t, uint32_t> model_group;  // storage_group -> index into model->groups
  bool hybrid() const { return model.has_value(); }
  // The object that chain key `chain_key` names in storage group `group`: the
  // key as sent for a dense instance, ObjectKey(chain_key, mask of the group)
  // for a hybrid one. REQUIRES: `group` is one of the layout's (hybrid: of the
  // description's storage groups).
  ObjectId Object(uint32_t group, const BlockKey& chain_key) const;
  NamespaceCodec codec;                         // of the namespace's objects
  const CodecMetrics* codec_metrics = nullptr;  // the Manager's (outlives the instance)
  // Host pages: who runs CopyAndWait's memcpys (the Manager's, outlives the
  // instance); null: the calling thread alone. Set before the instance is shared.
  HostCopier* host_copier = nullptr;
  // Opt-in cost observations of the copy jobs (ORBITKV_COST_OBSERVATIONS):
  // index 0 H2D, 1 D2H; null when off. Set before the instance is shared.
  Histogram* cost_copy_enqueue[2] = {nullptr, nullptr};
  Histogram* cost_copy_wait[2] = {nullptr, nullptr};
  Histogram* cost_copy_call[2] = {nullptr, nullptr};  // the CopyAsync call alone (enqueue's part)
  Histogram* cost_crc_launch = nullptr;  // a D2H job's Crc32cAsync call (enqueue's part)

  bool cuda() const { return device_ != nullptr; }
  // REQUIRES: cuda(), and a guard is held (the device lives until ReleaseDevice).
  gpu::Device& device() const { return *device_; }
  gpu::DevPtr DevicePage(const SlotLayout& s, uint64_t page) const {
    return mappings_[s.region].base + SlotPageOffset(s, page);
  }
  uint8_t* HostPage(const SlotLayout& s, uint64_t page) const {
    return regions_[s.region]->data() + SlotPageOffset(s, page);
  }
  size_t ipc_mappings() const { return ipc_mappings_.load(); }

  // ---- copies (the caller holds a guard) ----------------------------------
  // Runs `ops` on the H2D (to_device) or a D2H stream and waits for this
  // job's own event. OK at once when ops is empty. Host pages: the ops are
  // host addresses, memcpy'd through host_copier (either direction).
  Status CopyAndWait(bool to_device, std::span<const gpu::CopyOp> ops) EXCLUDES(h2d_mu_, d2h_mu_);
  // D2H `ops` and the CRC32C of each range of `crcs` (engine pages) into
  // `out` (pinned or device memory, crcs.size() entries); waits for both.
  // Publish's batches: the segment CRCs on the GPU, not the CPU. The CRCs read
  // the pages, not the copies, so with both they run on a second D2H stream
  // beside the copies (REQUIRES: nothing writes the ranges until the wait).
  Status CopyToHostWithCrcs(std::span<const gpu::CopyOp> ops, std::span<const gpu::CrcOp> crcs,
                            uint32_t* out) EXCLUDES(d2h_mu_);
  // The two halves of CopyToHostWithCrcs, so a caller can build its next job
  // while this one's copies run (Publish's pipeline). Each job has a D2H
  // stream to itself until its wait (made on demand, so as many jobs may be
  // in flight as callers hold, and the staged mover always finds an idle
  // stream); `crcs` may be empty. Wait on every enqueued job exactly once.
  // A job of copies and CRCs has a second stream and event for the CRC
  // kernels: launched behind a stream's pending copies, a launch cost the
  // enqueue 40-50 us more on the H200 (docs/bench/history.md, session 15).
  struct ToHostJob {
    std::unique_ptr<gpu::Event> event;
    gpu::Stream* stream = nullptr;
    std::unique_ptr<gpu::Event> crc_event;          // with crc_stream
    gpu::Stream* crc_stream = nullptr;              // the CRCs' own stream, or null
    std::chrono::steady_clock::time_point started;  // its enqueue began
    std::chrono::steady_clock::time_point enqueued;
    bool crcs = false;
    uint64_t bytes = 0;  // the copies' and CRCs' bytes (which wait it takes)
  };
  // On an error nothing of the job is left running (its streams are drained
  // and given back).
  Result<ToHostJob> EnqueueToHost(std::span<const gpu::CopyOp> ops,
                                  std::span<const gpu::CrcOp> crcs, uint32_t* out)
      EXCLUDES(d2h_mu_);
  // `more_queued`: the caller has later jobs of its own in flight behind this
  // one, so its end is not needed the moment it comes: the wait sleeps at once
  // (Device::WaitLong), as it does for a job of gpu::kLongWaitBytes or more.
  Status WaitToHost(ToHostJob& job, bool more_queued = false) EXCLUDES(d2h_mu_);
  // Publish's whole-object gather (gpu::SlotTable) of storage group `group`
  // over every slot this instance holds (g.slots order, at the shape's
  // segment offsets): made at the group's first call and kept until
  // ReleaseDevice, so a batch is one descriptor per object, not two per slot
  // (issue 18: the 70B TP=8 rank's 160 slots of 4 KiB). Null, logged once per
  // group, where the pages do not gather (host pages, an instance writing only
  // some of the group's slots, a slot over gpu::kGatherSlotMaxBytes, a device
  // that does not): copy slot by slot then.
  const gpu::SlotTable* GatherTable(uint32_t group) EXCLUDES(gather_mu_);
  // EnqueueToHost for a gather: each object's slots from its page, and their
  // CRC32Cs into `crcs` (table.slots() per object), on one D2H stream. Wait
  // on it with WaitToHost.
  Result<ToHostJob> EnqueueGatherToHost(const gpu::SlotTable& table,
                                        std::span<const gpu::ObjectGather> objects, uint32_t* crcs)
      EXCLUDES(d2h_mu_);
  // CRC32C of each slot's bytes of `page` (g.slots order) into pinned `out`,
  // computed on the D2H stream.
  Status PageCrcs(const GroupLayout& g, uint64_t page, uint32_t* out) EXCLUDES(d2h_mu_);
  // The H2D copies of CUDA pages from ObjectToPages, and the pinned scratch
  // (from `pool`, registered with CUDA like the pool) holding the decoded
  // segments they copy from, returned when this goes (after the copies).
  struct PageCopies {
    explicit PageCopies(DramCache* pool) : pool(pool) {}
    ~PageCopies() {
      for (const DramView& v : scratch) pool->ReleaseScratch(v);
    }
    PageCopies(const PageCopies&) = delete;
    PageCopies& operator=(const PageCopies&) = delete;
    // Drops the ops after the first `ops` and returns the scratch after the
    // first `scratch` (a block that failed part way through).
    void Truncate(size_t ops_kept, size_t scratch_kept) {
      ops.resize(ops_kept);
      for (size_t i = scratch_kept; i < scratch.size(); ++i) {
        scratch_bytes_ -= scratch[i].capacity;
        pool->ReleaseScratch(scratch[i]);
      }
      scratch.resize(scratch_kept);
    }
    void AddScratch(const DramView& v) {
      scratch.push_back(v);
      scratch_bytes_ += v.capacity;
    }
    uint64_t scratch_bytes() const { return scratch_bytes_; }
    std::vector<gpu::CopyOp> ops;
    DramCache* const pool;
    std::vector<DramView> scratch;  // AddScratch

   private:
    uint64_t scratch_bytes_ = 0;
  };
  // The header of `object` (an object of storage group `group` in host
  // memory; only its first header_bytes are read) parsed and checked to be
  // `id`'s of this group's shape (ParseObjectHeader, CheckObjectMatches):
  // Corruption saying which check failed otherwise. No payload byte is read.
  Result<ParsedHeader> MatchedHeader(uint32_t group, std::span<const uint8_t> object,
                                     const ObjectId& id) const;
  // Checks one object (host memory) against its id and shape, then copies its
  // segments into `page` for every slot this instance holds: the copies are
  // appended to `copies` (for host pages as host addresses; CopyAndWait runs
  // them), except that an encoded object decodes straight into host pages. `from_ssd`:
  // every segment's payload CRC32C is checked first (raw DRAM entries were
  // checked when they entered the pool). An encoded object (storage_codec.h)
  // is always checked (codec, version, every segment's CRC) and then decoded
  // on the CPU: into host pages, or into pinned scratch for CUDA pages (no
  // room there: ResourceExhausted for the block).
  Status ObjectToPages(uint32_t group, std::span<const uint8_t> object, const ObjectId& id,
                       uint64_t page, bool from_ssd, PageCopies* copies) const;

  // ---- operations and teardown ---------------------------------------------
  // A hold for one operation; Cancelled once BeginClose started.
  Status Hold() EXCLUDES(mu_);
  // One more hold, granted even while closing. REQUIRES: the caller has one.
  void HoldAgain() EXCLUDES(mu_);
  void Unhold() EXCLUDES(mu_);
  // Refuses new holds and waits until the last one is gone.
  void BeginClose() EXCLUDES(mu_);
  // Drains the streams, then closes the IPC mappings. REQUIRES: BeginClose
  // returned (or the instance was never registered), and any SSD worker of
  // the instance was retired (CufileRoute::Retire).
  void ReleaseDevice();

  // DRAM assemblies this instance wrote fragments of and did not seal; aborted
  // when it unregisters, so a dead writer's bytes return to the pool at once.
  // Entries sealed by other writers are pruned lazily.
  void NotePartial(EntryId entry, DramCache& dram) EXCLUDES(mu_);
  void ForgetPartial(EntryId entry) EXCLUDES(mu_);
  // Aborts them; returns how many were still assembling.
  size_t AbortPartials(DramCache& dram) EXCLUDES(mu_);

 private:
  Instance() = default;

  // Constant after Create until ReleaseDevice (after the last guard).
  std::vector<std::unique_ptr<HostRegion>> regions_;
  gpu::Device* device_ = nullptr;
  std::vector<gpu::IpcMapping> mappings_;  // one per region
  std::unique_ptr<gpu::Stream> h2d_;
  std::atomic<size_t> ipc_mappings_{0};

  // A job's copies and its event are contiguous on a stream.
  Mutex h2d_mu_;
  // The two ends of every D2H job's enqueue (EnqueueToHost, EnqueueGatherToHost):
  // its event and stream; then, given what enqueueing returned, its event
  // recorded, or everything of a failed job drained and given back, and the
  // enqueue's cost observed.
  Result<ToHostJob> StartToHostJob() EXCLUDES(d2h_mu_);
  Result<ToHostJob> FinishToHostEnqueue(ToHostJob job, Status st) EXCLUDES(d2h_mu_);
  // D2H streams: one per job in flight, kept for reuse.
  Result<gpu::Stream*> TakeD2hStream() EXCLUDES(d2h_mu_);
  void GiveD2hStream(gpu::Stream* s) EXCLUDES(d2h_mu_);
  Mutex d2h_mu_;
  std::vector<std::unique_ptr<gpu::Stream>> d2h_ GUARDED_BY(d2h_mu_);
  std::vector<gpu::Stream*> d2h_idle_ GUARDED_BY(d2h_mu_);
  // Copy jobs' events, kept for reuse (an event is idle once waited for): a
  // job does not create and destroy one.
  Result<std::unique_ptr<gpu::Event>> TakeEvent() EXCLUDES(events_mu_);
  void GiveEvent(std::unique_ptr<gpu::Event> e) EXCLUDES(events_mu_);
  Mutex events_mu_;
  std::vector<std::unique_ptr<gpu::Event>> idle_events_ GUARDED_BY(events_mu_);

  // GatherTable's, by group; null: tried, this group does not gather.
  Mutex gather_mu_;
  std::map<uint32_t, std::unique_ptr<gpu::SlotTable>> gather_tables_ GUARDED_BY(gather_mu_);

  Mutex mu_;
  CondVar cv_;
  int inflight_ GUARDED_BY(mu_) = 0;
  bool closing_ GUARDED_BY(mu_) = false;
  std::unordered_set<EntryId> partial_ GUARDED_BY(mu_);
  size_t partial_prune_at_ GUARDED_BY(mu_) = 64;
};

// An object in pinned host memory to restore into `page` of storage group
// `group` of an instance (the GPU restore paths' unit of work).
struct PageObject {
  std::span<const uint8_t> object;
  ObjectId id;
  uint32_t group = 0;
  uint64_t page = 0;
};

// Holds an instance open for one operation (Instance::Hold); move-only.
class InstanceGuard {
 public:
  InstanceGuard() = default;
  // Takes a hold on `inst`; Cancelled while it is unregistering.
  static Result<InstanceGuard> Take(std::shared_ptr<Instance> inst);
  InstanceGuard(InstanceGuard&& o) noexcept : inst_(std::move(o.inst_)) {}
  InstanceGuard& operator=(InstanceGuard&& o) noexcept {
    Reset();
    inst_ = std::move(o.inst_);
    return *this;
  }
  ~InstanceGuard() { Reset(); }
  Instance* operator->() const { return inst_.get(); }
  Instance& operator*() const { return *inst_; }
  // A second hold on the same instance. REQUIRES: this guard holds one.
  InstanceGuard Share() const;
  void Reset();

 private:
  explicit InstanceGuard(std::shared_ptr<Instance> inst) : inst_(std::move(inst)) {}
  std::shared_ptr<Instance> inst_;
};

}  // namespace orbitkv
