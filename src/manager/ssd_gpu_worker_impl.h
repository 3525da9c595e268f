// SsdGpuWorker's internals (ssd_gpu_worker.h is the contract): the read jobs,
// pieces and write jobs that callers queue, and the two staging slots the
// worker thread drives. ssd_gpu_worker.cc holds the callers' side (submit,
// cancel, close, stats), ssd_gpu_worker_loop.cc the worker thread.
//
// Locking: mu guards the queues, the admission counts and each job's
// completion bookkeeping (ReadJobState's "guarded by mu" fields). The slots,
// each job's verification state (ItemCheck) and everything a batch holds are
// the worker thread's alone, so the thread calls CUDA and cuFile with mu
// released: SubmitRead, CancelRead and stats() never wait behind the device.
// Internal header: include only from the worker's own files.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "io/coalesce.h"
#include "manager/gpu_decode_lane.h"
#include "manager/gpu_encode_lane.h"
#include "manager/ssd_gpu_worker.h"
#include "store/object_format.h"

namespace orbitkv {
namespace gpu_worker {

inline constexpr uint64_t kAlign = 4096;
inline constexpr uint64_t kMaxReadBytes = 4u << 20;
// Per batch, the pinned host memory that verification uses: object headers
// copied out of staging, then one CRC32C result per segment fragment.
inline constexpr uint64_t kVerifyHeaderBytes = 256u << 10;
inline constexpr uint64_t kVerifyMaxFrags = 8192;
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

// Verification state of one item (worker thread only).
struct ItemCheck {
  // Encoded: no fragment CRCs (the segments' places come with the header);
  // the pieces are copied into `input`, the item's decode-lane arena range
  // (set under the worker's mu by TakeBatch, read under mu or on the worker
  // thread), and checked and decoded there once all arrived.
  bool encoded = false;
  gpu::DevPtr input = 0;
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

// The CRC32C of each segment from an item's fragments, against its header.
Status CheckItemCrcs(ItemCheck& c);

struct ReadJobState {
  SsdGpuWorker::JobId id = 0;
  GpuReadRequest req;                  // constant once queued
  std::vector<uint32_t> pieces_total;  // constant once queued
  // Guarded by the worker's mu.
  std::vector<uint32_t> pieces_done, pieces_submitted;
  std::vector<Status> status;
  std::vector<bool> reported;
  size_t items_left = 0;
  // Worker thread only.
  std::vector<ItemCheck> check;
};

// A slot-sized (or smaller) part of one item's extent.
struct Piece {
  std::shared_ptr<ReadJobState> job;
  size_t item = 0;
  uint64_t offset = 0;  // within the extent
  uint64_t length = 0;
  ReadRange file;               // where it lies: SsdStore::FileRange
  std::vector<FragCrc> frags;   // the segment bytes it holds (crc unset)
  uint64_t staging_offset = 0;  // in the slot, once batched
  uint64_t host_offset = 0;     // where its header copy lands (first piece)
  size_t frag_begin = 0;        // its CRC results in the slot's host memory
  uint64_t header_need() const { return offset == 0 ? job->check[item].header_bytes : 0; }
};

struct WriteJobState {
  GpuWriteRequest req;
  ExtentRef ref;
  uint64_t next = 0;  // next chunk's offset in the extent (worker thread)
  // Submission to completion of its chunks so far; waits for a slot (before
  // the first chunk and between chunks) are not counted (the spec's
  // orbitkv_ssd_cufile_write_seconds).
  double busy_seconds = 0;
};

struct BatchRead {
  ReadRange file;
  uint64_t staging_offset = 0;
  std::vector<size_t> pieces;  // the pieces it carries (indices into Slot::pieces)
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
  bool checked = false;  // kVerify: the host results were taken in
  // A host function queued on the stream after the slot's latest event will
  // wake the worker (Impl::Arm); false: the thread polls this slot instead.
  bool armed = false;
  std::vector<Status> piece_status;  // per piece, from kVerify on
  std::vector<Piece> pieces;
  std::vector<BatchRead> reads;
  std::shared_ptr<WriteJobState> write;
  uint64_t write_len = 0;
  Clock::TimePoint submitted;
};

using Callbacks = std::vector<std::function<void()>>;

}  // namespace gpu_worker

struct SsdGpuWorker::Impl {
  using Piece = gpu_worker::Piece;
  using ReadJobState = gpu_worker::ReadJobState;
  using WriteJobState = gpu_worker::WriteJobState;
  using Slot = gpu_worker::Slot;
  using Callbacks = gpu_worker::Callbacks;

  GpuWorkerOptions o;  // constant
  size_t max_reads = 0;
  // Worker thread only (and Create / the destructor, with no thread running).
  Slot slots[2];
  std::atomic<uint32_t> busy{0};  // slots not free (for stats)

