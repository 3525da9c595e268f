#include "manager/manager.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "manager/host_region.h"
#include "manager/ssd_backend.h"
#include "manager/ssd_gpu_worker.h"
#include "manager/work_queue.h"
#include "orbitkv/device.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/crc32c.h"
#include "store/object_format.h"
#include "store/ssd_store.h"

namespace orbitkv {
namespace {

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

Key ToKey(const BlockKey& k) {
  Key out;
  out.bytes = k;
  return out;
}

// The shape every instance of a namespace agrees on for one group.
struct GroupShape {
  std::vector<uint64_t> slot_bytes;
  std::vector<SegmentPos> segments;
  uint64_t header_bytes = 0;
  uint64_t object_size = 0;
};

struct Instance {
  ~Instance() { ReleaseDevice(); }
  InstanceId id = 0;
  SessionId session = 0;
  uint64_t ns = 0;
  std::string ns_name;
  uint32_t rank = 0;
  InstanceLayout layout;
  std::vector<std::unique_ptr<HostRegion>> regions;
  std::map<uint32_t, const GroupLayout*> groups;  // into layout.groups
  std::map<uint32_t, std::shared_ptr<const GroupShape>> shapes;

  std::mutex mu;
  std::condition_variable cv;
  int inflight = 0;      // guarded by mu
  bool closing = false;  // guarded by mu

  // CUDA instances: the device, the mapped regions and the copy streams.
  gpu::Device* device = nullptr;
  std::vector<gpu::IpcMapping> mappings;  // one per region
  std::unique_ptr<gpu::Stream> h2d, d2h;
  std::mutex h2d_mu, d2h_mu;  // a job's copies and its event are contiguous
  std::mutex worker_mu;
  std::unique_ptr<SsdGpuWorker> worker;  // guarded by worker_mu; created on first use

  bool cuda() const { return device != nullptr; }
  gpu::DevPtr DevicePage(const SlotLayout& s, uint64_t page) const {
    return mappings[s.region].base + SlotPageOffset(s, page);
  }
  // Drains and releases the worker, the streams, then the mappings.
  void ReleaseDevice() {
    if (!device) return;
    std::unique_ptr<SsdGpuWorker> w;
    {
      std::lock_guard<std::mutex> l(worker_mu);
      w = std::move(worker);
    }
    w.reset();  // Close: drains submitted batches, deregisters staging
    for (auto* s : {h2d.get(), d2h.get()}) {
      if (s) device->Synchronize(*s).IgnoreError("instance teardown");
    }
    h2d.reset();
    d2h.reset();
    for (const gpu::IpcMapping& m : mappings) {
      if (Status st = device->CloseIpc(m.base); !st.ok()) {
        OKV_LOG_WARN("instance {}: closing a CUDA IPC mapping failed: {}", id, st.ToString());
      }
    }
    std::lock_guard<std::mutex> l(worker_mu);
    mappings.clear();
    device = nullptr;
  }
};

// Holds an instance open for one operation; Unregister waits for all of them.
class InstanceGuard {
 public:
  InstanceGuard() = default;
  explicit InstanceGuard(std::shared_ptr<Instance> inst) : inst_(std::move(inst)) {}
  InstanceGuard(InstanceGuard&& o) noexcept : inst_(std::move(o.inst_)) {}
  InstanceGuard& operator=(InstanceGuard&& o) noexcept {
    Reset();
    inst_ = std::move(o.inst_);
    return *this;
  }
  ~InstanceGuard() { Reset(); }
  Instance* operator->() const { return inst_.get(); }
  // A second hold on the same instance. REQUIRES: this guard holds one.
  InstanceGuard Share() const {
    {
      std::lock_guard<std::mutex> l(inst_->mu);
      ++inst_->inflight;
    }
    return InstanceGuard(inst_);
  }
  Instance& operator*() const { return *inst_; }
  void Reset() {
    if (!inst_) return;
    {
      std::lock_guard<std::mutex> l(inst_->mu);
      --inst_->inflight;
    }
    inst_->cv.notify_all();
    inst_.reset();
  }

 private:
  std::shared_ptr<Instance> inst_;
};

struct QueryBlock {
  ObjectId id;
  Tier tier = Tier::kNone;
  uint64_t size = 0;   // logical object bytes
  DramView dram;       // kDram: the pinned entry this block holds
  ExtentRef ref;       // kSsd
  LeaseId lease = 0;   // kSsd: one interest
  bool taken = false;  // moved into a restore or released
};

struct QueryRec {
  QueryId id = 0;
  SessionId session = 0;
  InstanceId instance = 0;
  uint32_t group = 0;
  Clock::TimePoint deadline;
  std::vector<QueryBlock> blocks;
};

struct RestoreBlock {
  size_t result = 0;  // index into RestoreRec::results
  QueryBlock src;
  uint64_t page = 0;
  DramView scratch;  // SSD route: where the object was read
};

struct RestoreRec {
  RestoreId id = 0;
  SessionId session = 0;
  InstanceGuard inst;
  uint32_t group = 0;
  Manager::RestoreDone done;
  Clock::TimePoint start;
  std::mutex mu;
  std::vector<BlockResult> results;  // guarded by mu
  size_t remaining = 0;              // guarded by mu
  // SSD part: the cuFile job (cancellation) and the cost observation.
  InstanceId instance = 0;
  std::atomic<SsdGpuWorker*> worker{nullptr};  // the cuFile job, for CancelRestore
  std::atomic<SsdGpuWorker::JobId> gpu_job{0};
  size_t ssd_remaining = 0;  // guarded by mu
  Histogram* ssd_cost = nullptr;
  Clock::TimePoint ssd_start;
};

struct ReadJob {
  std::shared_ptr<RestoreRec> restore;  // restore read, or
  std::vector<RestoreBlock> blocks;
  std::vector<QueryBlock> prepare;           // prepare (warm-up) reads
  std::vector<uint64_t> prepare_slot_bytes;  // prepare: the group's shape
};

// Complete-group cuFile writes of one Publish call, waited for before it returns.
struct DirectWrites {
  std::mutex mu;
  std::condition_variable cv;
  int outstanding = 0;  // guarded by mu
  struct Done {
    ObjectId id;
    bool dram_copy = false;
    DramView scratch;  // the header's pinned staging when there is no DRAM copy
    Status status;
  };
  std::vector<Done> done;  // guarded by mu
};

struct CopyJob {
  std::shared_ptr<RestoreRec> restore;
  std::vector<RestoreBlock> blocks;
  std::vector<Status> read_status;
};

}  // namespace

struct Manager::Impl {
  ManagerConfig config;
  MetricsRegistry* metrics;
  std::unique_ptr<DramCache> dram;
  // Bounded staging for SSD demand reads and warm-up, carved from --pool-size
  // so reads never compete with published objects for room.
  std::unique_ptr<DramCache> staging;
  std::mutex staging_mu;
  std::condition_variable staging_cv;
  // Publishers wait here (bounded) for writeback to free pool room.
  std::mutex pool_mu;
  std::condition_variable pool_cv;
  std::unique_ptr<SsdStore> ssd;

  // Lanes (null without SSD). Engines: one per lane thread.
  std::vector<std::unique_ptr<IoEngine>> writeback_io, read_io;
  std::unique_ptr<WorkQueue<ObjectId>> writeback;
  std::unique_ptr<WorkQueue<ReadJob>> reader;
  std::unique_ptr<WorkQueue<CopyJob>> host_restore;
  std::atomic<int64_t> lane_work{0};
  std::mutex drain_mu;
  std::condition_variable drain_cv;

  mutable std::mutex mu;
  std::atomic<uint64_t> next_id{1};
  std::unordered_map<SessionId, int> sessions;  // guarded by mu: pid
  std::map<std::string, uint64_t> ns_ids;       // guarded by mu
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<const GroupShape>> shapes;  // mu
  std::unordered_map<InstanceId, std::shared_ptr<Instance>> instances;  // guarded by mu
  std::unordered_map<QueryId, QueryRec> queries;                        // guarded by mu
  std::unordered_map<RestoreId, std::weak_ptr<RestoreRec>> restores;    // guarded by mu
  uint64_t budget_used = 0;                                             // guarded by mu
  uint64_t budget = 0;

  // GPU storage tier.
  SsdBackendSelection backend;  // cuFile file registrations when selected
  std::atomic<bool> cufile_admit{false};
  Counter *gpu_write_fallbacks = nullptr, *backend_fallbacks = nullptr;
  Counter *bytes_restore_cufile = nullptr, *bytes_writeback_cufile = nullptr;
  Histogram *cost_uring = nullptr, *cost_cufile = nullptr;  // ORBITKV_COST_OBSERVATIONS=1
  std::mutex gpu_metrics_mu;
  std::map<int, GpuWorkerMetrics> gpu_metrics;  // guarded by gpu_metrics_mu; by device

  std::thread reaper;
  std::mutex reaper_mu;
  std::condition_variable reaper_cv;
  bool stopping = false;  // guarded by reaper_mu

  // Metrics.
  Counter *hits_dram, *hits_ssd, *misses;
  Counter *bytes_publish, *bytes_restore_dram, *bytes_restore_ssd, *bytes_writeback, *bytes_prepare;
  Counter *publish_objects, *publish_skipped, *publish_pool_full, *writeback_queue_full,
      *read_queue_full;
  Counter *restore_blocks_ok, *restore_blocks_failed, *restore_cancelled, *queries_expired;
  Histogram *publish_seconds, *restore_seconds, *query_seconds;
  uint64_t collector = 0;

  // ---- GPU storage tier ------------------------------------------------------

