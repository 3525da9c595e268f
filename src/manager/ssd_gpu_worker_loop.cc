// SsdGpuWorker's thread (ssd_gpu_worker_impl.h): takes batches under mu, then
// drives the two slots through I/O, verification and scatter with mu released.
#include <algorithm>
#include <chrono>

#include "common/thread_name.h"
#include "io/coalesce.h"
#include "manager/ssd_gpu_worker_impl.h"
#include "store/crc32c.h"
#include "store/ssd_store.h"

namespace orbitkv {

using namespace gpu_worker;

namespace gpu_worker {

Status CheckItemCrcs(ItemCheck& c) {
  std::sort(c.frags.begin(), c.frags.end(), [](const FragCrc& a, const FragCrc& b) {
    return std::tie(a.segment, a.offset) < std::tie(b.segment, b.offset);
  });
  size_t f = 0;
  for (uint32_t seg = 0; seg < c.segments.size(); ++seg) {
    uint32_t crc = 0;
    uint64_t covered = 0;
    for (; f < c.frags.size() && c.frags[f].segment == seg; ++f) {
      if (c.frags[f].offset != covered) break;
      crc = covered == 0 ? c.frags[f].crc : Crc32cCombine(crc, c.frags[f].crc, c.frags[f].bytes);
      covered += c.frags[f].bytes;
    }
    if (covered != c.segments[seg].size) {
      return Status::Internal("GPU verification covered " + std::to_string(covered) + " of " +
                              std::to_string(c.segments[seg].size) + " bytes of slot " +
                              std::to_string(seg));
    }
    ORBITKV_RETURN_IF_ERROR(CheckSegmentCrc(*c.header, seg, crc));
  }
  return Status::OK();
}

}  // namespace gpu_worker

// ---- the loop ------------------------------------------------------------------

// How long a busy worker sleeps between polls of its slots: every slot armed,
// only as a safety net (the host functions wake it); otherwise the old poll.
static constexpr auto kArmedWait = std::chrono::milliseconds(2);
static constexpr auto kPollInterval = std::chrono::microseconds(20);

void SsdGpuWorker::Impl::Arm(Slot& s) {
  s.armed = o.device->HostFuncAsync([this] { Wake(); }, *s.stream).ok();
}

void SsdGpuWorker::Impl::Wake() {
  {
    MutexLock l(mu);
    woken = true;
  }
  cv.NotifyAll();
}

void SsdGpuWorker::Impl::Loop() {
  SetThreadName("okv-cufile");
  while (true) {
    Callbacks cbs;
    std::vector<Status> failures;
    bool progress = false;
    for (Slot& s : slots) progress |= PollSlot(s, &cbs, &failures);
    for (Slot& s : slots) {
      if (s.phase != Slot::Phase::kFree || !TakeBatch(s)) continue;
      if (s.is_write) {
        StartWrite(s, &failures);
      } else {
        StartRead(s, &failures);
      }
      progress = true;
    }
    if (!cbs.empty() || !failures.empty()) {
      for (auto& cb : cbs) cb();
      if (o.on_io_failure) {
        for (const Status& f : failures) o.on_io_failure(f);
      }
      continue;
    }
    const bool idle = busy.load() == 0;
    bool armed = true;
    for (const Slot& s : slots) armed &= s.phase == Slot::Phase::kFree || s.armed;
    MutexLock l(mu);
    if (closing && idle) break;
    if (idle) {
      while (!closing && (pending.empty() || arena_blocked) && writes.empty()) cv.Wait(mu);
      continue;
    }
    // Busy: sleep until a slot's stream wakes the thread, new work arrives
    // (SubmitRead and the lanes notify cv) or the wait runs out. A wake that
    // came while the slots were polled is kept in `woken`: no poll is missed.
    if (!progress && !woken) {
      if (armed) {
        cv.WaitFor(mu, kArmedWait);
      } else {
        cv.WaitFor(mu, kPollInterval);
      }
    }
    woken = false;
  }
}

bool SsdGpuWorker::Impl::TakeBatch(Slot& s) {
  bool write_inflight = false;
  for (const Slot& t : slots) write_inflight |= t.phase != Slot::Phase::kFree && t.is_write;
  MutexLock l(mu);
  const bool can_write = !writes.empty() && !write_inflight && !closing;
  const bool can_read = !pending.empty() && !closing;
  if (can_write && (!can_read || reads_since_write >= o.reads_before_write)) {
    reads_since_write = 0;
    s.is_write = true;
    s.write = std::move(writes.front());
    writes.pop_front();
    ++write_submissions;
    return true;
  }
  if (!can_read) return false;
  s.is_write = false;
  s.pieces.clear();
  uint64_t bytes = 0, header_bytes = 0, frags = 0;
  while (!pending.empty() && bytes + pending.front().length <= o.slot_bytes &&
         s.pieces.size() < max_reads &&
         header_bytes + pending.front().header_need() <= kVerifyHeaderBytes &&
         frags + pending.front().frags.size() <= kVerifyMaxFrags) {
    Piece& head = pending.front();
    ItemCheck& c = head.job->check[head.item];
    if (c.encoded && c.input == 0) {
      // An encoded object's first piece takes its arena range; none free:
      // the queue waits for the decode lane to give one back.
      std::optional<gpu::DevPtr> at = decode->TryTake(head.job->req.items[head.item].ref.length);
      if (!at) {
        arena_blocked = true;
        break;
      }
      c.input = *at;
    }
    bytes += pending.front().length;
    header_bytes += pending.front().header_need();
    frags += pending.front().frags.size();
    ++pending.front().job->pieces_submitted[pending.front().item];
    s.pieces.push_back(std::move(pending.front()));
    pending.pop_front();
  }
  if (s.pieces.empty()) return false;  // the head waits for arena space
  if (!writes.empty()) ++reads_since_write;
  ++read_submissions;
  return true;
}

// ---- starting batches (worker thread, mu released) -------------------------------

void SsdGpuWorker::Impl::StartRead(Slot& s, std::vector<Status>* failures) {
  // Pieces adjacent in one file become one read of at most 4 MiB (io/coalesce.h);
  // each read lands in staging right after the previous one.
  std::vector<ReadRange> ranges;
  for (const Piece& p : s.pieces) ranges.push_back(p.file);
  s.reads.clear();
  std::vector<bool> placed(s.pieces.size(), false);
  uint64_t at = 0;
  for (const CoalescedRead& c : CoalesceReads(ranges, kAlign, kMaxReadBytes)) {
    BatchRead r;
    r.file = {c.file, c.offset, c.length};
    r.staging_offset = at;
    r.pieces = c.members;
    for (size_t m : c.members) {
      // A piece split over several reads starts in its first one; the rest follow it.
      if (!placed[m]) s.pieces[m].staging_offset = at + (s.pieces[m].file.offset - c.offset);
      placed[m] = true;
    }
    at += c.length;
    s.reads.push_back(std::move(r));
  }
  s.submitted = o.clock->Now();
  Status refused;
  for (size_t i = 0; i < s.reads.size(); ++i) {
    BatchRead& r = s.reads[i];
    if (!refused.ok()) {
      r.status = refused;
      continue;
    }
    gpu::AsyncIo& io = s.ios[i];
    io.size = r.file.length;
    io.file_offset = static_cast<off_t>(r.file.offset);
    io.buf_offset = static_cast<off_t>(r.staging_offset);
    io.bytes_done = 0;
    Status st = o.device->ReadAsync(*o.files[r.file.file], s.base, &io, *s.stream);
    if (!st.ok()) {
      refused = st.WithContext("cuFileReadAsync refused (partial submission)");
      r.status = refused;
      failures->push_back(refused);
    }
  }
  BeginIo(s, failures);
}

void SsdGpuWorker::Impl::StartWrite(Slot& s, std::vector<Status>* failures) {
  std::shared_ptr<WriteJobState> w = s.write;
  s.pieces.clear();
  s.reads.clear();
  const uint64_t c = w->next;
  const uint64_t len = std::min(o.slot_bytes, w->ref.length - c);
  s.write_len = len;
  s.submitted = o.clock->Now();
  std::vector<gpu::CopyOp> ops;
  auto add = [&](uint64_t obj_off, uint64_t bytes, gpu::DevPtr src) {
    const uint64_t lo = std::max(obj_off, c), hi = std::min(obj_off + bytes, c + len);
    if (lo < hi) ops.push_back({s.base + (lo - c), src + (lo - obj_off), hi - lo});
  };
  add(0, w->req.header_bytes, reinterpret_cast<gpu::DevPtr>(w->req.header));
  for (const GatherSpan& g : w->req.gather) add(g.object_offset, g.bytes, g.src);
  Status st = o.device->MemsetAsync(s.base, 0, len, *s.stream);
  if (st.ok() && !ops.empty()) st = o.device->CopyAsync(ops, *s.stream);
  const ReadRange file = SsdStore::FileRange(w->ref, c, len);
  gpu::AsyncIo& io = s.ios[0];
  io.size = len;
  io.file_offset = static_cast<off_t>(file.offset);
  io.buf_offset = 0;
  io.bytes_done = 0;
  if (st.ok()) st = o.device->WriteAsync(*o.files[file.file], s.base, &io, *s.stream);
  BatchRead r;
  r.file = file;
  r.status = st.ok() ? Status::OK() : st.WithContext("cuFileWriteAsync refused");
  s.reads.push_back(std::move(r));
  if (!st.ok()) failures->push_back(s.reads.back().status);
  BeginIo(s, failures);
}

void SsdGpuWorker::Impl::BeginIo(Slot& s, std::vector<Status>* failures) {
  s.phase = Slot::Phase::kIo;
  s.armed = false;
  busy.fetch_add(1);
  o.metrics.inflight_batches->Add(1);
  if (Status st = o.device->Record(*s.io_event, *s.stream); st.ok()) {
    Arm(s);
  } else {
    // Nothing can be known about the submitted work: fail it all, then
    // drain the stream before the slot is reused.
    for (BatchRead& r : s.reads) {
      if (r.status.ok()) r.status = st.WithContext("recording the cuFile completion event");
    }
    failures->push_back(st);
    o.device->Synchronize(*s.stream).IgnoreError("draining after a failed record");
  }
}

// ---- completions (worker thread) ------------------------------------------------

void SsdGpuWorker::Impl::FreeSlot(Slot& s) {
  s.phase = Slot::Phase::kFree;
  s.pieces.clear();
  s.reads.clear();
  s.piece_status.clear();
  s.write.reset();
  busy.fetch_sub(1);
  o.metrics.inflight_batches->Sub(1);
}

bool SsdGpuWorker::Impl::PollSlot(Slot& s, Callbacks* cbs, std::vector<Status>* failures) {
  switch (s.phase) {
    case Slot::Phase::kFree:
      return false;
    case Slot::Phase::kIo: {
      Result<bool> ready = o.device->Poll(*s.io_event);
      if (ready.ok() && !*ready) return false;
      return FinishIo(s, std::move(ready), cbs, failures);
    }
    case Slot::Phase::kVerify: {
      Result<bool> ready = o.device->Poll(*s.scatter_event);
      if (ready.ok() && !*ready) return false;
      return ScatterVerified(s, std::move(ready));
    }
    case Slot::Phase::kScatter: {
      Result<bool> ready = o.device->Poll(*s.scatter_event);
      if (ready.ok() && !*ready) return false;
      {
        MutexLock l(mu);
        for (size_t i = 0; i < s.pieces.size(); ++i) {
          const Piece& p = s.pieces[i];
          Status st = s.piece_status[i];
          if (st.ok() && !ready.ok()) st = ready.status().WithContext("scatter into engine pages");
          PieceDone(p.job, p.item, st, cbs);
        }
      }
      o.metrics.read_seconds->Observe(ToSeconds(o.clock->Now() - s.submitted));
      FreeSlot(s);
      return true;
    }
  }
  return false;
}

// The I/O event completed (or failed): every completed byte count is checked
// before anything is scattered or published.
bool SsdGpuWorker::Impl::FinishIo(Slot& s, Result<bool> ready, Callbacks* cbs,
                                  std::vector<Status>* failures) {
  for (size_t i = 0; i < s.reads.size(); ++i) {
    BatchRead& r = s.reads[i];
    if (!r.status.ok()) {  // refused at submission (already reported)
      if (!s.is_write) o.metrics.read_failures->Inc();
      continue;
    }
    if (!ready.ok()) {
      r.status = ready.status().WithContext("cuFile completion");
    } else if (s.ios[i].bytes_done != static_cast<ssize_t>(r.file.length)) {
      const ssize_t n = s.ios[i].bytes_done;
      r.status = Status::IOError(
          std::string(s.is_write ? "cuFileWriteAsync" : "cuFileReadAsync") + " of shard " +
              std::to_string(r.file.file) + " [" + std::to_string(r.file.offset) + ", +" +
              std::to_string(r.file.length) + ") " +
              (n < 0 ? "failed: " + std::to_string(n) : "was short: " + std::to_string(n)),
          n < 0 ? static_cast<int>(-n) : 0);
    }
    if (!r.status.ok()) {
      failures->push_back(r.status);
      if (!s.is_write) o.metrics.read_failures->Inc();
    } else {
      (s.is_write ? o.metrics.write_bytes : o.metrics.read_bytes)->Inc(r.file.length);
    }
  }
  if (s.is_write) return FinishWriteChunk(s, cbs);
  StartVerify(s);
  return true;
}

// After the verification results arrived: fails the pieces of objects whose
// header or CRCs did not match, then enqueues the scatter of the good ones.
bool SsdGpuWorker::Impl::ScatterVerified(Slot& s, Result<bool> ready) {
  if (!s.checked) TakeVerifyResults(s, ready.ok() ? Status::OK() : ready.status());
  // A later piece waits until its object's first piece (in this or an
  // earlier batch, which completes without waiting on this one) was checked.
  for (const Piece& p : s.pieces) {
    if (!p.job->check[p.item].header_known) return false;
  }
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    const Piece& p = s.pieces[i];
    Status& ps = s.piece_status[i];
    if (!ps.ok()) continue;
    ItemCheck& c = p.job->check[p.item];
    if (!c.header) {
      ps = c.header_status;
      continue;
    }
    if (c.encoded) continue;  // checked in the decode lane, once assembled
    if (!c.crc_done && c.pieces_checked == p.job->pieces_total[p.item]) {
      c.crc_done = true;
      c.crc_status = CheckItemCrcs(c);
    }
    if (c.crc_done && !c.crc_status.ok()) ps = c.crc_status;
  }
  std::vector<gpu::CopyOp> ops;
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    const Piece& p = s.pieces[i];
    if (!s.piece_status[i].ok()) continue;
    const ItemCheck& c = p.job->check[p.item];
    if (c.encoded) {  // assembled in its arena range, at its place in the object
      ops.push_back({c.input + p.offset, s.base + p.staging_offset, p.length});
      continue;
    }
    for (const ScatterSpan& sp : p.job->req.items[p.item].scatter) {
      const uint64_t lo = std::max(sp.object_offset, p.offset);
      const uint64_t hi = std::min(sp.object_offset + sp.bytes, p.offset + p.length);
      if (lo < hi) {
        ops.push_back({sp.dst + (lo - sp.object_offset),
                       s.base + p.staging_offset + (lo - p.offset), hi - lo});
      }
    }
  }
  Status st;
  if (!ops.empty()) st = o.device->CopyAsync(ops, *s.stream);
  if (st.ok()) st = o.device->Record(*s.scatter_event, *s.stream);
  if (st.ok()) {
    Arm(s);
  } else {
    s.armed = false;
    o.device->Synchronize(*s.stream).IgnoreError("draining after a failed scatter");
    for (Status& ps : s.piece_status) {
      if (ps.ok()) ps = st.WithContext("scatter into engine pages");
    }
  }
  s.phase = Slot::Phase::kScatter;
  return true;
}

