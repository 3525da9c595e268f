#include "manager/ssd_gpu_worker.h"

#include <algorithm>

#include "manager/ssd_gpu_worker_impl.h"
#include "store/ssd_store.h"

namespace orbitkv {

using namespace gpu_worker;

void SsdGpuWorker::Impl::PieceDone(const std::shared_ptr<ReadJobState>& job, size_t item,
                                   const Status& st, Callbacks* cbs) {
  if (!st.ok() && job->status[item].ok()) job->status[item] = st;
  if (++job->pieces_done[item] < job->pieces_total[item] || job->reported[item]) return;
  job->reported[item] = true;
  if (--job->items_left == 0) jobs.erase(job->id);
  Status s = job->status[item];
  if (job->check[item].encoded) {
    cbs->push_back([this, job, item, s] { FinishEncoded(job, item, s); });
    return;
  }
  cbs->push_back([job, item, s] { job->req.item_done(item, s); });
}

void SsdGpuWorker::Impl::FinishEncoded(const std::shared_ptr<ReadJobState>& job, size_t item,
                                       Status st) {
  const GpuReadItem& it = job->req.items[item];
  gpu::DevPtr input = 0;
  {
    MutexLock l(mu);
    input = std::exchange(job->check[item].input, 0);
  }
  if (st.ok() && input == 0) st = Status::Internal("encoded read finished without an arena range");
  if (!st.ok()) {
    // Every submitted piece completed (this is the item's last report), so
    // no GPU work uses the range any more.
    if (input != 0) decode->Give(input, it.ref.length);
    job->req.item_done(item, st);
    return;
  }
  // OK: every piece was read, header-checked and copied on the worker
  // thread, which runs this callback (a piece dropped by Cancel or Close
  // fails its item).
  GpuDecodeLane::Task t;
  t.input = input;
  t.input_bytes = it.ref.length;
  t.header = *job->check[item].header;
  t.codec = it.codec;
  for (const DecodeTarget& d : it.decode)
    t.targets.push_back({d.slot, d.dst, it.slot_bytes[d.slot]});
  t.done = [job, item](Status s) { job->req.item_done(item, std::move(s)); };
  decode->Submit(std::move(t));
}

Result<uint64_t> SsdGpuWorker::EnableDecode() {
  Impl& m = *impl_;
  MutexLock l(m.decode_mu);
  if (m.decode_outcome) return *m.decode_outcome;
  GpuDecodeLaneOptions o;
  o.device = m.o.device;
  o.budget_bytes = m.o.codec_budget_bytes;
  o.budget = m.o.codec_budget;
  o.metrics = m.o.codec_metrics;
  o.on_space = [&m] {
    {
      MutexLock g(m.mu);
      m.arena_blocked = false;
    }
    m.cv.NotifyAll();
  };
  Result<std::unique_ptr<GpuDecodeLane>> lane =
      m.o.codec_budget_bytes == 0 || !m.o.codec_budget || !m.o.codec_metrics
          ? Result<std::unique_ptr<GpuDecodeLane>>(
                Status::ResourceExhausted("no --codec-budget share for the GPU decode path"))
          : GpuDecodeLane::Create(std::move(o));
  if (!lane.ok()) {
    m.decode_outcome = lane.status();
  } else {
    m.decode = std::move(lane).value();
    m.decode_outcome = m.decode->capacity();
  }
  return *m.decode_outcome;
}

uint32_t SsdGpuWorker::Impl::DropPending(const std::function<bool(const Piece&)>& pred,
                                         const Status& why, Callbacks* cbs) {
  uint32_t items = 0;
  std::deque<Piece> keep;
  for (Piece& p : pending) {
    if (!pred(p)) {
      keep.push_back(std::move(p));
      continue;
    }
    const bool was_reported = p.job->reported[p.item];
    PieceDone(p.job, p.item, why, cbs);
    if (!was_reported && p.job->reported[p.item]) ++items;
  }
  pending.swap(keep);
  return items;
}

void SsdGpuWorker::Impl::WriteDone(const std::shared_ptr<WriteJobState>& w, Result<ExtentRef> r,
                                   Callbacks* cbs) {
  --write_jobs;
  auto done = std::move(w->req.done);
  cbs->push_back([done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
}

void SsdGpuWorker::Impl::Release() {
  for (Slot& s : slots) {
    if (s.stream) o.device->Synchronize(*s.stream).IgnoreError("worker teardown");
    if (s.stream_registered) {
      o.device->DeregisterStream(*s.stream).IgnoreError("worker teardown");
    }
    if (s.registered) o.device->DeregisterBuffer(s.base).IgnoreError("worker teardown");
    s.io_event.reset();
    s.scatter_event.reset();
    s.stream.reset();
    if (s.host) {
      o.device->FreeHost(s.host).IgnoreError("worker teardown");
      s.host = nullptr;
    }
    if (s.base) {
      o.device->Free(s.base).IgnoreError("worker teardown");
      o.metrics.staging_bytes->Sub(static_cast<int64_t>(o.slot_bytes));
      s.base = 0;
    }
  }
}

Result<std::unique_ptr<SsdGpuWorker>> SsdGpuWorker::Create(GpuWorkerOptions options) {
  if (!options.device || !options.store || options.files.empty() ||
      options.slot_bytes % kAlign != 0 || options.slot_bytes == 0) {
    return Status::InvalidArgument(
        "SsdGpuWorker: device, store, files and an aligned slot size "
        "are required");
  }
  if (!options.clock) options.clock = Clock::Real();
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  impl->max_reads = impl->o.slot_bytes / kAlign;
  gpu::Device& d = *impl->o.device;
  for (Slot& s : impl->slots) {
    Status st = [&]() -> Status {
      ORBITKV_ASSIGN_OR_RETURN(s.base, d.Allocate(impl->o.slot_bytes));
      impl->o.metrics.staging_bytes->Add(static_cast<int64_t>(impl->o.slot_bytes));
      ORBITKV_RETURN_IF_ERROR(d.RegisterBuffer(s.base, impl->o.slot_bytes));
      s.registered = true;
      ORBITKV_ASSIGN_OR_RETURN(s.stream, d.CreateStream());
      ORBITKV_RETURN_IF_ERROR(d.RegisterStream(*s.stream));
      s.stream_registered = true;
      ORBITKV_ASSIGN_OR_RETURN(s.io_event, d.CreateEvent());
      ORBITKV_ASSIGN_OR_RETURN(s.scatter_event, d.CreateEvent());
      s.ios = std::make_unique<gpu::AsyncIo[]>(impl->max_reads);
      ORBITKV_ASSIGN_OR_RETURN(s.host, d.AllocateHost(kVerifyHeaderBytes + 4 * kVerifyMaxFrags));
      return Status::OK();
    }();
    if (!st.ok()) {
      impl->Release();
      return st.WithContext("GPU staging on device " + std::to_string(d.ordinal()));
    }
  }
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->Loop(); });
  return std::unique_ptr<SsdGpuWorker>(new SsdGpuWorker(std::move(impl)));
}

SsdGpuWorker::SsdGpuWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SsdGpuWorker::~SsdGpuWorker() {
  Close();
  impl_->encode.reset();  // its arena and budget share
  impl_->decode.reset();  // its arena and budget share
  impl_->Release();
}
Result<SsdGpuWorker::JobId> SsdGpuWorker::SubmitRead(GpuReadRequest req) {
  Impl& m = *impl_;
  if (req.items.empty() || !req.item_done) {
    return Status::InvalidArgument("GPU read: no items or no completion callback");
  }
  for (const GpuReadItem& it : req.items) {
    if (it.ref.shard >= m.o.files.size()) {
      return Status::InvalidArgument("read of shard " + std::to_string(it.ref.shard) +
                                     ": the cache has " + std::to_string(m.o.files.size()));
    }
    if (it.ref.length == 0 || it.ref.length % kAlign != 0 || it.ref.offset % kAlign != 0 ||
        it.ref.object_size > it.ref.length) {
      return Status::InvalidArgument("read of a malformed extent");
    }
    if (it.slot_bytes.empty() || it.slot_bytes.size() > kMaxSlotsPerGroup ||
        std::find(it.slot_bytes.begin(), it.slot_bytes.end(), 0u) != it.slot_bytes.end() ||
        (it.codec.raw() && ObjectSize(it.slot_bytes) > it.ref.object_size) ||
        ObjectHeaderSize(static_cast<uint32_t>(it.slot_bytes.size())) > it.ref.object_size) {
      return Status::InvalidArgument("read of shard " + std::to_string(it.ref.shard) +
                                     ": the item's slot sizes do not describe its " +
                                     std::to_string(it.ref.object_size) + "-byte object");
    }
    if (ObjectHeaderSize(static_cast<uint32_t>(it.slot_bytes.size())) > m.o.slot_bytes) {
      return Status::InvalidArgument("an object header of " + std::to_string(it.slot_bytes.size()) +
                                     " slots does not fit a staging slot");
    }
    if (!it.codec.raw()) {
      if (!m.decode || it.ref.length > m.decode->capacity() || !it.scatter.empty() ||
          it.decode.empty()) {
        return Status::InvalidArgument(
            "encoded read: no GPU decode lane, an extent larger than its arena, or scatter "
            "spans instead of decode targets");
      }
      for (const DecodeTarget& d : it.decode) {
        if (d.slot >= it.slot_bytes.size() || d.dst == 0 || d.dst % 16 != 0) {
          return Status::InvalidArgument("encoded read: decode target of slot " +
                                         std::to_string(d.slot) +
                                         " is outside the object or not 16-byte aligned");
        }
      }
    }
    for (const ScatterSpan& s : it.scatter) {
      if (s.bytes == 0 || s.object_offset > it.ref.object_size ||
          s.bytes > it.ref.object_size - s.object_offset || s.dst == 0) {
        return Status::InvalidArgument("scatter span [" + std::to_string(s.object_offset) + ", +" +
                                       std::to_string(s.bytes) + ") is outside the " +
                                       std::to_string(it.ref.object_size) + "-byte object");
      }
    }
  }
  auto job = std::make_shared<ReadJobState>();
  const size_t n = req.items.size();
  job->pieces_total.assign(n, 0);
  job->pieces_done.assign(n, 0);
  job->pieces_submitted.assign(n, 0);
  job->status.assign(n, Status::OK());
  job->reported.assign(n, false);
  job->check.resize(n);
  job->items_left = n;
  job->req = std::move(req);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < n; ++i) {
    const ExtentRef& ref = job->req.items[i].ref;
    ItemCheck& c = job->check[i];
    c.encoded = !job->req.items[i].codec.raw();
    c.segments = SegmentLayout(job->req.items[i].slot_bytes);
    c.header_bytes = ObjectHeaderSize(static_cast<uint32_t>(c.segments.size()));
    for (uint64_t off = 0; off < ref.length; off += m.o.slot_bytes) {
      Piece p;
      p.job = job;
      p.item = i;
      p.offset = off;
      p.length = std::min(m.o.slot_bytes, ref.length - off);
      p.file = SsdStore::FileRange(ref, off, p.length);
      for (uint32_t k = 0; k < c.segments.size() && !c.encoded; ++k) {
        const uint64_t lo = std::max(c.segments[k].offset, off);
        const uint64_t hi = std::min(c.segments[k].offset + c.segments[k].size, off + p.length);
        if (lo < hi) p.frags.push_back({k, lo - c.segments[k].offset, hi - lo, 0});
      }
      pieces.push_back(std::move(p));
      ++job->pieces_total[i];
    }
  }
  {
    MutexLock l(m.mu);
    if (m.closing) return Status::Cancelled("SSD worker is closing");
    job->id = m.next_job++;
    m.jobs[job->id] = job;
    for (Piece& p : pieces) m.pending.push_back(std::move(p));
  }
  m.cv.NotifyAll();
  return job->id;
}