  // The spec's cuFile series of one device, labelled device="cuda:N".
  GpuWorkerMetrics DeviceMetrics(int ordinal) {
    std::lock_guard<std::mutex> l(gpu_metrics_mu);
    auto it = gpu_metrics.find(ordinal);
    if (it != gpu_metrics.end()) return it->second;
    MetricsRegistry& m = *metrics;
    const Labels dev{{"device", "cuda:" + std::to_string(ordinal)}};
    GpuWorkerMetrics g;
    g.read_bytes = m.GetCounter("orbitkv_ssd_cufile_read_bytes_total",
                                "Physical bytes read through cuFile, including alignment.", dev);
    g.write_bytes =
        m.GetCounter("orbitkv_ssd_cufile_write_bytes_total",
                     "Physical bytes written through cuFile, including alignment.", dev);
    g.read_failures = m.GetCounter("orbitkv_ssd_cufile_read_failures_total",
                                   "cuFile reads that failed or were short.", dev);
    g.write_failures = m.GetCounter("orbitkv_ssd_cufile_write_failures_total",
                                    "cuFile writes that failed or were short.", dev);
    g.read_seconds = m.GetHistogram(
        "orbitkv_ssd_cufile_read_seconds",
        "cuFile read batch submission to scatter completion (excludes waiting for a slot).",
        LatencyBuckets(), dev);
    g.write_seconds = m.GetHistogram(
        "orbitkv_ssd_cufile_write_seconds",
        "cuFile write job: its chunks' submission to completion, gather included (excludes "
        "waiting for a slot).",
        LatencyBuckets(), dev);
    g.inflight_batches = m.GetGauge("orbitkv_ssd_cufile_inflight_batches",
                                    "cuFile slots occupied through I/O and scatter.", dev);
    g.staging_bytes = m.GetGauge("orbitkv_ssd_gpu_staging_bytes",
                                 "Allocated registered GPU staging memory.", dev);
    gpu_metrics[ordinal] = g;
    return g;
  }

  bool UseCufileRead(const Instance& inst) const {
    if (!inst.cuda() || !backend.cufile) return false;
    if (config.options.ssd_read_path) {
      return *config.options.ssd_read_path == SsdReadPath::kCufile;  // explicit: never switched
    }
    return cufile_admit.load();
  }
  bool UseCufileWrite(const Instance& inst) const {
    return inst.cuda() && backend.cufile && cufile_admit.load();
  }

  // A cuFile buffer or I/O failure. Under auto, new cuFile work stops until
  // restart (once, counted); the failing operation reports its own error.
  void OnCufileFailure(const Status& st) {
    if (config.options.ssd_backend != SsdBackend::kAuto) {
      OKV_LOG_WARN("cuFile failure (--ssd-backend cufile keeps cuFile): {}", st.ToString());
      return;
    }
    if (cufile_admit.exchange(false)) {
      backend_fallbacks->Inc();
      OKV_LOG_WARN(
          "SSD backend fallback: cuFile failed ({}); auto stops admitting cuFile work and new "
          "SSD work uses io_uring until restart{}",
          st.ToString(),
          config.options.ssd_read_path == SsdReadPath::kCufile
              ? " (reads stay on cuFile: --ssd-read-path cufile is explicit)"
              : "");
    }
  }

  // The instance's SSD worker, created on first use.
  Result<SsdGpuWorker*> Worker(Instance& inst) {
    std::lock_guard<std::mutex> l(inst.worker_mu);
    if (inst.worker) return inst.worker.get();
    GpuWorkerOptions o;
    o.device = inst.device;
    for (auto& f : backend.files) o.files.push_back(f.get());
    o.store = ssd.get();
    o.slot_bytes = config.gpu_slot_bytes;
    o.max_write_jobs = config.gpu_max_write_jobs;
    o.metrics = DeviceMetrics(inst.device->ordinal());
    o.on_io_failure = [this](const Status& st) { OnCufileFailure(st); };
    Result<std::unique_ptr<SsdGpuWorker>> w = SsdGpuWorker::Create(std::move(o));
    if (!w.ok()) {
      OKV_LOG_WARN("instance {}: creating its cuFile worker failed: {}", inst.id,
                   w.status().ToString());
      OnCufileFailure(w.status());
      return w.status();
    }
    inst.worker = std::move(w).value();
    OKV_LOG_INFO("instance {}: cuFile worker on cuda:{} (2 x {} registered staging)", inst.id,
                 inst.device->ordinal(), FormatByteSize(config.gpu_slot_bytes));
    return inst.worker.get();
  }

  // Runs `ops` on the instance's H2D (to_device) or D2H stream and waits for
  // this job's own event.
  Status CopyAndWait(Instance& inst, bool to_device, std::span<const gpu::CopyOp> ops) {
    if (ops.empty()) return Status::OK();
    ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ev, inst.device->CreateEvent());
    {
      std::lock_guard<std::mutex> l(to_device ? inst.h2d_mu : inst.d2h_mu);
      gpu::Stream& s = to_device ? *inst.h2d : *inst.d2h;
      ORBITKV_RETURN_IF_ERROR(inst.device->CopyAsync(ops, s));
      ORBITKV_RETURN_IF_ERROR(inst.device->Record(*ev, s));
    }
    return inst.device->Wait(*ev).WithContext(to_device ? "H2D copy into engine pages"
                                                        : "D2H copy from engine pages");
  }

  void QueueWriteback(ObjectId id) {
    LaneStarted();
    if (!writeback->TryPush(id)) {
      writeback_queue_full->Inc();
      if (auto w = dram->TakeWriteback(id)) dram->FinishWriteback(*w, false);
      LaneDone();
    }
  }

