// UringRoute: the io_uring SSD route (SsdRoute), and the warm-up reads of
// Prepare. A restore's SSD blocks go to the bounded host-reader queue (full:
// the blocks fail with ResourceExhausted, counted); a reader thread (one
// io_uring engine each) splits them into runs (ReadStaging::Runs: at most
// --ssd-read-run and half the read staging), reads each run into pinned
// staging, and hands it to the SSD host-restore
// lane, which checks every object and copies it into the engine's pages
// (memcpy; for CUDA pages, GpuCheckedCopy: the run H2D into device staging,
// its CRC32C there on the GPU, then only the objects that match scattered
// into the pages; the blocks it declines take one H2D job each after a CPU
// CRC32C), promotes it to DRAM under
// admission "all", then releases the staging and the lease and finishes the
// block. A full host-restore lane copies on the reader's thread. Prepare
// reads go through the same readers and insert checked objects into DRAM.
// An object either finds damaged is dropped from the store (DropIfCorrupt).
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/io_engine.h"
#include "manager/gpu_checked_copy.h"
#include "manager/lane.h"
#include "manager/read_staging.h"
#include "manager/ssd_route.h"
#include "manager/work_queue.h"
#include "orbitkv/metrics.h"
#include "store/dram_cache.h"
#include "store/ssd_store.h"

namespace orbitkv {

class UringRoute final : public SsdRoute {
 public:
  struct Options {
    SsdStore* ssd = nullptr;
    DramCache* dram = nullptr;
    ReadStaging* staging = nullptr;
    LaneCounter* lanes = nullptr;
    // A restore's read job holds a token of this from its queueing until its
    // last read completed (the writeback lanes yield to it); optional.
    LaneCounter* restore_reads = nullptr;
    std::vector<std::unique_ptr<IoEngine>> engines;  // one per reader thread
    size_t queue = 1024;                             // read jobs waiting for a reader
    bool promote = true;                             // restored objects enter DRAM (admission all)
    Counter* bytes_restore = nullptr;                // restore_ssd_uring
    Counter* bytes_prepare = nullptr;
    Counter* queue_full = nullptr;
    Counter* cancelled = nullptr;
    Histogram* cost = nullptr;  // optional: ORBITKV_COST_OBSERVATIONS
    // Children of `cost`, per block of the copy lane: the header checks and
    // payload CRC32C with the copy list (ObjectToPages), and the promotion
    // into DRAM (a memcpy of the object).
    Histogram* cost_verify = nullptr;
    Histogram* cost_promote = nullptr;
    Histogram* cost_gpu_check = nullptr;  // per run: GpuCheckedCopy::Restore, waits included
    // CUDA pages: the payload CRC32C on the GPU, before the bytes are
    // scattered into the pages (null: on the CPU, as for host pages).
    GpuCheckedCopy* checked = nullptr;
    Counter* crc_cpu_bytes = nullptr;  // CUDA pages checked on the CPU (optional)
  };
  explicit UringRoute(Options options);
  ~UringRoute() override { Close(); }

  std::vector<RestoreBlock> Submit(const std::shared_ptr<RestoreRec>& restore,
                                   std::vector<RestoreBlock> blocks) override;  // declines none
  uint32_t Cancel(const std::shared_ptr<RestoreRec>& restore) override;
  void Close() override;

  // Queues warm-up reads of leased SSD blocks of one group (`slot_bytes`: its
  // shape). False when the queue is full: the leases were cancelled, counted.
  bool Prepare(std::vector<QueryBlock> blocks, std::vector<uint64_t> slot_bytes);

 private:
  struct ReadJob {
    std::shared_ptr<RestoreRec> restore;  // restore read, or
    std::vector<RestoreBlock> blocks;
    std::vector<QueryBlock> prepare;           // prepare (warm-up) reads
    std::vector<uint64_t> prepare_slot_bytes;  // prepare: the group's shape
    LaneToken token;
    LaneToken reading;  // a restore's: held until its reads completed (restore_reads)
  };
  struct CopyJob {
    std::shared_ptr<RestoreRec> restore;
    std::vector<RestoreBlock> blocks;
    std::vector<Status> read_status;
    LaneToken token;
  };
  void ReadLane(size_t worker, ReadJob& job);
  void PrepareReads(IoEngine& io, ReadJob& job);
  void CopyLane(CopyJob& job);
  // Submits the leases of srcs and reads them into staging (scratch[i]).
  // Returns a status per block; a block whose submission or staging failed
  // has its lease released and set to 0. `restore` (null for warm-up reads)
  // gets the I/O stamps of its timeline.
  std::vector<Status> ReadIntoStaging(IoEngine& io, std::span<QueryBlock*> srcs,
                                      std::span<DramView*> scratch, RestoreRec* restore);

  Options o_;
  // Readers feed the host-restore lane: it is declared first, closed last.
  std::unique_ptr<WorkQueue<CopyJob>> host_restore_;
  std::unique_ptr<WorkQueue<ReadJob>> reader_;
};

}  // namespace orbitkv