Status SsdGpuWorker::SubmitWrite(GpuWriteRequest req) {
  Impl& m = *impl_;
  if (req.object_size == 0 || req.header_bytes > req.object_size || !req.done) {
    return Status::InvalidArgument("GPU write: empty object or header beyond it");
  }
  for (const GatherSpan& g : req.gather) {
    if (g.bytes == 0 || g.object_offset > req.object_size ||
        g.bytes > req.object_size - g.object_offset || g.src == 0) {
      return Status::InvalidArgument("gather span outside the object");
    }
  }
  ORBITKV_RETURN_IF_ERROR(m.TakePermit());
  return m.QueueWrite(std::move(req));
}

Status SsdGpuWorker::Impl::TakePermit() {
  MutexLock l(mu);
  if (closing) return Status::Cancelled("SSD worker is closing");
  if (write_jobs >= o.max_write_jobs) {
    return Status::ResourceExhausted(std::to_string(o.max_write_jobs) +
                                     " GPU write jobs are already admitted");
  }
  ++write_jobs;  // the permit; held until the job's done runs
  return Status::OK();
}

void SsdGpuWorker::Impl::ReturnPermit() {
  MutexLock l(mu);
  --write_jobs;
}

Status SsdGpuWorker::Impl::QueueWrite(GpuWriteRequest req) {
  auto w = std::make_shared<WriteJobState>();
  Result<ExtentRef> ref = o.store->Reserve(req.key, req.object_size, req.ns);
  MutexLock l(mu);
  if (!ref.ok() || closing) {
    --write_jobs;
    if (ref.ok()) {
      Status c = Status::Cancelled("SSD worker is closing");
      o.store->Abort(*ref, c);
      return c;
    }
    return ref.status();
  }
  w->ref = *ref;
  w->req = std::move(req);
  writes.push_back(std::move(w));
  cv.NotifyAll();
  return Status::OK();
}