  // CRC32C of each slot's bytes of `page` (in g.slots order) into pinned
  // `out`, computed on the instance's D2H stream.
  Status PageCrcs(Instance& inst, const GroupLayout& g, uint64_t page, uint32_t* out) {
    std::vector<gpu::CrcOp> ops;
    for (const SlotLayout& s : g.slots) ops.push_back({inst.DevicePage(s, page), s.bytes_per_page});
    ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ev, inst.device->CreateEvent());
    {
      std::lock_guard<std::mutex> l(inst.d2h_mu);
      ORBITKV_RETURN_IF_ERROR(inst.device->Crc32cAsync(ops, out, *inst.d2h));
      ORBITKV_RETURN_IF_ERROR(inst.device->Record(*ev, *inst.d2h));
    }
    return inst.device->Wait(*ev).WithContext("CRC32C of engine pages");
  }

  // Hands one sealed complete group to the instance's cuFile worker, written
  // from its pages. Header bytes come from the DRAM copy when there is one,
  // else from pinned staging. False when cuFile did not take it (no worker,
  // no staging, admission full: counted, or no extent): the caller falls back.
  bool SubmitDirectWrite(Instance& inst, const GroupLayout& g, const GroupShape& shape,
                         const ObjectId& id, uint64_t page, const uint8_t* dram_header,
                         const std::shared_ptr<DirectWrites>& dw) {
    Result<SsdGpuWorker*> worker = Worker(inst);
    if (!worker.ok()) return false;
    DramView scratch{};
    const uint8_t* header = dram_header;
    if (header == nullptr) {
      // No DRAM copy: the payload CRCs come from the pages, on the GPU,
      // into pinned staging after the header.
      const uint64_t crc_at = shape.header_bytes;
      Result<DramView> sv = staging->AllocateScratch(crc_at + 4 * uint64_t{g.num_slots});
      if (!sv.ok()) return false;
      scratch = *sv;
      auto* out = reinterpret_cast<uint32_t*>(scratch.data + crc_at);
      Status st = PageCrcs(inst, g, page, out);
      if (!st.ok()) {
        OKV_LOG_WARN("cuFile write of a group not submitted: {}", st.ToString());
        ReleaseStaging(scratch);
        return false;
      }
      std::vector<uint32_t> crcs(g.num_slots);
      for (size_t k = 0; k < g.slots.size(); ++k) crcs[g.slots[k].slot_id] = out[k];
      WriteObjectHeader(id, shape.slot_bytes, /*codec=*/0, crcs, {scratch.data, crc_at});
      header = scratch.data;
    }
    GpuWriteRequest w;
    w.key = StoreKey(id);
    w.object_size = shape.object_size;
    w.header = header;
    w.header_bytes = shape.header_bytes;
    for (const SlotLayout& s : g.slots) {
      w.gather.push_back(
          {shape.segments[s.slot_id].offset, s.bytes_per_page, inst.DevicePage(s, page)});
    }
    const bool dram_copy = dram_header != nullptr;
    w.done = [dw, id, dram_copy, scratch](Result<ExtentRef> r) {
      std::lock_guard<std::mutex> l(dw->mu);
      dw->done.push_back({id, dram_copy, scratch, r.status()});
      --dw->outstanding;
      dw->cv.notify_all();
    };
    {
      std::lock_guard<std::mutex> l(dw->mu);
      ++dw->outstanding;
    }
    Status st = (*worker)->SubmitWrite(std::move(w));
    if (st.ok()) return true;
    {
      std::lock_guard<std::mutex> l(dw->mu);
      --dw->outstanding;
    }
    if (scratch.data) ReleaseStaging(scratch);
    if (st.code() == StatusCode::kResourceExhausted) {
      gpu_write_fallbacks->Inc();  // eight GPU writes admitted: D2H + io_uring instead
    } else {
      OKV_LOG_DEBUG("cuFile write of a group not submitted: {}", st.ToString());
    }
    return false;
  }

  // Restores SSD blocks of a CUDA instance through its cuFile worker. Every
  // source lease stays held until that block's GPU scatter completed.
  void StartCufileRead(const std::shared_ptr<RestoreRec>& r, Instance& inst, SsdGpuWorker* worker,
                       std::vector<RestoreBlock> blocks) {
    const GroupLayout* g = inst.groups.at(r->group);
    const GroupShape& shape = *inst.shapes.at(r->group);
    GpuReadRequest req;
    auto taken = std::make_shared<std::vector<RestoreBlock>>();
    for (RestoreBlock& b : blocks) {
      if (!ssd->catalog().Submit(b.src.lease).ok()) {
        FinishBlock(r, b.result, Tier::kSsd,
                    Status::NotFound("SSD lease expired before the read was submitted"));
        continue;
      }
      GpuReadItem it;
      it.ref = b.src.ref;
      it.id = b.src.id;  // checked with the payload CRCs before any scatter
      it.slot_bytes = shape.slot_bytes;
      for (const SlotLayout& s : g->slots) {
        it.scatter.push_back(
            {shape.segments[s.slot_id].offset, s.bytes_per_page, inst.DevicePage(s, b.page)});
      }
      req.items.push_back(std::move(it));
      taken->push_back(b);
    }
    if (taken->empty()) return;
    LaneStarted();
    auto left = std::make_shared<std::atomic<size_t>>(taken->size());
    req.item_done = [this, r, taken, left](size_t i, Status st) {
      RestoreBlock& b = (*taken)[i];
      ssd->catalog().Complete(b.src.lease);
      if (st.ok()) {
        bytes_restore_cufile->Inc(b.src.ref.object_size);
      } else if (st.code() == StatusCode::kCancelled) {
        restore_cancelled->Inc();
      }
      FinishBlock(r, b.result, Tier::kSsd, std::move(st));
      if (left->fetch_sub(1) == 1) LaneDone();
    };
    r->worker.store(worker);
    Result<SsdGpuWorker::JobId> job = worker->SubmitRead(std::move(req));
    if (job.ok()) {
      r->gpu_job.store(*job);
      return;
    }
    for (RestoreBlock& b : *taken) {
      ssd->catalog().Complete(b.src.lease);
      FinishBlock(r, b.result, Tier::kSsd, job.status());
    }
    LaneDone();
  }

  // ---- helpers -----------------------------------------------------------
  void LaneStarted() { lane_work.fetch_add(1); }
  void LaneDone() {
    if (lane_work.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> l(drain_mu);
      drain_cv.notify_all();
    }
  }

  Result<InstanceGuard> Acquire(SessionId session, InstanceId id) {
    std::shared_ptr<Instance> inst;
    {
      std::lock_guard<std::mutex> l(mu);
      auto it = instances.find(id);
      if (it == instances.end() || it->second->session != session) {
        return Status::NotFound("instance " + std::to_string(id) + " is not registered");
      }
      inst = it->second;
    }
    std::lock_guard<std::mutex> l(inst->mu);
    if (inst->closing) return Status::Cancelled("instance is unregistering");
    ++inst->inflight;
    return InstanceGuard(inst);
  }

  void ReleaseStaging(const DramView& v) {
    staging->ReleaseScratch(v);
    std::lock_guard<std::mutex> l(staging_mu);
    staging_cv.notify_all();
  }

  // Releases a query block's source (pin or lease). REQUIRES: !b.taken.
  void ReleaseSource(QueryBlock& b) {
    if (b.tier == Tier::kDram) dram->Unpin(b.dram.id);
    if (b.tier == Tier::kSsd) ssd->catalog().Cancel(b.lease);
    b.taken = true;
  }

  // REQUIRES: mu held. Releases every untaken block and forgets the query.
  void DropQueryLocked(QueryRec& q) {
    for (QueryBlock& b : q.blocks) {
      if (b.taken) continue;
      budget_used -= b.size;
      ReleaseSource(b);
    }
  }

  void FinishBlock(const std::shared_ptr<RestoreRec>& r, size_t result, Tier tier, Status st) {
    bool last = false;
    {
      std::lock_guard<std::mutex> l(r->mu);
      if (tier == Tier::kSsd && r->ssd_remaining > 0 && --r->ssd_remaining == 0 && r->ssd_cost) {
        r->ssd_cost->Observe(Seconds(config.clock->Now() - r->ssd_start));
      }
      r->results[result].source = tier;
      r->results[result].status = std::move(st);
      (r->results[result].status.ok() ? restore_blocks_ok : restore_blocks_failed)->Inc();
      last = --r->remaining == 0;
    }
    if (!last) return;
    restore_seconds->Observe(Seconds(config.clock->Now() - r->start));
    RestoreResult res;
    {
      std::lock_guard<std::mutex> l(r->mu);
      res.blocks = r->results;
    }
    RestoreDone done = std::move(r->done);
    {
      std::lock_guard<std::mutex> l(mu);
      restores.erase(r->id);
    }
    r->inst.Reset();  // the instance may unregister now
    done(std::move(res));
  }

  // Checks one object (in pinned host memory) against its id and shape, then
  // copies its segments into the instance's page for every slot it holds:
  // memcpy for host pages; for CUDA pages the copies are appended to `ops`.
  // `from_ssd`: the bytes came back from the SSD, so every segment's payload
  // CRC32C is checked before a byte reaches a page (DRAM entries were checked
  // or computed when they entered the pool).
  Status ObjectToPages(Instance& inst, uint32_t group, const uint8_t* object, uint64_t size,
                       const ObjectId& id, uint64_t page, bool from_ssd,
                       std::vector<gpu::CopyOp>* ops) {
    const GroupLayout* g = inst.groups.at(group);
    const GroupShape& shape = *inst.shapes.at(group);
    ORBITKV_ASSIGN_OR_RETURN(ParsedHeader h,
                             ParseObjectHeader({object, std::min(size, shape.header_bytes)}, size));
    ORBITKV_RETURN_IF_ERROR(CheckObjectMatches(h, id, shape.slot_bytes));
    if (from_ssd) ORBITKV_RETURN_IF_ERROR(VerifyObjectPayload(h, {object, size}));
    for (const SlotLayout& s : g->slots) {
      const uint8_t* src = object + h.segments[s.slot_id].offset;
      if (inst.cuda()) {
        ops->push_back(
            {inst.DevicePage(s, page), reinterpret_cast<gpu::DevPtr>(src), s.bytes_per_page});
      } else {
        std::memcpy(inst.regions[s.region]->data() + SlotPageOffset(s, page), src,
                    s.bytes_per_page);
      }
    }
    return Status::OK();
  }

  // An object read from the SSD (pinned staging) into the instance's page.
  Status CopyObjectToPages(Instance& inst, uint32_t group, const uint8_t* object, uint64_t size,
                           const ObjectId& id, uint64_t page) {
    std::vector<gpu::CopyOp> ops;
    ORBITKV_RETURN_IF_ERROR(ObjectToPages(inst, group, object, size, id, page, true, &ops));
    return CopyAndWait(inst, /*to_device=*/true, ops);
  }

  void CopyLane(CopyJob& job) {
    const auto& r = job.restore;
    Instance& inst = *r->inst;
    for (size_t i = 0; i < job.blocks.size(); ++i) {
      RestoreBlock& b = job.blocks[i];
      Status st = job.read_status[i];
      if (st.ok()) {
        st = CopyObjectToPages(inst, r->group, b.scratch.data, b.src.ref.object_size, b.src.id,
                               b.page);
      }
      if (st.ok()) {
        bytes_restore_ssd->Inc(b.src.ref.object_size);
        if (config.admission == AdmissionPolicy::kAll && !dram->Contains(b.src.id)) {
          dram->InsertSealed(b.src.id, {b.scratch.data, b.src.ref.object_size})
              .IgnoreError("promotion to DRAM is best effort");
        }
      }
      if (b.scratch.data) ReleaseStaging(b.scratch);
      if (b.src.lease != 0) ssd->catalog().Complete(b.src.lease);
      FinishBlock(r, b.result, Tier::kSsd, std::move(st));
    }
    LaneDone();
  }

  // Reads the extents of a job into DRAM scratch. Returns a status per block.
  // Staging for a set of objects, all or nothing: a reader never holds part of
  // what it needs while it waits for the rest, so readers cannot deadlock.
  Status AllocateStagingAll(const std::vector<uint64_t>& sizes, std::vector<DramView>* out) {
    uint64_t total = 0;
    for (uint64_t n : sizes) total += AlignUp(n, 4096);
    if (total > staging->stats().capacity) {
      return Status::ResourceExhausted("objects of " + FormatByteSize(total) +
                                       " exceed the SSD read staging of " +
                                       FormatByteSize(staging->stats().capacity));
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::unique_lock<std::mutex> l(staging_mu);
    while (true) {
      out->clear();
      for (uint64_t n : sizes) {
        Result<DramView> v = staging->AllocateScratch(n);
        if (!v.ok()) break;
        out->push_back(*v);
      }
      if (out->size() == sizes.size()) return Status::OK();
      for (const DramView& v : *out) staging->ReleaseScratch(v);
      out->clear();
      if (staging_cv.wait_until(l, deadline) == std::cv_status::timeout) {
        return Status::ResourceExhausted("SSD read staging stayed full for 10 s");
      }
    }
  }

  // Splits objects into runs whose staging fits half the staging area, so one
  // run can be copied out while the next is read.
  std::vector<std::pair<size_t, size_t>> StagingRuns(const std::vector<uint64_t>& sizes) {
    std::vector<std::pair<size_t, size_t>> runs;
    const uint64_t cap = staging->stats().capacity / 2;
    size_t begin = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const uint64_t n = AlignUp(sizes[i], 4096);
      if (i > begin && bytes + n > cap) {
        runs.emplace_back(begin, i);
        begin = i;
        bytes = 0;
      }
      bytes += n;
    }
    if (begin < sizes.size()) runs.emplace_back(begin, sizes.size());
    return runs;
  }

  // Submits the leases of srcs and reads them into staging (scratch[i]).
  // Returns a status per block; a block whose submission or staging failed
  // has its lease released and set to 0.
  std::vector<Status> ReadIntoStaging(IoEngine& io, std::span<QueryBlock*> srcs,
                                      std::span<DramView*> scratch) {
    std::vector<Status> out(srcs.size());
    std::vector<size_t> live;
    std::vector<uint64_t> sizes;
    for (size_t i = 0; i < srcs.size(); ++i) {
      if (!ssd->catalog().Submit(srcs[i]->lease).ok()) {
        out[i] = Status::NotFound("SSD lease expired before the read was submitted");
        srcs[i]->lease = 0;
        continue;
      }
      live.push_back(i);
      sizes.push_back(srcs[i]->ref.length);
    }
    if (live.empty()) return out;
    std::vector<DramView> views;
    if (Status st = AllocateStagingAll(sizes, &views); !st.ok()) {
      for (size_t i : live) {
        ssd->catalog().Complete(srcs[i]->lease);
        srcs[i]->lease = 0;
        out[i] = st;
      }
      return out;
    }
    std::vector<ExtentRead> reads;
    for (size_t k = 0; k < live.size(); ++k) {
      *scratch[live[k]] = views[k];
      reads.push_back({srcs[live[k]]->ref, views[k].data, {}});
    }
    ssd->ReadExtents(io, reads).IgnoreError("statuses are per extent");
    for (size_t k = 0; k < live.size(); ++k) out[live[k]] = reads[k].status;
    return out;
  }

  void ReadLane(size_t worker, ReadJob& job) {
    IoEngine& io = *read_io[worker];
    if (job.restore) {
      std::vector<uint64_t> sizes;
      for (const RestoreBlock& b : job.blocks) sizes.push_back(b.src.ref.length);
      std::vector<std::pair<size_t, size_t>> runs = StagingRuns(sizes);
      for (size_t r = 0; r < runs.size(); ++r) {
        CopyJob copy;
        copy.restore = job.restore;
        std::vector<QueryBlock*> srcs;
        std::vector<DramView*> scratch;
        for (size_t i = runs[r].first; i < runs[r].second; ++i) {
          copy.blocks.push_back(std::move(job.blocks[i]));
        }
        for (RestoreBlock& b : copy.blocks) {
          srcs.push_back(&b.src);
          scratch.push_back(&b.scratch);
        }
        copy.read_status = ReadIntoStaging(io, srcs, scratch);
        if (r > 0) LaneStarted();                          // each CopyJob ends with one LaneDone
        if (!host_restore->TryPush(copy)) CopyLane(copy);  // lane full: copy here
      }
      return;
    }
    // Prepare: warm SSD objects into DRAM.
    std::vector<uint64_t> sizes;
    for (const QueryBlock& b : job.prepare) sizes.push_back(b.ref.length);
    for (auto [begin, end] : StagingRuns(sizes)) {
      std::vector<QueryBlock*> srcs;
      std::vector<DramView> views(end - begin);
      std::vector<DramView*> scratch;
      for (size_t i = begin; i < end; ++i) {
        srcs.push_back(&job.prepare[i]);
        scratch.push_back(&views[i - begin]);
      }
      std::vector<Status> st = ReadIntoStaging(io, srcs, scratch);
      for (size_t k = 0; k < srcs.size(); ++k) {
        QueryBlock& b = *srcs[k];
        if (st[k].ok()) {
          // Only a whole, checked object enters the pool (DRAM restores trust it).
          const std::span<const uint8_t> obj(views[k].data, b.ref.object_size);
          auto h = ParseObjectHeader(obj, b.ref.object_size);
          Status ok = h.ok() ? CheckObjectMatches(*h, b.id, job.prepare_slot_bytes) : h.status();
          if (ok.ok()) ok = VerifyObjectPayload(*h, obj);
          if (!ok.ok()) {
            OKV_LOG_WARN("prepare of {}: {}", b.id.key.ShortHex(), ok.ToString());
          } else if (dram->InsertSealed(b.id, obj).ok()) {
            bytes_prepare->Inc(b.ref.object_size);
          }
        }
        if (views[k].data) ReleaseStaging(views[k]);
        if (b.lease != 0) ssd->catalog().Complete(b.lease);
      }
    }
    LaneDone();
  }

  void WritebackLane(size_t worker, std::vector<ObjectId>& ids) {
    std::vector<DramView> views;
    std::vector<SsdStore::ObjectWrite> writes;
    for (const ObjectId& id : ids) {
      if (std::optional<DramView> v = dram->TakeWriteback(id)) {
        views.push_back(*v);
        writes.push_back({StoreKey(id), v->data, v->size});
      }
    }
    ssd->WriteObjects(*writeback_io[worker], writes);
    for (size_t i = 0; i < views.size(); ++i) {
      if (writes[i].result.ok()) bytes_writeback->Inc(views[i].size);
      dram->FinishWriteback(views[i], writes[i].result.ok());
    }
    {
      std::lock_guard<std::mutex> l(pool_mu);  // pairs with the publisher's wait
    }
    pool_cv.notify_all();  // room may have been freed for waiting publishers
    for (size_t i = 0; i < ids.size(); ++i) LaneDone();
  }

  void ReaperLoop() {
    std::unique_lock<std::mutex> l(reaper_mu);
    while (!stopping) {
      reaper_cv.wait_for(l, std::chrono::milliseconds(50));
      if (stopping) break;
      l.unlock();
      ExpireQueries();
      if (ssd) ssd->catalog().ExpireLeases();
      dram->ExpireAssemblies();
      l.lock();
    }
  }

  void ExpireQueries() {
    const Clock::TimePoint now = config.clock->Now();
    std::lock_guard<std::mutex> l(mu);
    for (auto it = queries.begin(); it != queries.end();) {
      if (it->second.deadline <= now) {
        DropQueryLocked(it->second);
        queries_expired->Inc();
        it = queries.erase(it);
      } else {
        ++it;
      }
    }
  }

  void RegisterMetrics();
};