  mutable Mutex mu;
  CondVar cv;
  std::deque<Piece> pending GUARDED_BY(mu);
  std::deque<std::shared_ptr<WriteJobState>> writes GUARDED_BY(mu);
  std::unordered_map<JobId, std::weak_ptr<ReadJobState>> jobs GUARDED_BY(mu);
  uint32_t write_jobs GUARDED_BY(mu) = 0;
  uint32_t reads_since_write GUARDED_BY(mu) = 0;
  uint64_t read_submissions GUARDED_BY(mu) = 0, write_submissions GUARDED_BY(mu) = 0;
  JobId next_job GUARDED_BY(mu) = 1;
  bool closing GUARDED_BY(mu) = false;
  // The queue's head needs a decode-lane range that is not free: the thread
  // sleeps until the lane gives one back (on_space) instead of polling.
  bool arena_blocked GUARDED_BY(mu) = false;
  // A slot's stream reached the host function queued after its latest event
  // (Arm): the thread polls its slots at once instead of sleeping.
  bool woken GUARDED_BY(mu) = false;
  std::thread thread;
  // EnableDecode's lane and outcome (set once under decode_mu; the lane is
  // used by the worker thread only for items submitted after it existed).
  Mutex decode_mu;
  std::unique_ptr<GpuDecodeLane> decode;
  std::optional<Result<uint64_t>> decode_outcome GUARDED_BY(decode_mu);
  // EnableEncode's lane and outcome (likewise, under decode_mu).
  std::unique_ptr<GpuEncodeLane> encode;
  std::optional<Result<uint64_t>> encode_outcome GUARDED_BY(decode_mu);
  std::once_flag joined;

  // ---- shared bookkeeping (ssd_gpu_worker.cc) --------------------------------
  // Marks one piece of an item finished; queues item_done when it was the last.
  void PieceDone(const std::shared_ptr<ReadJobState>& job, size_t item, const Status& st,
                 Callbacks* cbs) REQUIRES(mu);
  // Removes queued pieces for which pred(piece) holds, each finished with `why`;
  // returns how many items that reported.
  uint32_t DropPending(const std::function<bool(const Piece&)>& pred, const Status& why,
                       Callbacks* cbs) REQUIRES(mu);
  void WriteDone(const std::shared_ptr<WriteJobState>& w, Result<ExtentRef> r, Callbacks* cbs)
      REQUIRES(mu);
  // A write permit (max_write_jobs): ResourceExhausted when all are taken,
  // Cancelled while closing.
  Status TakePermit() EXCLUDES(mu);
  void ReturnPermit() EXCLUDES(mu);
  // Reserves the write's extent and queues it; the caller holds a permit,
  // which the write keeps (returned with its done) or, on an error, is returned.
  Status QueueWrite(GpuWriteRequest req) EXCLUDES(mu);
  // An encoded group's encode finished: on to its write (or its done).
  void Encoded(const std::shared_ptr<GpuEncodedWriteRequest>& req,
               Result<GpuEncodeLane::Encoded> e);
  void Release();  // frees the slots (no thread running)
  // The final report of an encoded item (`st` its status so far): OK items
  // go to the decode lane, whose done reports them; the rest give their arena
  // range back and report. Runs with mu released.
  void FinishEncoded(const std::shared_ptr<ReadJobState>& job, size_t item, Status st);

  // ---- the worker thread (ssd_gpu_worker_loop.cc) ------------------------------
  void Loop() EXCLUDES(mu);
  // Takes a batch for a free slot (under mu), or returns false.
  bool TakeBatch(Slot& s) EXCLUDES(mu);
  void StartRead(Slot& s, std::vector<Status>* failures);
  void StartWrite(Slot& s, std::vector<Status>* failures);
  void BeginIo(Slot& s, std::vector<Status>* failures);
  // Queues, after the event just recorded on the slot's stream, a host
  // function that sets `woken` and wakes the thread: a busy worker sleeps
  // until its GPU work is done instead of polling (issue 18: polling every
  // 20 us was most of the Manager's CPU on the cuFile route). Where it cannot
  // be queued, the slot is polled every kPollInterval.
  void Arm(Slot& s);
  void Wake() EXCLUDES(mu);
  void FreeSlot(Slot& s);
  // True when the slot made progress.
  bool PollSlot(Slot& s, Callbacks* cbs, std::vector<Status>* failures) EXCLUDES(mu);
  bool FinishIo(Slot& s, Result<bool> ready, Callbacks* cbs, std::vector<Status>* failures)
      EXCLUDES(mu);
  bool ScatterVerified(Slot& s, Result<bool> ready);
  void StartVerify(Slot& s);
  void TakeVerifyResults(Slot& s, const Status& event);
  bool FinishWriteChunk(Slot& s, Callbacks* cbs) EXCLUDES(mu);
  static uint32_t* CrcResults(Slot& s) {
    return reinterpret_cast<uint32_t*>(s.host + gpu_worker::kVerifyHeaderBytes);
  }
};

}  // namespace orbitkv