// After a read batch's I/O: enqueues the header copies and the CRC32C kernel
// of every piece that was read in full, then the scatter event.
void SsdGpuWorker::Impl::StartVerify(Slot& s) {
  s.piece_status.assign(s.pieces.size(), Status::OK());
  for (const BatchRead& r : s.reads) {
    for (size_t m : r.pieces) {
      if (!r.status.ok() && s.piece_status[m].ok()) s.piece_status[m] = r.status;
    }
  }
  std::vector<gpu::CopyOp> headers;
  std::vector<gpu::CrcOp> crcs;
  uint64_t host_at = 0;
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    Piece& p = s.pieces[i];
    if (!s.piece_status[i].ok()) continue;
    const ItemCheck& c = p.job->check[p.item];
    if (p.offset == 0) {
      p.host_offset = host_at;
      headers.push_back({reinterpret_cast<gpu::DevPtr>(s.host + host_at), s.base + p.staging_offset,
                         c.header_bytes});
      host_at += c.header_bytes;
    }
    p.frag_begin = crcs.size();
    for (const FragCrc& f : p.frags) {
      const uint64_t in_piece = c.segments[f.segment].offset + f.offset - p.offset;
      crcs.push_back({s.base + p.staging_offset + in_piece, f.bytes});
    }
  }
  Status st;
  if (!headers.empty()) st = o.device->CopyAsync(headers, *s.stream);
  if (st.ok() && !crcs.empty()) st = o.device->Crc32cAsync(crcs, CrcResults(s), *s.stream);
  if (st.ok()) st = o.device->Record(*s.scatter_event, *s.stream);
  if (st.ok()) {
    Arm(s);
  } else {
    s.armed = false;
    o.device->Synchronize(*s.stream).IgnoreError("draining after a failed verification");
    for (Status& ps : s.piece_status) {
      if (ps.ok()) ps = st.WithContext("verifying GPU staging");
    }
  }
  s.checked = false;
  s.phase = Slot::Phase::kVerify;
}