// ---- construction ----------------------------------------------------------

Result<std::unique_ptr<Manager>> Manager::Create(const ManagerConfig& config) {
  if (config.metrics == nullptr)
    return Status::InvalidArgument("ManagerConfig.metrics is required");
  ORBITKV_RETURN_IF_ERROR(config.options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->metrics = config.metrics;
  const bool ssd_on = !config.options.ssd_cache_path.empty();
  const uint64_t pool = AlignDown(config.options.pool_size, 4096);
  const uint64_t staging =
      ssd_on ? AlignDown(config.read_staging_bytes ? config.read_staging_bytes
                                                   : std::min<uint64_t>(64 << 20, pool / 4),
                         4096)
             : 0;
  if (ssd_on && (staging < (64u << 10) || staging >= pool)) {
    return Status::InvalidArgument("--pool-size " + FormatByteSize(pool) +
                                   " leaves no room for SSD read staging of " +
                                   FormatByteSize(staging));
  }
  DramCacheOptions d;
  d.capacity = pool - staging;
  d.lock_memory = config.lock_memory;
  d.admission = config.admission;
  d.clock = config.clock;
  // With SSD on, a sealed object waits for writeback (never evicted before it).
  d.writeback_on_seal = ssd_on;
  d.on_arena = config.register_host_memory;
  d.on_arena_release = config.unregister_host_memory;
  // Fragments set their slots' payload CRCs; the last one seals the header.
  d.on_seal = [](std::span<uint8_t> object) { SealObjectHeader(object); };
  ORBITKV_ASSIGN_OR_RETURN(impl->dram, DramCache::Create(d));
  if (ssd_on) {
    DramCacheOptions st = d;
    st.capacity = staging;
    st.writeback_on_seal = false;
    ORBITKV_ASSIGN_OR_RETURN(impl->staging, DramCache::Create(st));
  }
  impl->budget = config.query_budget_bytes ? config.query_budget_bytes : d.capacity;

  const ManagerOptions& o = config.options;
  if (!o.ssd_cache_path.empty()) {
    SsdStoreOptions so;
    so.path = o.ssd_cache_path;
    so.capacity = o.ssd_cache_capacity;
    so.shards = o.ssd_shards;
    so.reserve_capacity = false;  // io_uring: logical sizing
    so.fs = config.fs;
    so.clock = config.clock;
    so.metrics = config.metrics;
    ORBITKV_ASSIGN_OR_RETURN(impl->ssd, SsdStore::Open(so));
    // Cache-wide: cuFile for every shard (then reserved up front) or io_uring.
    ORBITKV_ASSIGN_OR_RETURN(impl->backend,
                             SelectSsdBackend(o, config.gpu, config.gpu_unavailable, *impl->ssd));
    impl->cufile_admit = impl->backend.cufile;
    OKV_LOG_INFO("SSD backend: {}", impl->backend.reason);
    const uint32_t workers = o.ssd_io_workers;
    for (uint32_t i = 0; i < workers; ++i) {
      ORBITKV_ASSIGN_OR_RETURN(auto w, CreateUringEngine({o.ssd_queue_depth, config.io_faults}));
      impl->writeback_io.push_back(std::move(w));
      ORBITKV_ASSIGN_OR_RETURN(auto r, CreateUringEngine({o.ssd_queue_depth, config.io_faults}));
      impl->read_io.push_back(std::move(r));
    }
    Impl* p = impl.get();
    // A writeback batch fills the worker's queue depth (several chunks per object).
    impl->writeback = std::make_unique<WorkQueue<ObjectId>>(
        config.writeback_queue, workers,
        [p](size_t w, std::vector<ObjectId>& ids) { p->WritebackLane(w, ids); },
        std::max<size_t>(1, o.ssd_queue_depth / 2));
    impl->reader = std::make_unique<WorkQueue<ReadJob>>(config.read_queue, workers,
                                                        [p](size_t w, std::vector<ReadJob>& jobs) {
                                                          for (ReadJob& j : jobs) p->ReadLane(w, j);
                                                        });
    impl->host_restore = std::make_unique<WorkQueue<CopyJob>>(
        config.read_queue, 1, [p](size_t, std::vector<CopyJob>& jobs) {
          for (CopyJob& j : jobs) p->CopyLane(j);
        });
  }
  impl->RegisterMetrics();
  Impl* p = impl.get();
  impl->reaper = std::thread([p] { p->ReaperLoop(); });
  return std::unique_ptr<Manager>(new Manager(std::move(impl)));
}

Manager::Manager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Manager::~Manager() {
  std::vector<SessionId> sessions;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto& [id, pid] : impl_->sessions) sessions.push_back(id);
  }
  for (SessionId s : sessions) CloseSession(s);
  {
    std::lock_guard<std::mutex> l(impl_->reaper_mu);
    impl_->stopping = true;
  }
  impl_->reaper_cv.notify_all();
  impl_->reaper.join();
  // Readers feed the host-restore lane: close them first.
  if (impl_->reader) impl_->reader->Close();
  if (impl_->host_restore) impl_->host_restore->Close();
  if (impl_->writeback) impl_->writeback->Close();
  impl_->metrics->RemoveCollector(impl_->collector);
}

