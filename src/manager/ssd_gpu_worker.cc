#include "manager/ssd_gpu_worker.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/crc32c.h"
#include "store/object_format.h"
#include "store/shard_file.h"
#include "store/ssd_store.h"

namespace orbitkv {
namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kMaxReadBytes = 4u << 20;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Per batch, the pinned host memory that verification uses: object headers
// copied out of staging, then one CRC32C result per segment fragment.
constexpr uint64_t kVerifyHeaderBytes = 256u << 10;
constexpr uint64_t kVerifyMaxFrags = 8192;
static_assert(kObjectMaxHeaderBytes <= kVerifyHeaderBytes);
static_assert(kMaxSlotsPerGroup <= kVerifyMaxFrags);

// The part of segment `segment` ([offset, +bytes) of it) that one piece holds,
// and its CRC32C once the GPU computed it.
struct FragCrc {
  uint32_t segment = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Verification state of one item (guarded by the worker's mu).
struct ItemCheck {
  std::vector<SegmentPos> segments;  // where a raw object of the item's shape has them
  uint64_t header_bytes = 0;
  bool header_known = false;           // its first piece was checked (or failed)
  std::optional<ParsedHeader> header;  // set when the header matched
  Status header_status;                // why not, otherwise
  uint32_t pieces_checked = 0;         // pieces whose fragment CRCs are in `frags`
  std::vector<FragCrc> frags;
  bool crc_done = false;
  Status crc_status;
};

struct ReadJobState {
  SsdGpuWorker::JobId id = 0;
  GpuReadRequest req;
  std::vector<uint32_t> pieces_total, pieces_done, pieces_submitted;
  std::vector<Status> status;
  std::vector<bool> reported;
  std::vector<ItemCheck> check;
  size_t items_left = 0;
};

// A slot-sized (or smaller) part of one item's extent.
struct Piece {
  std::shared_ptr<ReadJobState> job;
  size_t item = 0;
  uint64_t offset = 0;  // within the extent
  uint64_t length = 0;
  uint32_t shard = 0;
  uint64_t file_offset = 0;
  std::vector<FragCrc> frags;   // the segment bytes it holds (crc unset)
  uint64_t staging_offset = 0;  // in the slot, once batched
  size_t read = 0;              // index of the read that carries it
  uint64_t host_offset = 0;     // where its header copy lands (first piece)
  size_t frag_begin = 0;        // its CRC results in the slot's host memory
  uint64_t header_need() const { return offset == 0 ? job->check[item].header_bytes : 0; }
};

// The CRC32C of each segment from an item's fragments, against its header.
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

struct WriteJobState {
  GpuWriteRequest req;
  ExtentRef ref;
  uint64_t next = 0;  // next chunk's offset in the extent
  // Submission to completion of its chunks so far; waits for a slot (before
  // the first chunk and between chunks) are not counted (the spec's
  // orbitkv_ssd_cufile_write_seconds).
  double busy_seconds = 0;
};

struct BatchRead {
  uint32_t shard = 0;
  uint64_t file_offset = 0, staging_offset = 0, length = 0;
  Status status;
};

struct Slot {
  gpu::DevPtr base = 0;
  bool registered = false;
  std::unique_ptr<gpu::Stream> stream;
  bool stream_registered = false;
  std::unique_ptr<gpu::Event> io_event, scatter_event;
  std::unique_ptr<gpu::AsyncIo[]> ios;  // address-stable, one per read of a batch
  uint8_t* host = nullptr;              // pinned: header copies, then CRC results (kVerify*)
  // kVerify: headers and CRCs of the batch on their way to `host` (the
  // scatter event marks their arrival); kScatter: the scatter is running.
  enum class Phase { kFree, kIo, kVerify, kScatter } phase = Phase::kFree;
  bool is_write = false;
  bool checked = false;              // kVerify: the host results were taken in
  std::vector<Status> piece_status;  // per piece, from kVerify on
  std::vector<Piece> pieces;
  std::vector<BatchRead> reads;
  std::shared_ptr<WriteJobState> write;
  uint64_t write_len = 0;
  std::chrono::steady_clock::time_point submitted;
};

}  // namespace

struct SsdGpuWorker::Impl {
  GpuWorkerOptions o;
  Slot slots[2];
  size_t max_reads = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Piece> pending;                                    // guarded by mu
  std::deque<std::shared_ptr<WriteJobState>> writes;            // guarded by mu
  std::unordered_map<JobId, std::weak_ptr<ReadJobState>> jobs;  // guarded by mu
  uint32_t write_jobs = 0;                                      // guarded by mu
  uint32_t reads_since_write = 0;                               // guarded by mu
  uint64_t read_submissions = 0, write_submissions = 0;         // guarded by mu
  JobId next_job = 1;                                           // guarded by mu
  bool closing = false;                                         // guarded by mu
  std::thread thread;
  std::once_flag joined;