// The verification results of a batch (once): headers parsed and matched for
// first pieces, fragment CRCs recorded for pieces read in full.
void SsdGpuWorker::Impl::TakeVerifyResults(Slot& s, const Status& event) {
  s.checked = true;
  const uint32_t* results = CrcResults(s);
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    const Piece& p = s.pieces[i];
    Status& ps = s.piece_status[i];
    if (ps.ok() && !event.ok()) ps = event.WithContext("verifying GPU staging");
    ItemCheck& c = p.job->check[p.item];
    const GpuReadItem& item = p.job->req.items[p.item];
    if (p.offset == 0) {
      c.header_known = true;
      if (!ps.ok()) {
        c.header_status = ps;
      } else {
        Result<ParsedHeader> h =
            ParseObjectHeader({s.host + p.host_offset, c.header_bytes}, item.ref.object_size);
        Status m = h.ok() ? CheckObjectMatches(*h, item.id, item.slot_bytes) : h.status();
        const ObjectCodec want = item.codec.object_codec();
        if (m.ok() && (h->codec != want.id || h->codec_version != want.version)) {
          // Never a frame scattered as raw bytes, nor decoded as another codec.
          m = Status::Corruption("object of codec " + std::to_string(h->codec) + " version " +
                                 std::to_string(h->codec_version) + " where codec " +
                                 std::to_string(want.id) + " version " +
                                 std::to_string(want.version) + " was expected");
        }
        if (m.ok()) {
          c.header = std::move(h).value();
        } else {
          c.header_status = m.WithContext("cuFile read of shard " + std::to_string(p.file.file) +
                                          " extent at " + std::to_string(item.ref.offset));
        }
      }
    }
    if (!ps.ok()) continue;
    for (size_t f = 0; f < p.frags.size(); ++f) {
      FragCrc done = p.frags[f];
      done.crc = results[p.frag_begin + f];
      c.frags.push_back(done);
    }
    ++c.pieces_checked;
  }
}