void Manager::Impl::RegisterMetrics() {
  MetricsRegistry& m = *metrics;
  const char* hits = "Queried blocks found, by tier.";
  hits_dram = m.GetCounter("orbitkv_cache_hits_total", hits, {{"tier", "dram"}});
  hits_ssd = m.GetCounter("orbitkv_cache_hits_total", hits, {{"tier", "ssd"}});
  misses = m.GetCounter("orbitkv_cache_misses_total", "Queried blocks not found (chain ends).");
  const char* bytes = "Object bytes moved, by route.";
  bytes_publish = m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "publish_dram"}});
  bytes_restore_dram = m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "restore_dram"}});
  bytes_restore_ssd = m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "restore_ssd_uring"}});
  bytes_writeback = m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "writeback_ssd"}});
  bytes_prepare = m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "prepare_ssd"}});
  publish_objects = m.GetCounter("orbitkv_publish_objects_total", "Objects sealed in DRAM.");
  publish_skipped = m.GetCounter("orbitkv_publish_skipped_total",
                                 "Published blocks already cached (DRAM or SSD).");
  publish_pool_full = m.GetCounter("orbitkv_publish_dropped_total",
                                   "Published blocks dropped: the DRAM pool had no room.");
  writeback_queue_full = m.GetCounter("orbitkv_writeback_queue_full_total",
                                      "Sealed objects not written to SSD: writeback queue full.");
  read_queue_full = m.GetCounter("orbitkv_read_queue_full_total",
                                 "SSD reads refused: the host-reader queue was full.");
  restore_blocks_ok = m.GetCounter("orbitkv_restore_blocks_total", "Restored blocks by outcome.",
                                   {{"outcome", "ok"}});
  restore_blocks_failed = m.GetCounter("orbitkv_restore_blocks_total",
                                       "Restored blocks by outcome.", {{"outcome", "error"}});
  restore_cancelled = m.GetCounter("orbitkv_restore_cancelled_blocks_total",
                                   "Blocks released by cancellation before submission.");
  queries_expired = m.GetCounter("orbitkv_queries_expired_total", "Queries whose TTL passed.");
  publish_seconds = m.GetHistogram("orbitkv_publish_seconds", "Latency of one Publish call.");
  restore_seconds =
      m.GetHistogram("orbitkv_restore_seconds", "Latency of one restore, start to last block.");
  query_seconds = m.GetHistogram("orbitkv_query_seconds", "Latency of one Query call.");
  // The GPU storage tier's series exist from the start (zero while idle):
  // per device where there are CUDA devices, else one unlabelled series each.
  gpu_write_fallbacks = m.GetCounter(
      "orbitkv_ssd_gpu_write_fallbacks_total",
      "GPU write jobs sent through D2H publication and io_uring: eight were already admitted.");
  backend_fallbacks =
      m.GetCounter("orbitkv_ssd_backend_fallbacks_total",
                   "Transitions from automatic cuFile admission to io_uring (until restart).");
  bytes_restore_cufile =
      m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "restore_ssd_cufile"}});
  bytes_writeback_cufile =
      m.GetCounter("orbitkv_bytes_total", bytes, {{"route", "writeback_ssd_cufile"}});
  if (config.gpu && config.gpu->device_count() > 0) {
    for (int d = 0; d < config.gpu->device_count(); ++d) DeviceMetrics(d);
  } else {
    for (const char* c :
         {"orbitkv_ssd_cufile_read_bytes_total", "orbitkv_ssd_cufile_write_bytes_total",
          "orbitkv_ssd_cufile_read_failures_total", "orbitkv_ssd_cufile_write_failures_total"}) {
      m.GetCounter(c, "GPU storage tier (see the spec's Metrics section); no CUDA device.");
    }
    m.GetGauge("orbitkv_ssd_cufile_inflight_batches",
               "cuFile slots occupied through I/O and scatter.");
    m.GetGauge("orbitkv_ssd_gpu_staging_bytes", "Allocated registered GPU staging memory.");
    m.GetHistogram("orbitkv_ssd_cufile_read_seconds",
                   "cuFile read submission-to-completion latency.");
    m.GetHistogram("orbitkv_ssd_cufile_write_seconds",
                   "cuFile write submission-to-completion latency.");
  }
  if (const char* c = std::getenv("ORBITKV_COST_OBSERVATIONS"); c && std::string(c) == "1") {
    const char* help =
        "Opt-in cost observations: SSD restore enqueue to terminal (GPU completion), per route.";
    cost_uring = m.GetHistogram("orbitkv_cost_seconds", help, LatencyBuckets(),
                                {{"path", "ssd_uring_restore"}});
    cost_cufile = m.GetHistogram("orbitkv_cost_seconds", help, LatencyBuckets(),
                                 {{"path", "ssd_cufile_restore"}});
  }
  if (!ssd) {
    // Keep the SSD series on /metrics even with SSD caching off.
    m.GetGauge("orbitkv_ssd_read_pinned_bytes", "SSD bytes held by restore leases.");
    m.GetCounter("orbitkv_ssd_pinned_write_skips_total",
                 "Reservations rejected to protect reads or in-flight writes.");
  }
  collector = m.AddCollector([this](MetricWriter& w) {
    DramStats s = dram->stats();
    auto g = [&](std::string_view name, std::string_view help, double v) {
      w.Family(name, help, "gauge");
      w.Sample(name, {}, v);
    };
    auto c = [&](std::string_view name, std::string_view help, double v) {
      w.Family(name, help, "counter");
      w.Sample(name, {}, v);
    };
    g("orbitkv_pool_capacity_bytes", "DRAM pool size (--pool-size).", double(s.capacity));
    g("orbitkv_pool_used_bytes", "DRAM pool bytes allocated (objects, assemblies, scratch).",
      double(s.used_bytes));
    g("orbitkv_pool_objects", "Sealed objects in DRAM.", double(s.sealed_entries));
    g("orbitkv_pool_assembling_objects", "Objects being assembled from fragments.",
      double(s.assembling_entries));
    g("orbitkv_pool_pinned_bytes", "DRAM bytes pinned by queries, restores and writeback.",
      double(s.pinned_bytes));
    g("orbitkv_pool_writeback_pending", "Sealed objects waiting for SSD writeback.",
      double(s.writeback_pending));
    c("orbitkv_pool_evictions_total", "DRAM objects evicted (LRU).", double(s.evictions));
    c("orbitkv_pool_evicted_bytes_total", "DRAM bytes evicted.", double(s.evicted_bytes));
    c("orbitkv_pool_admission_rejects_total", "Objects not kept in DRAM by the reuse policy.",
      double(s.admission_rejects));
    if (staging) {
      DramStats st = staging->stats();
      g("orbitkv_ssd_read_staging_capacity_bytes", "Pinned DRAM staging for SSD reads.",
        double(st.capacity));
      g("orbitkv_ssd_read_staging_used_bytes", "SSD read staging in use.",
        double(st.scratch_bytes));
    }
    std::lock_guard<std::mutex> l(mu);
    g("orbitkv_sessions", "Connected sessions.", double(sessions.size()));
    g("orbitkv_instances", "Registered instances.", double(instances.size()));
    g("orbitkv_queries_active", "Queries holding sources.", double(queries.size()));
    g("orbitkv_query_budget_used_bytes", "Logical bytes charged by live queries.",
      double(budget_used));
    g("orbitkv_restores_inflight", "Restores not yet complete.", double(restores.size()));
  });
}

// ---- sessions and instances ------------------------------------------------

SessionId Manager::OpenSession(int peer_pid) {
  SessionId id = impl_->next_id.fetch_add(1);
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->sessions[id] = peer_pid;
  return id;
}