Result<uint64_t> SsdGpuWorker::EnableEncode() {
  Impl& m = *impl_;
  MutexLock l(m.decode_mu);
  if (m.encode_outcome) return *m.encode_outcome;
  GpuEncodeLaneOptions o;
  o.device = m.o.device;
  o.budget_bytes = m.o.encode_budget_bytes;
  o.budget = m.o.codec_budget;
  o.metrics = m.o.codec_metrics;
  o.seconds = m.o.metrics.encode_seconds;
  Result<std::unique_ptr<GpuEncodeLane>> lane =
      m.o.encode_budget_bytes == 0 || !m.o.codec_budget || !m.o.codec_metrics
          ? Result<std::unique_ptr<GpuEncodeLane>>(
                Status::ResourceExhausted("no --codec-budget share for the GPU encode path"))
          : GpuEncodeLane::Create(std::move(o));
  if (!lane.ok()) {
    m.encode_outcome = lane.status();
  } else {
    m.encode = std::move(lane).value();
    m.encode_outcome = m.encode->capacity();
  }
  return *m.encode_outcome;
}

Status SsdGpuWorker::SubmitEncodedWrite(GpuEncodedWriteRequest req) {
  Impl& m = *impl_;
  GpuEncodeLane* lane = nullptr;
  {
    MutexLock l(m.decode_mu);
    lane = m.encode.get();
  }
  if (lane == nullptr) return Status::FailedPrecondition("GPU encoded write before EnableEncode");
  if (!req.encoded || !req.done || req.codec.raw()) {
    return Status::InvalidArgument("GPU encoded write: no callbacks or a raw codec");
  }
  ORBITKV_RETURN_IF_ERROR(m.TakePermit());
  auto r = std::make_shared<GpuEncodedWriteRequest>(std::move(req));
  GpuEncodeLane::Task t;
  t.id = r->id;
  t.codec = r->codec;
  t.slot_bytes = r->slot_bytes;
  t.sources = r->sources;
  Impl* p = &m;
  t.encoded = [p, r](Result<GpuEncodeLane::Encoded> e) { p->Encoded(r, std::move(e)); };
  Gauge* pending = m.o.metrics.encode_pending;
  if (pending) pending->Add(1);  // before the lane thread may report it
  if (Status st = lane->Submit(std::move(t)); !st.ok()) {
    if (pending) pending->Sub(1);
    m.ReturnPermit();
    return st;
  }
  return Status::OK();
}