  using Callbacks = std::vector<std::function<void()>>;

  int busy() const {
    int n = 0;
    for (const Slot& s : slots) n += s.phase != Slot::Phase::kFree;
    return n;
  }

  // REQUIRES: mu. Marks one piece of an item finished; queues item_done when
  // it was the last one.
  void PieceDone(const std::shared_ptr<ReadJobState>& job, size_t item, const Status& st,
                 Callbacks* cbs) {
    if (!st.ok() && job->status[item].ok()) job->status[item] = st;
    if (++job->pieces_done[item] < job->pieces_total[item] || job->reported[item]) return;
    job->reported[item] = true;
    if (--job->items_left == 0) jobs.erase(job->id);
    Status s = job->status[item];
    cbs->push_back([job, item, s] { job->req.item_done(item, s); });
  }

  // REQUIRES: mu. Removes queued pieces for which pred(piece) holds; each is
  // finished with `why`.
  template <typename Pred>
  uint32_t DropPending(Pred pred, const Status& why, Callbacks* cbs) {
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

  void WriteDone(const std::shared_ptr<WriteJobState>& w, Result<ExtentRef> r, Callbacks* cbs) {
    --write_jobs;
    auto done = std::move(w->req.done);
    cbs->push_back([done = std::move(done), r = std::move(r)]() mutable { done(std::move(r)); });
  }

  // ---- starting batches (REQUIRES: mu) --------------------------------------

  void StartRead(Slot& s, std::vector<Status>* failures) {
    s.pieces.clear();
    s.reads.clear();
    uint64_t bytes = 0, header_bytes = 0, frags = 0;
    while (!pending.empty() && bytes + pending.front().length <= o.slot_bytes &&
           s.pieces.size() < max_reads &&
           header_bytes + pending.front().header_need() <= kVerifyHeaderBytes &&
           frags + pending.front().frags.size() <= kVerifyMaxFrags) {
      bytes += pending.front().length;
      header_bytes += pending.front().header_need();
      frags += pending.front().frags.size();
      s.pieces.push_back(std::move(pending.front()));
      pending.pop_front();
    }
    std::sort(s.pieces.begin(), s.pieces.end(), [](const Piece& a, const Piece& b) {
      return std::tie(a.shard, a.file_offset) < std::tie(b.shard, b.file_offset);
    });
    uint64_t at = 0;
    for (Piece& p : s.pieces) {
      p.staging_offset = at;
      at += p.length;
      ++p.job->pieces_submitted[p.item];
      BatchRead* last = s.reads.empty() ? nullptr : &s.reads.back();
      if (last && last->shard == p.shard && last->file_offset + last->length == p.file_offset &&
          last->length + p.length <= kMaxReadBytes) {
        last->length += p.length;
      } else {
        s.reads.push_back({p.shard, p.file_offset, p.staging_offset, p.length, Status::OK()});
      }
      p.read = s.reads.size() - 1;
    }
    s.is_write = false;
    s.submitted = std::chrono::steady_clock::now();
    Status refused;
    for (size_t i = 0; i < s.reads.size(); ++i) {
      BatchRead& r = s.reads[i];
      if (!refused.ok()) {
        r.status = refused;
        continue;
      }
      gpu::AsyncIo& io = s.ios[i];
      io.size = r.length;
      io.file_offset = static_cast<off_t>(r.file_offset);
      io.buf_offset = static_cast<off_t>(r.staging_offset);
      io.bytes_done = 0;
      Status st = o.device->ReadAsync(*o.files[r.shard], s.base, &io, *s.stream);
      if (!st.ok()) {
        refused = st.WithContext("cuFileReadAsync refused (partial submission)");
        r.status = refused;
        failures->push_back(refused);
      }
    }
    ++read_submissions;
    BeginIo(s, failures);
  }

  void StartWrite(Slot& s, std::vector<Status>* failures) {
    std::shared_ptr<WriteJobState> w = std::move(writes.front());
    writes.pop_front();
    s.is_write = true;
    s.write = w;
    s.pieces.clear();
    s.reads.clear();
    const uint64_t c = w->next;
    const uint64_t len = std::min(o.slot_bytes, w->ref.length - c);
    s.write_len = len;
    s.submitted = std::chrono::steady_clock::now();
    std::vector<gpu::CopyOp> ops;
    auto add = [&](uint64_t obj_off, uint64_t bytes, gpu::DevPtr src) {
      const uint64_t lo = std::max(obj_off, c), hi = std::min(obj_off + bytes, c + len);
      if (lo < hi) ops.push_back({s.base + (lo - c), src + (lo - obj_off), hi - lo});
    };
    add(0, w->req.header_bytes, reinterpret_cast<gpu::DevPtr>(w->req.header));
    for (const GatherSpan& g : w->req.gather) add(g.object_offset, g.bytes, g.src);
    Status st = o.device->MemsetAsync(s.base, 0, len, *s.stream);
    if (st.ok() && !ops.empty()) st = o.device->CopyAsync(ops, *s.stream);
    gpu::AsyncIo& io = s.ios[0];
    io.size = len;
    io.file_offset = static_cast<off_t>(ShardSet::FileOffset(w->ref.offset) + c);
    io.buf_offset = 0;
    io.bytes_done = 0;
    if (st.ok()) st = o.device->WriteAsync(*o.files[w->ref.shard], s.base, &io, *s.stream);
    s.reads.push_back({w->ref.shard, static_cast<uint64_t>(io.file_offset), 0, len,
                       st.ok() ? Status::OK() : st.WithContext("cuFileWriteAsync refused")});
    if (!st.ok()) failures->push_back(s.reads.back().status);
    ++write_submissions;
    BeginIo(s, failures);
  }

  void BeginIo(Slot& s, std::vector<Status>* failures) {
    s.phase = Slot::Phase::kIo;
    o.metrics.inflight_batches->Add(1);
    if (Status st = o.device->Record(*s.io_event, *s.stream); !st.ok()) {
      // Nothing can be known about the submitted work: fail it all, then
      // drain the stream before the slot is reused.
      for (BatchRead& r : s.reads) {
        if (r.status.ok()) r.status = st.WithContext("recording the cuFile completion event");
      }
      failures->push_back(st);
      o.device->Synchronize(*s.stream).IgnoreError("draining after a failed record");
    }
  }

  // ---- completions (REQUIRES: mu) -------------------------------------------

  void FreeSlot(Slot& s) {
    s.phase = Slot::Phase::kFree;
    s.pieces.clear();
    s.reads.clear();
    s.piece_status.clear();
    s.write.reset();
    o.metrics.inflight_batches->Sub(1);
  }

  // Returns true when the slot made progress.
  bool PollSlot(Slot& s, Callbacks* cbs, std::vector<Status>* failures) {
    if (s.phase == Slot::Phase::kIo) {
      Result<bool> ready = o.device->Poll(*s.io_event);
      if (ready.ok() && !*ready) return false;
      // Check every completed byte count before anything is scattered or published.
      for (size_t i = 0; i < s.reads.size(); ++i) {
        BatchRead& r = s.reads[i];
        if (!r.status.ok()) {  // refused at submission (already reported)
          if (!s.is_write) o.metrics.read_failures->Inc();
          continue;
        }
        if (!ready.ok()) {
          r.status = ready.status().WithContext("cuFile completion");
        } else if (s.ios[i].bytes_done != static_cast<ssize_t>(r.length)) {
          const ssize_t n = s.ios[i].bytes_done;
          r.status = Status::IOError(
              std::string(s.is_write ? "cuFileWriteAsync" : "cuFileReadAsync") + " of shard " +
                  std::to_string(r.shard) + " [" + std::to_string(r.file_offset) + ", +" +
                  std::to_string(r.length) + ") " +
                  (n < 0 ? "failed: " + std::to_string(n) : "was short: " + std::to_string(n)),
              n < 0 ? static_cast<int>(-n) : 0);
        }
        if (!r.status.ok()) {
          failures->push_back(r.status);
          if (!s.is_write) o.metrics.read_failures->Inc();
        } else {
          (s.is_write ? o.metrics.write_bytes : o.metrics.read_bytes)->Inc(r.length);
        }
      }
      if (s.is_write) return FinishWriteChunk(s, cbs);
      StartVerify(s);
      return true;
    }
    if (s.phase == Slot::Phase::kVerify) {
      Result<bool> ready = o.device->Poll(*s.scatter_event);
      if (ready.ok() && !*ready) return false;
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
      if (!st.ok()) {
        o.device->Synchronize(*s.stream).IgnoreError("draining after a failed scatter");
        for (Status& ps : s.piece_status) {
          if (ps.ok()) ps = st.WithContext("scatter into engine pages");
        }
      }
      s.phase = Slot::Phase::kScatter;
      return true;
    }
    if (s.phase == Slot::Phase::kScatter) {
      Result<bool> ready = o.device->Poll(*s.scatter_event);
      if (ready.ok() && !*ready) return false;
      for (size_t i = 0; i < s.pieces.size(); ++i) {
        const Piece& p = s.pieces[i];
        Status st = s.piece_status[i];
        if (st.ok() && !ready.ok()) st = ready.status().WithContext("scatter into engine pages");
        PieceDone(p.job, p.item, st, cbs);
      }
      o.metrics.read_seconds->Observe(SecondsSince(s.submitted));
      FreeSlot(s);
      return true;
    }
    return false;
  }

  // After a read batch's I/O: enqueues the header copies and the CRC32C
  // kernel of every piece that was read in full, then the scatter event.
  void StartVerify(Slot& s) {
    s.piece_status.clear();
    for (const Piece& p : s.pieces) s.piece_status.push_back(s.reads[p.read].status);
    std::vector<gpu::CopyOp> headers;
    std::vector<gpu::CrcOp> crcs;
    uint64_t host_at = 0;
    for (size_t i = 0; i < s.pieces.size(); ++i) {
      Piece& p = s.pieces[i];
      if (!s.piece_status[i].ok()) continue;
      const ItemCheck& c = p.job->check[p.item];
      if (p.offset == 0) {
        p.host_offset = host_at;
        headers.push_back({reinterpret_cast<gpu::DevPtr>(s.host + host_at),
                           s.base + p.staging_offset, c.header_bytes});
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
    if (st.ok() && !crcs.empty()) {
      st = o.device->Crc32cAsync(crcs, CrcResults(s), *s.stream);
    }
    if (st.ok()) st = o.device->Record(*s.scatter_event, *s.stream);
    if (!st.ok()) {
      o.device->Synchronize(*s.stream).IgnoreError("draining after a failed verification");
      for (Status& ps : s.piece_status) {
        if (ps.ok()) ps = st.WithContext("verifying GPU staging");
      }
    }
    s.checked = false;
    s.phase = Slot::Phase::kVerify;
  }

  static uint32_t* CrcResults(Slot& s) {
    return reinterpret_cast<uint32_t*>(s.host + kVerifyHeaderBytes);
  }

  // The verification results of a batch (once): headers parsed and matched
  // for first pieces, fragment CRCs recorded for pieces read in full.
  void TakeVerifyResults(Slot& s, const Status& event) {
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
          if (m.ok()) {
            c.header = std::move(h).value();
          } else {
            c.header_status = m.WithContext("cuFile read of shard " + std::to_string(p.shard) +
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

  bool FinishWriteChunk(Slot& s, Callbacks* cbs) {
    std::shared_ptr<WriteJobState> w = s.write;
    const Status st = s.reads.empty() ? Status::OK() : s.reads[0].status;
    const uint64_t len = s.write_len;
    w->busy_seconds += SecondsSince(s.submitted);
    FreeSlot(s);
    if (!st.ok()) {
      o.metrics.write_failures->Inc();
      o.store->Abort(w->ref, st);
      o.metrics.write_seconds->Observe(w->busy_seconds);
      WriteDone(w, st, cbs);
      return true;
    }
    w->next += len;
    if (w->next < w->ref.length) {
      if (closing) {
        Status c = Status::Cancelled("SSD worker closed before the write finished");
        o.store->Abort(w->ref, c);
        WriteDone(w, c, cbs);
      } else {
        writes.push_front(w);  // its next chunk waits for the next write opportunity
      }
      return true;
    }
    o.metrics.write_seconds->Observe(w->busy_seconds);
    if (Status p = o.store->Publish(w->ref); !p.ok()) {
      WriteDone(w, p, cbs);
    } else {
      WriteDone(w, w->ref, cbs);
    }
    return true;
  }

  // ---- the loop ---------------------------------------------------------------

  void Loop() {
    std::unique_lock<std::mutex> l(mu);
    while (true) {
      Callbacks cbs;
      std::vector<Status> failures;
      bool progress = false;
      for (Slot& s : slots) progress |= PollSlot(s, &cbs, &failures);
      for (Slot& s : slots) {
        if (s.phase != Slot::Phase::kFree) continue;
        bool write_inflight = false;
        for (const Slot& t : slots) write_inflight |= t.phase != Slot::Phase::kFree && t.is_write;
        const bool can_write = !writes.empty() && !write_inflight && !closing;
        const bool can_read = !pending.empty() && !closing;
        if (can_write && (!can_read || reads_since_write >= o.reads_before_write)) {
          reads_since_write = 0;
          StartWrite(s, &failures);
        } else if (can_read) {
          if (!writes.empty()) ++reads_since_write;
          StartRead(s, &failures);
        } else {
          continue;
        }
        progress = true;
      }
      if (!cbs.empty() || !failures.empty()) {
        l.unlock();
        for (auto& cb : cbs) cb();
        if (o.on_io_failure) {
          for (const Status& f : failures) o.on_io_failure(f);
        }
        l.lock();
        continue;
      }
      if (closing && busy() == 0) break;
      if (busy() == 0) {
        cv.wait(l, [&] { return closing || !pending.empty() || !writes.empty(); });
      } else if (!progress) {
        l.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        l.lock();
      }
    }
  }

  void Release() {
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
};

Result<std::unique_ptr<SsdGpuWorker>> SsdGpuWorker::Create(GpuWorkerOptions options) {
  if (!options.device || !options.store || options.files.empty() ||
      options.slot_bytes % kAlign != 0 || options.slot_bytes == 0) {
    return Status::InvalidArgument(
        "SsdGpuWorker: device, store, files and an aligned slot size "
        "are required");
  }
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
        ObjectSize(it.slot_bytes) > it.ref.object_size) {
      return Status::InvalidArgument("read of shard " + std::to_string(it.ref.shard) +
                                     ": the item's slot sizes do not describe its " +
                                     std::to_string(it.ref.object_size) + "-byte object");
    }
    if (ObjectHeaderSize(static_cast<uint32_t>(it.slot_bytes.size())) > m.o.slot_bytes) {
      return Status::InvalidArgument("an object header of " + std::to_string(it.slot_bytes.size()) +
                                     " slots does not fit a staging slot");
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
    c.segments = SegmentLayout(job->req.items[i].slot_bytes);
    c.header_bytes = ObjectHeaderSize(static_cast<uint32_t>(c.segments.size()));
    for (uint64_t off = 0; off < ref.length; off += m.o.slot_bytes) {
      Piece p;
      p.job = job;
      p.item = i;
      p.offset = off;
      p.length = std::min(m.o.slot_bytes, ref.length - off);
      p.shard = ref.shard;
      p.file_offset = ShardSet::FileOffset(ref.offset) + off;
      for (uint32_t k = 0; k < c.segments.size(); ++k) {
        const uint64_t lo = std::max(c.segments[k].offset, off);
        const uint64_t hi = std::min(c.segments[k].offset + c.segments[k].size, off + p.length);
        if (lo < hi) p.frags.push_back({k, lo - c.segments[k].offset, hi - lo, 0});
      }
      pieces.push_back(std::move(p));
      ++job->pieces_total[i];
    }
  }
  {
    std::lock_guard<std::mutex> l(m.mu);
    if (m.closing) return Status::Cancelled("SSD worker is closing");
    job->id = m.next_job++;
    m.jobs[job->id] = job;
    for (Piece& p : pieces) m.pending.push_back(std::move(p));
  }
  m.cv.notify_all();
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
  {
    std::lock_guard<std::mutex> l(m.mu);
    if (m.closing) return Status::Cancelled("SSD worker is closing");
    if (m.write_jobs >= m.o.max_write_jobs) {
      return Status::ResourceExhausted(std::to_string(m.o.max_write_jobs) +
                                       " GPU write jobs are already admitted");
    }
    ++m.write_jobs;  // the permit; held until the job's done runs
  }
  auto w = std::make_shared<WriteJobState>();
  Result<ExtentRef> ref = m.o.store->Reserve(req.key, req.object_size);
  std::lock_guard<std::mutex> l(m.mu);
  if (!ref.ok() || m.closing) {
    --m.write_jobs;
    if (ref.ok()) {
      Status c = Status::Cancelled("SSD worker is closing");
      m.o.store->Abort(*ref, c);
      return c;
    }
    return ref.status();
  }
  w->ref = *ref;
  w->req = std::move(req);
  m.writes.push_back(std::move(w));
  m.cv.notify_all();
  return Status::OK();
}

uint32_t SsdGpuWorker::CancelRead(JobId id) {
  Impl& m = *impl_;
  Impl::Callbacks cbs;
  uint32_t n = 0;
  {
    std::lock_guard<std::mutex> l(m.mu);
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
  Impl::Callbacks cbs;
  {
    std::lock_guard<std::mutex> l(m.mu);
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
  m.cv.notify_all();
  for (auto& cb : cbs) cb();
  std::call_once(m.joined, [&] {
    if (m.thread.joinable()) m.thread.join();
  });
}

GpuWorkerStats SsdGpuWorker::stats() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  GpuWorkerStats s;
  s.queued_reads = impl_->pending.size();
  s.write_jobs = impl_->write_jobs;
  s.inflight_batches = static_cast<uint32_t>(impl_->busy());
  s.read_submissions = impl_->read_submissions;
  s.write_submissions = impl_->write_submissions;
  return s;
}

}  // namespace orbitkv