void Manager::CloseSession(SessionId session) {
  std::vector<InstanceId> ids;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    if (!impl_->sessions.count(session)) return;
    for (auto& [id, inst] : impl_->instances) {
      if (inst->session == session) ids.push_back(id);
    }
  }
  // Cancel what has not started, then unregister (waits for the rest).
  std::vector<RestoreId> restores;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto& [id, weak] : impl_->restores) {
      if (auto r = weak.lock(); r && r->session == session) restores.push_back(id);
    }
  }
  for (RestoreId r : restores) CancelRestore(session, r).status().IgnoreError("session closing");
  for (InstanceId id : ids) UnregisterInstance(session, id).IgnoreError("session closing");
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto it = impl_->queries.begin(); it != impl_->queries.end();) {
      if (it->second.session == session) {
        impl_->DropQueryLocked(it->second);
        it = impl_->queries.erase(it);
      } else {
        ++it;
      }
    }
    impl_->sessions.erase(session);
  }
  if (impl_->ssd) impl_->ssd->catalog().ReleaseSession(session);
}

Result<InstanceId> Manager::RegisterInstance(SessionId session, const RegisterRequest& req,
                                             std::vector<int> region_fds) {
  auto close_fds = [&] {
    for (int fd : region_fds) {
      if (fd >= 0) ::close(fd);
    }
    region_fds.clear();
  };
  if (req.ns.empty() || req.ns.size() > 4096) {
    close_fds();
    return Status::InvalidArgument("namespace must be 1..4096 bytes");
  }
  Result<DeviceSpec> device = ParseDevice(req.device);
  if (!device.ok()) {
    close_fds();
    return device.status();
  }
  const bool host = !device->cuda;
  if (!host) {
    if (impl_->config.gpu == nullptr) {
      close_fds();
      return Status::Unavailable("device '" + req.device + "': this Manager has no CUDA devices (" +
                                 impl_->config.gpu_unavailable + ")");
    }
    if (!region_fds.empty()) {
      close_fds();
      return Status::InvalidArgument("device '" + req.device +
                                     "': CUDA regions are passed as IPC handles, not memfds");
    }
  }
  if (Status st = ValidateLayout(req.layout); !st.ok()) {
    close_fds();
    return st;
  }
  const size_t regions = req.layout.region_bytes.size();
  if (host && (region_fds.size() != regions || !req.ipc_handles.empty())) {
    close_fds();
    return Status::InvalidArgument("layout declares " + std::to_string(regions) + " regions, got " +
                                   std::to_string(region_fds.size()) + " fds" +
                                   (req.ipc_handles.empty() ? "" : " and IPC handles"));
  }
  if (!host && req.ipc_handles.size() != regions) {
    return Status::InvalidArgument("layout declares " + std::to_string(regions) + " regions, got " +
                                   std::to_string(req.ipc_handles.size()) + " CUDA IPC handles");
  }
  auto inst = std::make_shared<Instance>();
  inst->session = session;
  inst->rank = req.rank;
  inst->ns_name = req.ns;
  inst->layout = req.layout;
  if (!host) {
    // Map every region and check it covers the layout before any I/O can
    // target it; a failure releases what was mapped (~Instance).
    ORBITKV_ASSIGN_OR_RETURN(inst->device,
                             impl_->config.gpu->device(static_cast<int>(device->ordinal)));
    for (size_t i = 0; i < regions; ++i) {
      Result<gpu::IpcMapping> m = inst->device->OpenIpc(req.ipc_handles[i]);
      if (!m.ok()) return m.status().WithContext("region " + std::to_string(i) + " IPC handle");
      inst->mappings.push_back(*m);
      if (m->bytes < req.layout.region_bytes[i]) {
        return Status::InvalidArgument("region " + std::to_string(i) + ": the CUDA allocation is " +
                                       std::to_string(m->bytes) + " bytes, the layout needs " +
                                       std::to_string(req.layout.region_bytes[i]));
      }
    }
    ORBITKV_ASSIGN_OR_RETURN(inst->h2d, inst->device->CreateStream());
    ORBITKV_ASSIGN_OR_RETURN(inst->d2h, inst->device->CreateStream());
  }
  for (size_t i = 0; i < region_fds.size(); ++i) {
    Result<std::unique_ptr<HostRegion>> r =
        HostRegion::Map(region_fds[i], req.layout.region_bytes[i]);
    region_fds[i] = -1;  // Map owns it now
    if (!r.ok()) {
      close_fds();
      return r.status().WithContext("region " + std::to_string(i));
    }
    inst->regions.push_back(std::move(r).value());
  }
  std::lock_guard<std::mutex> l(impl_->mu);
  if (!impl_->sessions.count(session)) return Status::NotFound("unknown session");
  auto [ns_it, fresh] = impl_->ns_ids.emplace(req.ns, impl_->next_id.load());
  if (fresh) impl_->next_id.fetch_add(1);
  inst->ns = ns_it->second;
  // Every instance of a namespace must agree on each group's shape.
  std::vector<std::pair<uint32_t, std::shared_ptr<const GroupShape>>> new_shapes;
  for (const GroupLayout& g : inst->layout.groups) {
    auto key = std::make_pair(inst->ns, g.group_id);
    auto it = impl_->shapes.find(key);
    if (it != impl_->shapes.end()) {
      if (it->second->slot_bytes != g.slot_bytes) {
        return Status::InvalidArgument("group " + std::to_string(g.group_id) +
                                       ": slot sizes differ from another instance of namespace '" +
                                       req.ns + "'");
      }
      inst->shapes[g.group_id] = it->second;
    } else {
      auto shape = std::make_shared<GroupShape>();
      shape->slot_bytes = g.slot_bytes;
      shape->segments = SegmentLayout(g.slot_bytes);
      shape->header_bytes = ObjectHeaderSize(g.num_slots);
      shape->object_size = ObjectSize(g.slot_bytes);
      inst->shapes[g.group_id] = shape;
      new_shapes.emplace_back(g.group_id, shape);
    }
    inst->groups[g.group_id] = &g;
  }
  for (auto& [gid, shape] : new_shapes) impl_->shapes[{inst->ns, gid}] = shape;
  inst->id = impl_->next_id.fetch_add(1);
  impl_->instances[inst->id] = inst;
  OKV_LOG_INFO("registered instance {} (namespace '{}', rank {}, {}, {} pages, {} groups)",
               inst->id, req.ns, req.rank, req.device, req.layout.num_pages,
               req.layout.groups.size());
  return inst->id;
}

Status Manager::UnregisterInstance(SessionId session, InstanceId id) {
  std::shared_ptr<Instance> inst;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    auto it = impl_->instances.find(id);
    if (it == impl_->instances.end() || it->second->session != session) {
      return Status::NotFound("instance " + std::to_string(id) + " is not registered");
    }
    inst = it->second;
  }
  {
    std::unique_lock<std::mutex> l(inst->mu);
    inst->closing = true;
    inst->cv.wait(l, [&] { return inst->inflight == 0; });
  }
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto it = impl_->queries.begin(); it != impl_->queries.end();) {
      if (it->second.instance == id) {
        impl_->DropQueryLocked(it->second);
        it = impl_->queries.erase(it);
      } else {
        ++it;
      }
    }
    impl_->instances.erase(id);
  }
  // Every operation of the instance has finished: drain and release its
  // cuFile worker and streams, then its mappings (host mappings go with the
  // last reference).
  inst->ReleaseDevice();
  OKV_LOG_INFO("unregistered instance {}", id);
  return Status::OK();
}

// ---- publish -----------------------------------------------------------------

