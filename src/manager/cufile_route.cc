#include "manager/cufile_route.h"

#include <cstring>

#include "manager/gpu_encode_lane.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/object_format.h"

namespace orbitkv {

// ---- CufileSeries -------------------------------------------------------------

CufileSeries::CufileSeries(MetricsRegistry* metrics, gpu::Platform* gpu) : metrics_(metrics) {
  if (gpu && gpu->device_count() > 0) {
    for (int d = 0; d < gpu->device_count(); ++d) Device(d);
    return;
  }
  MetricsRegistry& m = *metrics_;
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
  MutexLock l(mu_);
  Make(-1, {});  // the GPU encode series, unlabelled
}

Counter* CufileSeries::EncodeFallback(int ordinal, std::string_view reason) {
  Labels l;
  if (ordinal >= 0) l.push_back({"device", "cuda:" + std::to_string(ordinal)});
  l.push_back({"reason", std::string(reason)});
  return metrics_->GetCounter("orbitkv_ssd_gpu_encode_fallbacks_total",
                              "Encoded groups the GPU encode path did not take (or gave back), "
                              "written back through io_uring with CPU encoding instead.",
                              l);
}

GpuWorkerMetrics CufileSeries::Device(int ordinal) {
  MutexLock l(mu_);
  auto it = devices_.find(ordinal);
  if (it != devices_.end()) return it->second;
  const Labels dev{{"device", "cuda:" + std::to_string(ordinal)}};
  GpuWorkerMetrics g = Make(ordinal, dev);
  devices_[ordinal] = g;
  return g;
}

GpuWorkerMetrics CufileSeries::Make(int ordinal, const Labels& dev) {
  MetricsRegistry& m = *metrics_;
  GpuWorkerMetrics g;
  g.encode_pending = m.GetGauge(
      "orbitkv_ssd_gpu_encode_pending",
      "Encoded groups admitted to GPU encode and not yet written (queued, encoding, or in the "
      "encode arena until their cuFile write completed).",
      dev);
  g.encode_seconds =
      m.GetHistogram("orbitkv_ssd_gpu_encode_seconds",
                     "GPU encode of one group: the frames, their CRC32Cs and the object header.",
                     LatencyBuckets(), dev);
  for (std::string_view r : kEncodeFallbacks) EncodeFallback(ordinal, r);  // zero from the start
  if (ordinal < 0) return g;
  g.read_bytes = m.GetCounter("orbitkv_ssd_cufile_read_bytes_total",
                              "Physical bytes read through cuFile, including alignment.", dev);
  g.write_bytes = m.GetCounter("orbitkv_ssd_cufile_write_bytes_total",
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
  g.staging_bytes =
      m.GetGauge("orbitkv_ssd_gpu_staging_bytes", "Allocated registered GPU staging memory.", dev);
  return g;
}

// ---- DirectWrites -------------------------------------------------------------

void DirectWrites::Add() {
  MutexLock l(mu_);
  ++outstanding_;
}

void DirectWrites::Cancel() {
  MutexLock l(mu_);
  --outstanding_;
}

void DirectWrites::Finished(Done d) {
  MutexLock l(mu_);
  done_.push_back(std::move(d));
  --outstanding_;
  cv_.NotifyAll();
}

std::vector<DirectWrites::Done> DirectWrites::Wait() {
  MutexLock l(mu_);
  while (outstanding_ != 0) cv_.Wait(mu_);
  return std::move(done_);
}

// ---- CufileRoute ----------------------------------------------------------------

CufileRoute::CufileRoute(Options options) : o_(std::move(options)) {}

bool CufileRoute::explicit_read() const {
  return o_.read_path == SsdReadPath::kCufile || o_.backend == SsdBackend::kCufile;
}

bool CufileRoute::ServesReads(const Instance& inst) const {
  // Encoded namespaces too: Submit declines the blocks the GPU decode path
  // cannot stage (they go to the host reader).
  if (!inst.cuda()) return false;
  if (o_.read_path) return *o_.read_path == SsdReadPath::kCufile;  // explicit: never switched
  return admit_.load();
}

bool CufileRoute::ServesWrites(const Instance& inst) const {
  // Encoded namespaces write back through io_uring, encoded on the CPU.
  return inst.cuda() && inst.codec.raw() && admit_.load();
}

bool CufileRoute::ServesEncodedWrites(const Instance& inst) const {
  return inst.cuda() && !inst.codec.raw() && o_.encode_budget_bytes > 0 && o_.codec_budget &&
         o_.dram && admit_.load();
}

void CufileRoute::NoteEncodeFallback(const Instance& inst, std::string_view reason) {
  o_.series->EncodeFallback(inst.device().ordinal(), reason)->Inc();
}

void CufileRoute::OnFailure(const Status& st) {
  if (o_.backend != SsdBackend::kAuto) {
    OKV_LOG_WARN("cuFile failure (--ssd-backend cufile keeps cuFile): {}", st.ToString());
    return;
  }
  if (admit_.exchange(false)) {
    o_.backend_fallbacks->Inc();
    OKV_LOG_WARN(
        "SSD backend fallback: cuFile failed ({}); auto stops admitting cuFile work and new "
        "SSD work uses io_uring until restart{}",
        st.ToString(),
        o_.read_path == SsdReadPath::kCufile
            ? " (reads stay on cuFile: --ssd-read-path cufile is explicit)"
            : "");
  }
}

Result<SsdGpuWorker*> CufileRoute::Worker(Instance& inst) {
  std::shared_ptr<Cell> cell;
  {
    MutexLock l(mu_);
    std::shared_ptr<Cell>& c = cells_[inst.id];
    if (!c) c = std::make_shared<Cell>();
    cell = c;
  }
  MutexLock l(cell->mu);
  if (cell->worker) return cell->worker.get();
  GpuWorkerOptions o;
  o.device = &inst.device();
  for (auto& f : o_.selection.files) o.files.push_back(f.get());
  o.store = o_.ssd;
  o.slot_bytes = o_.slot_bytes;
  o.max_write_jobs = o_.max_write_jobs;
  o.clock = o_.clock;
  o.metrics = o_.series->Device(inst.device().ordinal());
  o.on_io_failure = [this](const Status& st) { OnFailure(st); };
  o.codec_budget_bytes = o_.codec_budget_bytes;
  o.encode_budget_bytes = o_.encode_budget_bytes;
  o.codec_budget = o_.codec_budget;
  o.codec_metrics = o_.codec_metrics;
  Result<std::unique_ptr<SsdGpuWorker>> w = SsdGpuWorker::Create(std::move(o));
  if (!w.ok()) {
    OKV_LOG_WARN("instance {}: creating its cuFile worker failed: {}", inst.id,
                 w.status().ToString());
    OnFailure(w.status());
    return w.status();
  }
  cell->worker = std::move(w).value();
  OKV_LOG_INFO("instance {}: cuFile worker on cuda:{} (2 x {} registered staging)", inst.id,
               inst.device().ordinal(), FormatByteSize(o_.slot_bytes));
  return cell->worker.get();
}

void CufileRoute::Retire(InstanceId instance) {
  std::shared_ptr<Cell> cell;
  {
    MutexLock l(mu_);
    auto it = cells_.find(instance);
    if (it == cells_.end()) return;
    cell = std::move(it->second);
    cells_.erase(it);
  }
  std::unique_ptr<SsdGpuWorker> w;
  {
    MutexLock l(cell->mu);
    w = std::move(cell->worker);
  }
  w.reset();  // Close: drains submitted batches, deregisters staging
}

void CufileRoute::Close() {
  std::vector<InstanceId> ids;
  {
    MutexLock l(mu_);
    for (const auto& [id, cell] : cells_) ids.push_back(id);
  }
  for (InstanceId id : ids) Retire(id);
}

std::vector<RestoreBlock> CufileRoute::Submit(const std::shared_ptr<RestoreRec>& r,
                                              std::vector<RestoreBlock> blocks) {
  Instance& inst = *r->inst;
  Result<SsdGpuWorker*> worker = Worker(inst);
  if (!worker.ok()) {
    if (!explicit_read()) return blocks;  // auto fell back: io_uring serves them
    r->SetSsdCost(o_.cost);
    for (RestoreBlock& b : blocks) {  // an explicit route is never switched
      o_.ssd->catalog().Cancel(b.src.lease);
      r->Finish(b.result, Tier::kSsd, worker.status());
    }
    return {};
  }
  // Encoded namespaces: the GPU decode lane stages whole objects; what it
  // cannot take goes to the host reader.
  std::vector<RestoreBlock> declined;
  if (!inst.codec.raw()) {
    Result<uint64_t> capacity = (*worker)->EnableDecode();
    if (!capacity.ok()) {
      OKV_LOG_DEBUG("instance {}: encoded reads take the host reader: {}", inst.id,
                    capacity.status().ToString());
      return blocks;
    }
    std::erase_if(blocks, [&](RestoreBlock& b) {
      if (EncodedFitsGpu(inst, b, *capacity)) return false;
      declined.push_back(std::move(b));
      return true;
    });
    if (blocks.empty()) return declined;
  }
  r->SetSsdCost(o_.cost);
  GpuReadRequest req;
  auto taken = std::make_shared<std::vector<RestoreBlock>>();
  for (RestoreBlock& b : blocks) {
    if (!o_.ssd->catalog().Submit(b.src.lease).ok()) {
      r->Finish(b.result, Tier::kSsd,
                Status::NotFound("SSD lease expired before the read was submitted"));
      continue;
    }
    // Each piece scatters into its own group's slots (a hybrid restore mixes groups).
    const GroupLayout* g = inst.groups.at(b.src.id.group);
    const ObjectShape& shape = *inst.shapes.at(b.src.id.group);
    GpuReadItem it;
    it.ref = b.src.ref;
    it.id = b.src.id;  // checked with the payload CRCs before any scatter
    it.slot_bytes = shape.slot_bytes;
    it.codec = inst.codec;
    for (const SlotLayout& s : g->slots) {
      if (!inst.codec.raw()) {
        it.decode.push_back({s.slot_id, inst.DevicePage(s, b.page)});
        continue;
      }
      it.scatter.push_back(
          {shape.segments[s.slot_id].offset, s.bytes_per_page, inst.DevicePage(s, b.page)});
    }
    req.items.push_back(std::move(it));
    taken->push_back(b);
  }
  if (taken->empty()) return declined;
  // One token for the job, returned with its last item; and one that the
  // io_uring writeback lanes yield to (writeback.h).
  auto token = std::make_shared<LaneToken>(o_.lanes->Start());
  auto reading =
      std::make_shared<LaneToken>(o_.restore_reads ? o_.restore_reads->Start() : LaneToken());
  auto left = std::make_shared<std::atomic<size_t>>(taken->size());
  req.item_done = [this, r, taken, left, token, reading](size_t i, Status st) {
    RestoreBlock& b = (*taken)[i];
    // The job's reads are over with its last item: the writeback may go on
    // before the restore reports (its done may run at once in Finish).
    const bool last = left->fetch_sub(1) == 1;
    if (last) reading->Release();
    o_.ssd->catalog().Complete(b.src.lease);
    if (st.ok()) {
      o_.bytes_restore->Inc(b.src.ref.object_size);
    } else if (st.code() == StatusCode::kCancelled) {
      o_.cancelled->Inc();
    } else {
      o_.ssd->DropIfCorrupt(b.src.ref, b.src.id, st);
    }
    // The worker reports an item once read and scattered: both stages end here.
    r->Stamp(RestoreRec::Stage::kIoComplete);
    r->Stamp(RestoreRec::Stage::kCopyComplete);
    r->Finish(b.result, Tier::kSsd, std::move(st));
    if (last) token->Release();
  };
  r->Stamp(RestoreRec::Stage::kIoSubmitted);
  Result<SsdGpuWorker::JobId> job = (*worker)->SubmitRead(std::move(req));
  if (job.ok()) {
    r->gpu_job.store(*job);
    return declined;
  }
  for (RestoreBlock& b : *taken) {
    o_.ssd->catalog().Complete(b.src.lease);
    r->Finish(b.result, Tier::kSsd, job.status());
  }
  reading->Release();
  token->Release();
  return declined;
}

bool CufileRoute::EncodedFitsGpu(const Instance& inst, const RestoreBlock& b,
                                 uint64_t capacity) const {
  if (b.src.ref.length > capacity) return false;
  const GroupLayout* g = inst.groups.at(b.src.id.group);
  const ObjectShape& shape = *inst.shapes.at(b.src.id.group);
  for (const SlotLayout& s : g->slots) {
    // The decoder writes whole slots into 16-byte aligned pages.
    if (s.bytes_per_page != shape.slot_bytes[s.slot_id] || inst.DevicePage(s, b.page) % 16 != 0) {
      return false;
    }
  }
  return true;
}

uint32_t CufileRoute::Cancel(const std::shared_ptr<RestoreRec>& r) {
  const uint64_t job = r->gpu_job.load();
  if (job == 0) return 0;
  std::shared_ptr<Cell> cell;
  {
    MutexLock l(mu_);
    auto it = cells_.find(r->instance);
    if (it == cells_.end()) return 0;
    cell = it->second;
  }
  SsdGpuWorker* w = nullptr;
  {
    MutexLock l(cell->mu);
    w = cell->worker.get();
  }
  // The caller's hold on the instance keeps the worker alive (Retire runs after the last).
  return w ? w->CancelRead(job) : 0;
}

bool CufileRoute::SubmitWrite(Instance& inst, const GroupLayout& g, const ObjectShape& shape,
                              const ObjectId& id, uint64_t page, const uint8_t* dram_header,
                              const std::shared_ptr<DirectWrites>& dw) {
  Result<SsdGpuWorker*> worker = Worker(inst);
  if (!worker.ok()) return false;
  DramView scratch{};
  const uint8_t* header = dram_header;
  if (header == nullptr) {
    // No DRAM copy: the payload CRCs come from the pages, on the GPU, into
    // pinned staging after the header.
    const uint64_t crc_at = shape.header_bytes;
    Result<DramView> sv = o_.staging->TryAllocate(crc_at + 4 * uint64_t{g.num_slots});
    if (!sv.ok()) return false;
    scratch = *sv;
    auto* out = reinterpret_cast<uint32_t*>(scratch.data + crc_at);
    if (Status st = inst.PageCrcs(g, page, out); !st.ok()) {
      OKV_LOG_WARN("cuFile write of a group not submitted: {}", st.ToString());
      o_.staging->Release(scratch);
      return false;
    }
    std::vector<uint32_t> crcs(g.num_slots);
    for (size_t k = 0; k < g.slots.size(); ++k) crcs[g.slots[k].slot_id] = out[k];
    WriteObjectHeader(id, shape.slot_bytes, ObjectCodec{}, crcs, {scratch.data, crc_at});
    header = scratch.data;
  }
  GpuWriteRequest w;
  w.key = StoreKey(id);
  w.ns = id.ns;
  w.object_size = shape.object_size;
  w.header = header;
  w.header_bytes = shape.header_bytes;
  for (const SlotLayout& s : g.slots) {
    w.gather.push_back(
        {shape.segments[s.slot_id].offset, s.bytes_per_page, inst.DevicePage(s, page)});
  }
  const bool dram_copy = dram_header != nullptr;
  w.done = [dw, id, dram_copy, scratch](Result<ExtentRef> r) {
    dw->Finished({id, dram_copy, scratch, r.status()});
  };
  dw->Add();
  Status st = (*worker)->SubmitWrite(std::move(w));
  if (st.ok()) return true;
  dw->Cancel();
  if (scratch.data) o_.staging->Release(scratch);
  if (st.code() == StatusCode::kResourceExhausted) {
    o_.write_fallbacks->Inc();  // eight GPU writes admitted: D2H + io_uring instead
  } else {
    OKV_LOG_DEBUG("cuFile write of a group not submitted: {}", st.ToString());
  }
  return false;
}

bool CufileRoute::SubmitEncodedWrite(Instance& inst, const GroupLayout& g, const ObjectShape& shape,
                                     const ObjectId& id, uint64_t page, size_t index,
                                     const std::shared_ptr<DirectWrites>& dw) {
  GpuEncodedWriteRequest w;
  w.key = StoreKey(id);
  w.ns = id.ns;
  w.id = id;
  w.codec = inst.codec;
  w.slot_bytes = shape.slot_bytes;
  w.sources.assign(g.num_slots, 0);
  for (const SlotLayout& s : g.slots) {
    const gpu::DevPtr p = inst.DevicePage(s, page);
    // The encoder reads whole slots from 16-byte aligned pages.
    if (s.bytes_per_page != shape.slot_bytes[s.slot_id] || p % 16 != 0) {
      NoteEncodeFallback(inst, "unaligned");
      return false;
    }
    w.sources[s.slot_id] = p;
  }
  Result<SsdGpuWorker*> worker = Worker(inst);
  if (!worker.ok()) return false;  // counted as a backend fallback under auto
  Result<uint64_t> capacity = (*worker)->EnableEncode();
  if (!capacity.ok()) {
    OKV_LOG_DEBUG("instance {}: encoded writes take the CPU path: {}", inst.id,
                  capacity.status().ToString());
    NoteEncodeFallback(inst, "no_lane");
    return false;
  }
  if (g.num_slots > GpuEncodeLane::kMaxSegments ||
      GpuEncodeLane::Bound(inst.codec, shape.slot_bytes) > *capacity) {
    NoteEncodeFallback(inst, "oversized");
    return false;
  }
  // What the write needs between its encode and its completion.
  struct State {
    bool dram_copy = false;
    DramView scratch{};
    // Detached from the Publish (Done::detached); Drain waits for the token.
    bool detached = false;
    LaneToken token;
  };
  auto state = std::make_shared<State>();
  const uint64_t header_bytes = shape.header_bytes;
  w.encoded = [this, state, id, index, dw,
               header_bytes](const EncodedObjectView& v) -> Result<const uint8_t*> {
    // The compressed DRAM copy for hot reuse, where the pool has room:
    // writeback-pending until the write finished (Publish ends it).
    Result<DramView> dv = o_.dram->BeginAssembly(id, v.object_size, 1, v.header);
    if (dv.ok()) {
      if (Status c = v.copy_to_host(dv->data); !c.ok()) {
        o_.dram->AbortAssembly(*dv);
        return c;
      }
      const uint8_t* header = dv->data;  // stays: a sealed entry waits for its writeback
      const uint32_t part = 0;
      Result<bool> sealed = o_.dram->CompleteParts(*dv, {&part, 1});
      if (sealed.ok() && *sealed) {
        state->dram_copy = true;
        if (o_.detached_write_done) {
          // The bytes are in the arena and the pool: the Publish may return
          // and the engine reuse its pages while the disk write goes on.
          state->detached = true;
          state->token = o_.lanes->Start();
          DirectWrites::Done d;
          d.id = id;
          d.dram_copy = true;
          d.encoded = true;
          d.object_size = v.object_size;
          d.index = index;
          d.detached = true;
          dw->Finished(std::move(d));
        }
        return header;
      }
    }
    // SSD only: the header in pinned read staging.
    Result<DramView> sv = o_.staging->TryAllocate(header_bytes);
    if (!sv.ok()) return sv.status().WithContext("pinned staging for an encoded object's header");
    std::memcpy(sv->data, v.header.data(), header_bytes);
    state->scratch = *sv;
    return sv->data;
  };
  const int ordinal = inst.device().ordinal();
  w.done = [this, dw, id, index, state, ordinal](Result<ExtentRef> r, uint64_t size) {
    if (state->detached) {  // its Publish counted it at the encode
      o_.detached_write_done(id, size, r.status());
      state->token.Release();
      return;
    }
    if (!r.ok() && !state->dram_copy) {
      OKV_LOG_DEBUG("GPU-encoded write of {} failed, the CPU path takes it: {}", id.key.ShortHex(),
                    r.status().ToString());
      o_.series->EncodeFallback(ordinal, "failed")->Inc();
    }
    DirectWrites::Done d;
    d.id = id;
    d.dram_copy = state->dram_copy;
    d.scratch = state->scratch;
    d.status = r.status();
    d.encoded = true;
    d.object_size = size;
    d.index = index;
    dw->Finished(std::move(d));
  };
  dw->Add();
  Status st = (*worker)->SubmitEncodedWrite(std::move(w));
  if (st.ok()) return true;
  dw->Cancel();
  if (st.code() == StatusCode::kResourceExhausted) {
    NoteEncodeFallback(inst, "lane_full");  // admission saturation: every write job admitted
  } else if (st.code() == StatusCode::kBusy) {
    NoteEncodeFallback(inst, "arena_full");
  } else {
    OKV_LOG_DEBUG("GPU-encoded write of a group not submitted: {}", st.ToString());
    NoteEncodeFallback(inst, "failed");
  }
  return false;
}

CufileRoute::Stats CufileRoute::stats() const {
  std::vector<std::shared_ptr<Cell>> cells;
  {
    MutexLock l(mu_);
    for (const auto& [id, cell] : cells_) cells.push_back(cell);
  }
  Stats s;
  for (const auto& cell : cells) {
    MutexLock l(cell->mu);
    if (!cell->worker) continue;
    GpuWorkerStats ws = cell->worker->stats();
    ++s.workers;
    s.write_jobs += ws.write_jobs;
    s.inflight_batches += ws.inflight_batches;
  }
  return s;
}

}  // namespace orbitkv