void SsdGpuWorker::Impl::Encoded(const std::shared_ptr<GpuEncodedWriteRequest>& r,
                                 Result<GpuEncodeLane::Encoded> e) {
  GpuEncodeLane* lane = encode.get();  // set before any task was submitted
  Gauge* pending_gauge = o.metrics.encode_pending;
  auto finish = [r, pending_gauge](Result<ExtentRef> ref, uint64_t size) {
    if (pending_gauge) pending_gauge->Sub(1);
    r->done(std::move(ref), size);
  };
  if (!e.ok()) {  // the lane took its range back
    ReturnPermit();
    finish(e.status(), 0);
    return;
  }
  const gpu::DevPtr range = e->range;
  const uint64_t range_bytes = e->range_bytes;
  const uint64_t size = e->object_size;
  bool closed = false;
  {
    MutexLock l(mu);
    closed = closing;
  }
  Result<const uint8_t*> header =
      closed ? Result<const uint8_t*>(Status::Cancelled("SSD worker closed before the write"))
             : r->encoded({size, e->header,
                           [lane, &e](uint8_t* dst) { return lane->CopyToHost(*e, dst); }});
  if (!header.ok()) {
    lane->Release(range, range_bytes);
    ReturnPermit();
    finish(header.status(), size);
    return;
  }
  GpuWriteRequest w;
  w.key = r->key;
  w.ns = r->ns;
  w.object_size = size;
  w.header = *header;
  w.header_bytes = e->header.size();
  for (const GpuEncodeLane::Frame& f : e->frames) {
    w.gather.push_back({f.object_offset, f.bytes, f.src});
  }
  w.done = [lane, range, range_bytes, size, finish](Result<ExtentRef> ref) {
    lane->Release(range, range_bytes);  // the disk write completed (or failed)
    finish(std::move(ref), size);
  };
  if (Status st = QueueWrite(std::move(w)); !st.ok()) {  // the permit is back
    lane->Release(range, range_bytes);
    finish(st, size);
  }
}