Result<PublishResult> Manager::Publish(SessionId session, const PublishRequest& req) {
  const Clock::TimePoint start = impl_->config.clock->Now();
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, impl_->Acquire(session, req.instance));
  auto git = inst->groups.find(req.group_id);
  if (git == inst->groups.end()) {
    return Status::InvalidArgument("group " + std::to_string(req.group_id) +
                                   " is not in this instance's layout");
  }
  const GroupLayout& g = *git->second;
  const GroupShape& shape = *inst->shapes.at(req.group_id);
  if (req.keys.size() != req.pages.size()) {
    return Status::InvalidArgument("publish: " + std::to_string(req.keys.size()) + " keys but " +
                                   std::to_string(req.pages.size()) + " pages");
  }
  for (uint64_t p : req.pages) {
    if (p >= inst->layout.num_pages) {
      return Status::InvalidArgument("publish: page " + std::to_string(p) + " out of range (" +
                                     std::to_string(inst->layout.num_pages) + " pages)");
    }
  }
  // The slots written by this call.
  std::vector<const SlotLayout*> slots;
  if (req.slot_ids.empty()) {
    for (const SlotLayout& s : g.slots) slots.push_back(&s);
  } else {
    for (uint32_t id : req.slot_ids) {
      auto it = std::find_if(g.slots.begin(), g.slots.end(),
                             [&](const SlotLayout& s) { return s.slot_id == id; });
      if (it == g.slots.end()) {
        return Status::InvalidArgument("publish: slot " + std::to_string(id) +
                                       " is not held by this instance");
      }
      if (std::count(req.slot_ids.begin(), req.slot_ids.end(), id) > 1) {
        return Status::InvalidArgument("publish: slot " + std::to_string(id) + " given twice");
      }
      slots.push_back(&*it);
    }
  }
  std::vector<uint32_t> parts;
  for (const SlotLayout* s : slots) parts.push_back(s->slot_id);
  std::vector<uint8_t> header(shape.header_bytes);
  // Complete groups of CUDA instances go to SSD straight from their pages
  // through cuFile; the DRAM copy (if the pool takes it) is for hot reuse.
  // Admission is asked per group: an auto fallback part way through sends
  // the rest of the call to D2H + io_uring.
  const bool complete = impl_->ssd && slots.size() == g.num_slots;
  auto direct = [&] { return complete && impl_->UseCufileWrite(*inst); };
  auto dw = std::make_shared<DirectWrites>();

  PublishResult out;
  // The first error ends the call; what it started still finishes below.
  Status failed;
  for (size_t i = 0; i < req.keys.size(); ++i) {
    ObjectId id{inst->ns, req.group_id, ToKey(req.keys[i])};
    if (impl_->dram->Contains(id) ||
        (impl_->ssd && impl_->ssd->catalog().Lookup(StoreKey(id)).has_value())) {
      ++out.skipped;
      impl_->publish_skipped->Inc();
      continue;
    }
    WriteObjectHeader(id, shape.slot_bytes, /*codec=*/0, {}, header);  // CRCs at seal
    Result<DramView> v = impl_->dram->BeginAssembly(id, shape.object_size, g.num_slots, header);
    if (!v.ok() && v.status().code() == StatusCode::kResourceExhausted && impl_->ssd) {
      // The pool is full of objects waiting for SSD writeback: wait for it
      // (bounded) instead of dropping the block.
      const auto deadline = std::chrono::steady_clock::now() + impl_->config.publish_wait;
      std::unique_lock<std::mutex> l(impl_->pool_mu);
      while (!v.ok() && v.status().code() == StatusCode::kResourceExhausted &&
             impl_->dram->stats().writeback_pending > 0) {
        if (impl_->pool_cv.wait_until(l, deadline) == std::cv_status::timeout) break;
        v = impl_->dram->BeginAssembly(id, shape.object_size, g.num_slots, header);
      }
    }
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kAlreadyExists) {
        ++out.skipped;
        impl_->publish_skipped->Inc();
      } else if (!direct() ||
                 !impl_->SubmitDirectWrite(*inst, g, shape, id, req.pages[i], nullptr, dw)) {
        ++out.dropped;
        impl_->publish_pool_full->Inc();
      }  // else no room in DRAM: straight to SSD, counted when its write finished
      continue;
    }
    uint64_t copied = 0;
    std::vector<gpu::CopyOp> ops;  // CUDA pages: D2H on the instance's stream
    for (const SlotLayout* s : slots) {
      const SegmentPos& seg = shape.segments[s->slot_id];
      if (inst->cuda()) {
        ops.push_back({reinterpret_cast<gpu::DevPtr>(v->data + seg.offset),
                       inst->DevicePage(*s, req.pages[i]), s->bytes_per_page});
      } else {
        const uint8_t* src = inst->regions[s->region]->data() + SlotPageOffset(*s, req.pages[i]);
        std::memcpy(v->data + seg.offset, src, s->bytes_per_page);
      }
      const uint64_t padded = AlignUp(s->bytes_per_page, 512);
      std::memset(v->data + seg.offset + s->bytes_per_page, 0, padded - s->bytes_per_page);
      copied += s->bytes_per_page;
    }
    if (Status st = impl_->CopyAndWait(*inst, /*to_device=*/false, ops); !st.ok()) {
      impl_->dram->AbortAssembly(*v);
      failed = st;
      break;
    }
    // This call's slots' payload CRCs, from the pool copy (what SSD gets).
    for (const SlotLayout* s : slots) {
      const SegmentPos& seg = shape.segments[s->slot_id];
      SetSegmentCrc({v->data, shape.header_bytes}, s->slot_id,
                    Crc32c({v->data + seg.offset, seg.size}));
    }
    impl_->bytes_publish->Inc(copied);
    const bool ssd_on = impl_->ssd != nullptr;
    const uint8_t* dram_header = v->data;  // stays: a sealed entry waits for its writeback
    Result<bool> sealed = impl_->dram->CompleteParts(*v, parts);
    if (!sealed.ok()) {
      failed = sealed.status();
      break;
    }
    ++out.stored;
    if (!*sealed) continue;
    ++out.sealed;
    impl_->publish_objects->Inc();
    if (direct() && impl_->SubmitDirectWrite(*inst, g, shape, id, req.pages[i], dram_header, dw)) {
      continue;
    }
    if (ssd_on) impl_->QueueWriteback(id);
  }
  // On every return: the pages stay the engine's only after this call's SSD
  // writes finished (the GPU gathers from them), and each write's DRAM entry
  // leaves writeback-pending.
  {
    std::unique_lock<std::mutex> l(dw->mu);
    dw->cv.wait(l, [&] { return dw->outstanding == 0; });
  }
  for (DirectWrites::Done& d : dw->done) {
    if (d.scratch.data) impl_->ReleaseStaging(d.scratch);
    if (d.status.ok()) {
      impl_->bytes_writeback_cufile->Inc(shape.object_size);
      if (auto w = impl_->dram->TakeWriteback(d.id)) impl_->dram->FinishWriteback(*w, true);
      if (!d.dram_copy) {
        ++out.stored;  // SSD only: stored once its write finished
        ++out.sealed;
      }
    } else if (d.dram_copy) {
      impl_->QueueWriteback(d.id);  // the DRAM copy can still reach SSD through io_uring
    } else {
      ++out.dropped;  // no DRAM copy and the SSD write failed: the block is gone
      impl_->publish_pool_full->Inc();
    }
  }
  if (!failed.ok()) return failed;
  impl_->publish_seconds->Observe(Seconds(impl_->config.clock->Now() - start));
  return out;
}

// ---- query -------------------------------------------------------------------

Result<QueryResult> Manager::Query(SessionId session, const QueryRequest& req) {
  const Clock::TimePoint start = impl_->config.clock->Now();
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, impl_->Acquire(session, req.instance));
  if (!inst->groups.count(req.group_id)) {
    return Status::InvalidArgument("group " + std::to_string(req.group_id) +
                                   " is not in this instance's layout");
  }
  if (req.ttl_ms == 0 || req.ttl_ms > 600000) {
    return Status::InvalidArgument("query ttl_ms must be in (0, 600000]");
  }
  const Clock::TimePoint deadline = start + std::chrono::milliseconds(req.ttl_ms);
  QueryRec q;
  q.session = session;
  q.instance = req.instance;
  q.group = req.group_id;
  q.deadline = deadline;
  uint64_t charged = 0;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (const BlockKey& k : req.keys) {
      QueryBlock b;
      b.id = ObjectId{inst->ns, req.group_id, ToKey(k)};
      if (std::optional<DramView> v = impl_->dram->Pin(b.id)) {
        b.tier = Tier::kDram;
        b.dram = *v;
        b.size = v->size;
      } else if (impl_->ssd) {
        std::optional<ExtentRef> ref = impl_->ssd->catalog().Lookup(StoreKey(b.id));
        if (!ref) break;
        LeaseSpec spec{session, 1, deadline};
        Result<LeaseId> lease = impl_->ssd->catalog().AcquireLease({&*ref, 1}, spec);
        if (!lease.ok()) break;
        b.tier = Tier::kSsd;
        b.ref = *ref;
        b.lease = *lease;
        b.size = ref->object_size;
      } else {
        break;
      }
      if (impl_->budget_used + b.size > impl_->budget) {
        impl_->ReleaseSource(b);  // over the query budget: the prefix ends here
        break;
      }
      impl_->budget_used += b.size;
      charged += b.size;
      q.blocks.push_back(b);
    }
    QueryResult res;
    res.prefix = static_cast<uint32_t>(q.blocks.size());
    res.logical_bytes = charged;
    for (const QueryBlock& b : q.blocks) {
      res.sources.push_back(b.tier);
      (b.tier == Tier::kDram ? impl_->hits_dram : impl_->hits_ssd)->Inc();
    }
    impl_->misses->Inc(req.keys.size() - q.blocks.size());
    if (!q.blocks.empty()) {
      q.id = impl_->next_id.fetch_add(1);
      res.query = q.id;
      impl_->queries.emplace(q.id, std::move(q));
    }
    impl_->query_seconds->Observe(Seconds(impl_->config.clock->Now() - start));
    return res;
  }
}

Status Manager::ReleaseQuery(SessionId session, QueryId query) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->queries.find(query);
  if (it == impl_->queries.end() || it->second.session != session) {
    return Status::NotFound("query " + std::to_string(query) + " is not live");
  }
  impl_->DropQueryLocked(it->second);
  impl_->queries.erase(it);
  return Status::OK();
}

// ---- restore -----------------------------------------------------------------

