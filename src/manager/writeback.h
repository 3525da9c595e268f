// Writeback: the SSD writeback lane. Sealed DRAM objects are queued (bounded;
// a full queue drops the SSD copy and counts it), encoded on the lane's
// thread when their namespace has a storage codec (storage_codec.h: the SSD
// gets the encoded object; an encode failure drops the SSD copy, counted; the
// encoded bytes a lane holds are bounded by its share of --codec-budget),
// written in batches by one io_uring engine per lane thread, and leave
// writeback-pending in the pool. The DRAM entry stays raw, or, with
// encoded_dram_copies (--codec-dram-copy encoded), once its encoded object is
// on the SSD, that object replaces it in the pool where it is smaller and a
// free range holds it (DramCache::ReplaceSealed; counted by codec).
// Publishers that find the pool full of objects waiting for writeback wait
// here (bounded) for the lane to free room: WaitForRoom. Each queued object
// holds one LaneToken until its write finished.
// Restores first (restore_reads, yield): writeback shares the disk with the
// restores' reads, and a restore is an engine waiting (its time to first
// token), a write is not. While restore reads are queued or in flight, a lane
// waits before each write until they are done or `yield` passed, and then
// writes one object, not its whole batch; while a publisher waits for room
// (WaitForRoom), it neither waits nor splits its batch. The time lanes waited
// is counted (yield_seconds).
// Thread-safe; room_mu_ is taken with no other Manager lock held (the pool's
// lock nests inside it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "io/io_engine.h"
#include "manager/lane.h"
#include "manager/storage_codec.h"
#include "manager/work_queue.h"
#include "orbitkv/metrics.h"
#include "store/dram_cache.h"
#include "store/ssd_store.h"

namespace orbitkv {

class Writeback {
 public:
  struct Options {
    DramCache* dram = nullptr;
    SsdStore* ssd = nullptr;
    LaneCounter* lanes = nullptr;
    std::vector<std::unique_ptr<IoEngine>> engines;  // one per lane thread
    size_t queue = 4096;                             // objects waiting
    size_t batch = 1;                                // objects per engine submission
    Counter* bytes = nullptr;                        // written object bytes
    Counter* queue_full = nullptr;                   // objects dropped: queue full
    const CodecMetrics* codec_metrics = nullptr;     // required
    // --codec-budget, split between the lane threads: encoded output a lane
    // holds at once (one object past it at most: a larger one goes alone).
    uint64_t codec_budget = 256u << 20;
    // --codec-dram-copy encoded: written encoded objects replace their raw
    // DRAM entries.
    bool encoded_dram_copies = false;
    // Restores' SSD reads outstanding (one token per queued read job: the
    // io_uring route's); null or a zero yield: writeback never waits for them.
    LaneCounter* restore_reads = nullptr;
    std::chrono::milliseconds yield{0};  // --writeback-yield-ms
    Histogram* yield_seconds = nullptr;  // each wait; required with restore_reads
  };
  explicit Writeback(Options options);
  ~Writeback() { Close(); }

  // Queues a sealed, writeback-pending object of a namespace of `codec`; a
  // full queue finishes its writeback as failed (the DRAM copy stays) and
  // counts it.
  void Queue(const ObjectId& id, const NamespaceCodec& codec);
  // While `attempt` keeps failing with ResourceExhausted and objects wait for
  // writeback, waits for the lane to free room (until `deadline`) and retries.
  // Returns the last attempt's result.
  Result<DramView> WaitForRoom(Result<DramView> last,
                               std::chrono::steady_clock::time_point deadline,
                               const std::function<Result<DramView>()>& attempt) EXCLUDES(room_mu_);
  // Stops intake and waits for queued writes.
  void Close() { queue_->Close(); }

 private:
  struct Item {
    ObjectId id;
    NamespaceCodec codec;
    LaneToken token;
  };
  void Lane(size_t worker, std::vector<Item>& items) EXCLUDES(room_mu_);
  // Writes `writes` on the lane's engine, yielding to restore reads first
  // (above): a sub-batch at a time.
  void Write(IoEngine& io, std::span<SsdStore::ObjectWrite> writes) EXCLUDES(room_mu_);
  // `raw` (pinned for writeback) gives way to the encoded object `write` wrote.
  void KeepEncodedCopy(const DramView& raw, const SsdStore::ObjectWrite& write,
                       const NamespaceCodec& codec);

  Options o_;
  Mutex room_mu_;  // pairs the lane's "room freed" with WaitForRoom's check
  CondVar room_;
  std::atomic<int> room_waiters_{0};        // publishers inside WaitForRoom
  std::unique_ptr<WorkQueue<Item>> queue_;  // last: its threads use the rest
};

}  // namespace orbitkv