bool SsdGpuWorker::Impl::FinishWriteChunk(Slot& s, Callbacks* cbs) {
  std::shared_ptr<WriteJobState> w = s.write;
  const Status st = s.reads.empty() ? Status::OK() : s.reads[0].status;
  const uint64_t len = s.write_len;
  w->busy_seconds += ToSeconds(o.clock->Now() - s.submitted);
  FreeSlot(s);
  if (!st.ok()) {
    o.metrics.write_failures->Inc();
    o.store->Abort(w->ref, st);
    o.metrics.write_seconds->Observe(w->busy_seconds);
    MutexLock l(mu);
    WriteDone(w, st, cbs);
    return true;
  }
  w->next += len;
  if (w->next < w->ref.length) {
    bool closed = false;
    {
      MutexLock l(mu);
      closed = closing;
      if (!closed) writes.push_front(w);  // its next chunk waits for the next write opportunity
    }
    if (closed) {
      Status c = Status::Cancelled("SSD worker closed before the write finished");
      o.store->Abort(w->ref, c);
      MutexLock l(mu);
      WriteDone(w, c, cbs);
    }
    return true;
  }
  o.metrics.write_seconds->Observe(w->busy_seconds);
  Status p = o.store->Publish(w->ref);
  MutexLock l(mu);
  if (!p.ok()) {
    WriteDone(w, p, cbs);
  } else {
    WriteDone(w, w->ref, cbs);
  }
  return true;
}

}  // namespace orbitkv