Result<RestoreId> Manager::StartRestore(SessionId session, const RestoreRequest& req,
                                        RestoreDone done) {
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, impl_->Acquire(session, req.instance));
  if (req.blocks.size() != req.pages.size()) {
    return Status::InvalidArgument("restore: " + std::to_string(req.blocks.size()) +
                                   " blocks but " + std::to_string(req.pages.size()) + " pages");
  }
  if (req.blocks.empty()) return Status::InvalidArgument("restore: no blocks");
  for (uint64_t p : req.pages) {
    if (p >= inst->layout.num_pages) {
      return Status::InvalidArgument("restore: page " + std::to_string(p) + " out of range (" +
                                     std::to_string(inst->layout.num_pages) + " pages)");
    }
  }
  auto r = std::make_shared<RestoreRec>();
  r->session = session;
  r->done = std::move(done);
  r->start = impl_->config.clock->Now();
  std::vector<RestoreBlock> dram_blocks, ssd_blocks;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    auto it = impl_->queries.find(req.query);
    if (it == impl_->queries.end() || it->second.session != session ||
        it->second.instance != req.instance) {
      return Status::NotFound("query " + std::to_string(req.query) +
                              " is not live for this instance (expired or released)");
    }
    QueryRec& q = it->second;
    for (uint32_t b : req.blocks) {
      if (b >= q.blocks.size()) {
        return Status::InvalidArgument("restore: block " + std::to_string(b) +
                                       " is beyond the query's prefix of " +
                                       std::to_string(q.blocks.size()));
      }
      if (q.blocks[b].taken) {
        return Status::InvalidArgument("restore: block " + std::to_string(b) +
                                       " was already restored or released");
      }
      if (std::count(req.blocks.begin(), req.blocks.end(), b) > 1) {
        return Status::InvalidArgument("restore: block " + std::to_string(b) + " given twice");
      }
    }
    // Validated: take the blocks out of the query.
    r->id = impl_->next_id.fetch_add(1);
    r->group = q.group;
    r->results.resize(req.blocks.size());
    r->remaining = req.blocks.size();
    for (size_t i = 0; i < req.blocks.size(); ++i) {
      QueryBlock& src = q.blocks[req.blocks[i]];
      r->results[i].block = req.blocks[i];
      RestoreBlock rb;
      rb.result = i;
      rb.src = src;
      rb.page = req.pages[i];
      src.taken = true;
      impl_->budget_used -= src.size;
      if (src.tier == Tier::kSsd) {
        // The restore owns the lease now: it lives until the read, not the TTL.
        impl_->ssd->catalog().KeepUntilDone(src.lease).IgnoreError(
            "an expired lease fails its block at submission");
      }
      (src.tier == Tier::kDram ? dram_blocks : ssd_blocks).push_back(rb);
    }
    if (std::all_of(q.blocks.begin(), q.blocks.end(), [](auto& b) { return b.taken; })) {
      impl_->queries.erase(it);
    }
    impl_->restores[r->id] = r;
  }
  // The restore holds the instance until its last block; this call holds it
  // too, so nothing below races with a lane finishing the restore.
  r->inst = inst.Share();
  r->instance = req.instance;
  const RestoreId id = r->id;
  bool host_route = !ssd_blocks.empty();
  if (!ssd_blocks.empty()) {
    const bool cufile = impl_->UseCufileRead(*inst);
    {
      std::lock_guard<std::mutex> l(r->mu);
      r->ssd_remaining = ssd_blocks.size();
      r->ssd_start = impl_->config.clock->Now();
      r->ssd_cost = cufile ? impl_->cost_cufile : impl_->cost_uring;
    }
    if (cufile) {
      Result<SsdGpuWorker*> worker = impl_->Worker(*inst);
      const ManagerOptions& o = impl_->config.options;
      if (worker.ok()) {
        impl_->StartCufileRead(r, *inst, *worker, std::move(ssd_blocks));
        host_route = false;
      } else if (o.ssd_read_path == SsdReadPath::kCufile || o.ssd_backend == SsdBackend::kCufile) {
        for (RestoreBlock& b : ssd_blocks) {  // an explicit route is never switched
          impl_->ssd->catalog().Cancel(b.src.lease);
          impl_->FinishBlock(r, b.result, Tier::kSsd, worker.status());
        }
        host_route = false;
      } else {
        std::lock_guard<std::mutex> l(r->mu);
        r->ssd_cost = impl_->cost_uring;  // auto fell back: io_uring serves it
      }
    }
  }
  if (host_route) {
    ReadJob job;
    job.restore = r;
    job.blocks = std::move(ssd_blocks);
    impl_->LaneStarted();
    if (!impl_->reader->TryPush(job)) {
      impl_->LaneDone();
      impl_->read_queue_full->Inc();
      for (RestoreBlock& b : job.blocks) {
        impl_->ssd->catalog().Cancel(b.src.lease);
        impl_->FinishBlock(r, b.result, Tier::kSsd,
                           Status::ResourceExhausted("SSD read queue is full"));
      }
    }
  }
  // DRAM blocks copy here, on the caller's thread, from the entries the query
  // pinned: memcpy into host pages, or one H2D job (one event) for CUDA pages.
  std::vector<gpu::CopyOp> ops;
  std::vector<Status> st(dram_blocks.size());
  for (size_t i = 0; i < dram_blocks.size(); ++i) {
    const RestoreBlock& b = dram_blocks[i];
    st[i] = impl_->ObjectToPages(*inst, r->group, b.src.dram.data, b.src.dram.size, b.src.id,
                                 b.page, /*from_ssd=*/false, &ops);
  }
  const Status copied = impl_->CopyAndWait(*inst, /*to_device=*/true, ops);
  for (size_t i = 0; i < dram_blocks.size(); ++i) {
    const RestoreBlock& b = dram_blocks[i];
    if (st[i].ok()) st[i] = copied;
    if (st[i].ok()) impl_->bytes_restore_dram->Inc(b.src.dram.size);
    impl_->dram->Unpin(b.src.dram.id);
    impl_->FinishBlock(r, b.result, Tier::kDram, std::move(st[i]));
  }
  return id;
}

Result<RestoreResult> Manager::Restore(SessionId session, const RestoreRequest& req) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Result<RestoreResult>> out;
  Result<RestoreId> id = StartRestore(session, req, [&](Result<RestoreResult> r) {
    std::lock_guard<std::mutex> l(m);
    out.emplace(std::move(r));
    cv.notify_all();
  });
  if (!id.ok()) return id.status();
  std::unique_lock<std::mutex> l(m);
  cv.wait(l, [&] { return out.has_value(); });
  return std::move(*out);
}

Result<uint32_t> Manager::CancelRestore(SessionId session, RestoreId id) {
  std::shared_ptr<RestoreRec> r;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    auto it = impl_->restores.find(id);
    if (it == impl_->restores.end()) return Status::NotFound("restore is not in flight");
    r = it->second.lock();
    if (!r || r->session != session) return Status::NotFound("restore is not in flight");
  }
  if (!impl_->reader) return 0u;
  uint32_t gpu_released = 0;
  if (SsdGpuWorker* w = r->worker.load(); w && r->gpu_job.load() != 0) {
    // Holding the instance keeps its worker alive; an instance that is
    // unregistering cancels everything unsubmitted itself.
    if (Result<InstanceGuard> g = impl_->Acquire(session, r->instance); g.ok()) {
      gpu_released = w->CancelRead(r->gpu_job.load());
    }
  }
  std::vector<ReadJob> jobs =
      impl_->reader->RemoveIf([&](const ReadJob& j) { return j.restore == r; });
  uint32_t released = 0;
  for (ReadJob& j : jobs) {
    for (RestoreBlock& b : j.blocks) {
      ++released;
      impl_->ssd->catalog().Cancel(b.src.lease);
      impl_->restore_cancelled->Inc();
      impl_->FinishBlock(r, b.result, Tier::kSsd, Status::Cancelled("restore cancelled"));
    }
    impl_->LaneDone();
  }
  return released + gpu_released;
}

// ---- prepare -----------------------------------------------------------------

Result<uint32_t> Manager::Prepare(SessionId session, const PrepareRequest& req) {
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, impl_->Acquire(session, req.instance));
  if (!inst->groups.count(req.group_id)) {
    return Status::InvalidArgument("group " + std::to_string(req.group_id) +
                                   " is not in this instance's layout");
  }
  if (!impl_->ssd) return 0u;
  ReadJob job;
  job.prepare_slot_bytes = inst->shapes.at(req.group_id)->slot_bytes;
  const Clock::TimePoint deadline = impl_->config.clock->Now() + std::chrono::seconds(30);
  for (const BlockKey& k : req.keys) {
    QueryBlock b;
    b.id = ObjectId{inst->ns, req.group_id, ToKey(k)};
    if (impl_->dram->Contains(b.id)) continue;
    std::optional<ExtentRef> ref = impl_->ssd->catalog().Lookup(StoreKey(b.id));
    if (!ref) continue;
    Result<LeaseId> lease = impl_->ssd->catalog().AcquireLease({&*ref, 1}, {session, 1, deadline});
    if (!lease.ok()) continue;
    b.tier = Tier::kSsd;
    b.ref = *ref;
    b.lease = *lease;
    b.size = ref->object_size;
    job.prepare.push_back(b);
  }
  const uint32_t n = static_cast<uint32_t>(job.prepare.size());
  if (n == 0) return 0u;
  impl_->LaneStarted();
  if (!impl_->reader->TryPush(job)) {
    for (QueryBlock& b : job.prepare) impl_->ssd->catalog().Cancel(b.lease);
    impl_->read_queue_full->Inc();
    impl_->LaneDone();
    return 0u;
  }
  return n;
}

void Manager::Drain() {
  std::unique_lock<std::mutex> l(impl_->drain_mu);
  impl_->drain_cv.wait(l, [&] { return impl_->lane_work.load() == 0; });
}

std::string Manager::ssd_backend() const { return impl_->backend.reason; }

Manager::Gauges Manager::gauges() const {
  Gauges g;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    g.sessions = impl_->sessions.size();
    g.instances = impl_->instances.size();
    g.queries = impl_->queries.size();
    g.restores_inflight = impl_->restores.size();
    g.query_budget_used = impl_->budget_used;
  }
  g.dram = impl_->dram->stats();
  if (impl_->ssd) {
    CatalogStats s = impl_->ssd->catalog().stats();
    g.ssd_leases = s.active_leases;
    g.ssd_pinned_bytes = s.pinned_bytes;
    g.ssd_reservations = s.writing_extents;
  }
  g.cufile_selected = impl_->backend.cufile;
  g.cufile_admitting = impl_->cufile_admit.load();
  std::vector<std::shared_ptr<Instance>> insts;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    for (auto& [id, inst] : impl_->instances) insts.push_back(inst);
  }
  for (auto& inst : insts) {
    std::lock_guard<std::mutex> l(inst->worker_mu);
    g.gpu_ipc_mappings += inst->mappings.size();
    if (!inst->worker) continue;
    GpuWorkerStats ws = inst->worker->stats();
    ++g.gpu_workers;
    g.gpu_write_jobs += ws.write_jobs;
    g.gpu_inflight_batches += ws.inflight_batches;
  }
  return g;
}

}  // namespace orbitkv