uint32_t SsdGpuWorker::CancelRead(JobId id) {
  Impl& m = *impl_;
  Callbacks cbs;
  uint32_t n = 0;
  {
    MutexLock l(m.mu);
    auto it = m.jobs.find(id);
    if (it == m.jobs.end()) return 0;
    std::shared_ptr<ReadJobState> job = it->second.lock();
    if (!job) {
      m.jobs.erase(it);
      return 0;
    }
    n = m.DropPending(
        [&](const Piece& p) { return p.job == job && job->pieces_submitted[p.item] == 0; },
        Status::Cancelled("restore cancelled before its read was submitted"), &cbs);
  }
  for (auto& cb : cbs) cb();
  return n;
}

void SsdGpuWorker::Close() {
  Impl& m = *impl_;
  Callbacks cbs;
  {
    MutexLock l(m.mu);
    m.closing = true;
    m.DropPending([](const Piece&) { return true; }, Status::Cancelled("SSD worker closed"), &cbs);
    while (!m.writes.empty()) {
      std::shared_ptr<WriteJobState> w = std::move(m.writes.front());
      m.writes.pop_front();
      Status c = Status::Cancelled("SSD worker closed before the write was submitted");
      m.o.store->Abort(w->ref, c);
      m.WriteDone(w, c, &cbs);
    }
  }
  m.cv.NotifyAll();
  for (auto& cb : cbs) cb();
  std::call_once(m.joined, [&] {
    if (m.thread.joinable()) m.thread.join();
  });
  // Groups still queued for encode are cancelled; one encoding finds the
  // worker closing and reports Cancelled.
  if (m.encode) m.encode->Close();
  // The thread handed its last objects to the lane: they decode and report.
  if (m.decode) m.decode->Close();
}

GpuWorkerStats SsdGpuWorker::stats() const {
  MutexLock l(impl_->mu);
  GpuWorkerStats s;
  s.queued_reads = impl_->pending.size();
  s.write_jobs = impl_->write_jobs;
  s.inflight_batches = impl_->busy.load();
  s.read_submissions = impl_->read_submissions;
  s.write_submissions = impl_->write_submissions;
  return s;
}

}  // namespace orbitkv
