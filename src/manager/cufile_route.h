// CufileRoute: the GPU storage tier's route (SsdRoute) for CUDA instances, and
// its complete-group writes. It owns the startup backend selection (cuFile
// file registrations), cuFile admission and its auto fallback, and the lazy
// per-instance SsdGpuWorker (created on first use, retired when the instance
// unregisters). Reads: every SSD block of a restore goes to the worker, which
// reads into GPU staging, verifies and scatters into the pages (an encoded
// namespace's blocks: assembled in the worker's GPU decode lane, CRC-checked
// and decoded on the GPU into the pages; a block whose extent is larger than
// the lane's arena, whose pages are not 16-byte aligned, or of an instance
// whose lane the codec budget cannot hold, is declined to the host reader,
// io_uring, which decodes on the CPU); each lease
// stays held until its block's scatter completed; a block the worker finds
// damaged (Corruption) has its extent dropped from the store. Under auto, a cuFile buffer
// or I/O failure stops new cuFile admission until restart (counted once in
// orbitkv_ssd_backend_fallbacks_total) and a worker that cannot be created
// declines the blocks (io_uring serves them); an explicit route never
// declines. Writes of encoded namespaces: complete groups are encoded on the
// worker's GPU encode lane (gpu_encode_lane.h) and written through cuFile,
// with a compressed DRAM copy (SubmitEncodedWrite); what that path declines
// is written back through io_uring, encoded on the CPU. Thread-safe; mu_ is a leaf lock, a cell's
// mu is held across the worker's creation only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "manager/instance.h"
#include "manager/lane.h"
#include "manager/read_staging.h"
#include "manager/ssd_backend.h"
#include "manager/ssd_gpu_worker.h"
#include "manager/ssd_route.h"
#include "orbitkv/metrics.h"
#include "orbitkv/options.h"
#include "store/dram_cache.h"
#include "store/ssd_store.h"

namespace orbitkv {

// The spec's cuFile series, per device (device="cuda:N"). They exist from
// startup: per device where there are CUDA devices, else one unlabelled
// series each. Thread-safe.
class CufileSeries {
 public:
  CufileSeries(MetricsRegistry* metrics, gpu::Platform* gpu);
  GpuWorkerMetrics Device(int ordinal) EXCLUDES(mu_);
  // orbitkv_ssd_gpu_encode_fallbacks_total{device, reason}: encoded groups
  // the GPU encode path did not take (or gave back), written back through
  // io_uring with CPU encoding instead. `reason` is one of kEncodeFallbacks.
  // (ordinal -1: the unlabelled series of a host without CUDA devices.)
  Counter* EncodeFallback(int ordinal, std::string_view reason);
  static constexpr std::string_view kEncodeFallbacks[] = {
      "fragmented",  // not every slot in one Publish
      "oversized",   // more slots than the encoder's batch, or larger than the arena
      "unaligned",   // a slot not whole in its page, or a page not 16-byte aligned
      "no_lane",     // no encode lane: no frame encoder, or the codec budget is held
      "lane_full",   // the instance's GPU write jobs are all admitted
      "arena_full",  // the encode arena has no room now
      "failed",      // admitted, then the encode, its pinned header or its write failed
  };

 private:
  GpuWorkerMetrics Make(int ordinal, const Labels& dev) REQUIRES(mu_);
  MetricsRegistry* const metrics_;
  Mutex mu_;
  std::map<int, GpuWorkerMetrics> devices_ GUARDED_BY(mu_);
};

// Complete-group cuFile writes of one Publish call, waited for before it returns.
class DirectWrites {
 public:
  struct Done {
    ObjectId id;
    bool dram_copy = false;
    DramView scratch;  // the header's pinned staging when there is no DRAM copy
    Status status;
    // GPU-encoded writes (SubmitEncodedWrite): the object's encoded size, and
    // the index of its key in the Publish (a failed one without a DRAM copy
    // goes again through the CPU path). The DRAM copy, if any, is encoded.
    bool encoded = false;
    uint64_t object_size = 0;
    size_t index = 0;
    // A GPU-encoded write reported as soon as its object is encoded and its
    // encoded DRAM copy sealed (status OK, dram_copy): the pages are free, and
    // the disk write goes on after the Publish, its end reported through
    // Options::detached_write_done.
    bool detached = false;
  };
  void Add() EXCLUDES(mu_);
  void Cancel() EXCLUDES(mu_);  // an Add whose write was not submitted
  void Finished(Done d) EXCLUDES(mu_);
  // Waits until every added write finished; returns them.
  std::vector<Done> Wait() EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar cv_;
  int outstanding_ GUARDED_BY(mu_) = 0;
  std::vector<Done> done_ GUARDED_BY(mu_);
};

class CufileRoute final : public SsdRoute {
 public:
  struct Options {
    SsdBackend backend = SsdBackend::kAuto;
    std::optional<SsdReadPath> read_path;
    SsdBackendSelection selection;  // cufile: the registered shard files
    SsdStore* ssd = nullptr;
    ReadStaging* staging = nullptr;
    LaneCounter* lanes = nullptr;
    // A restore's cuFile read job holds a token of this until its last item
    // is done (the io_uring writeback lanes yield to it); optional.
    LaneCounter* restore_reads = nullptr;
    CufileSeries* series = nullptr;
    uint64_t slot_bytes = 4u << 20;
    uint32_t max_write_jobs = 8;
    Clock* clock = Clock::Real();
    Counter* backend_fallbacks = nullptr;
    Counter* write_fallbacks = nullptr;  // eight GPU writes admitted: D2H + io_uring
    Counter* bytes_restore = nullptr;    // restore_ssd_cufile
    Counter* cancelled = nullptr;
    Histogram* cost = nullptr;  // optional: ORBITKV_COST_OBSERVATIONS
    // Encoded reads: each worker's GPU decode lane holds codec_budget_bytes
    // (arena + decoder scratch) of `codec_budget` (null or 0: encoded
    // namespaces read through io_uring).
    CodecBudget* codec_budget = nullptr;
    uint64_t codec_budget_bytes = 0;
    const CodecMetrics* codec_metrics = nullptr;
    // Encoded writes: each worker's GPU encode lane holds encode_budget_bytes
    // of `codec_budget` (0: encoded namespaces write back through io_uring);
    // the compressed DRAM copy goes into `dram`.
    uint64_t encode_budget_bytes = 0;
    DramCache* dram = nullptr;
    // Set: GPU-encoded writes with a DRAM copy detach from their Publish
    // (Done::detached) and this gets each one's end (the encoded object size
    // and the write's status; Cancelled at Close) on a worker thread: it ends
    // the DRAM entry's writeback or sends it to io_uring. Unset: the Publish
    // waits for the write. Manager::Drain waits for detached writes.
    std::function<void(const ObjectId& id, uint64_t object_size, Status status)>
        detached_write_done;
  };
  // REQUIRES: options.selection.cufile.
  explicit CufileRoute(Options options);
  ~CufileRoute() override { Close(); }

  bool admitting() const { return admit_.load(); }
  // Whether the instance's SSD reads / complete-group writes go through cuFile now.
  bool ServesReads(const Instance& inst) const;
  bool ServesWrites(const Instance& inst) const;
  // Whether the complete groups of the instance's encoded namespace are
  // offered to the GPU encode path now (SubmitEncodedWrite may still decline).
  bool ServesEncodedWrites(const Instance& inst) const;

  std::vector<RestoreBlock> Submit(const std::shared_ptr<RestoreRec>& restore,
                                   std::vector<RestoreBlock> blocks) override;
  uint32_t Cancel(const std::shared_ptr<RestoreRec>& restore) override;
  void Close() override;  // retires every worker

  // Hands one sealed complete group to the instance's worker, written from its
  // page. The header comes from the DRAM copy when there is one, else from
  // read staging (payload CRCs computed on the GPU). False when cuFile did not
  // take it (no worker, no staging, admission full: counted, or no extent):
  // the caller falls back. `dw` gets its completion.
  bool SubmitWrite(Instance& inst, const GroupLayout& g, const ObjectShape& shape,
                   const ObjectId& id, uint64_t page, const uint8_t* dram_header,
                   const std::shared_ptr<DirectWrites>& dw);

  // A complete group of an encoded namespace: encoded on the GPU from its
  // page into the worker's encode arena, put into the DRAM pool encoded where
  // it has room (writeback-pending until the write finished; admission as
  // for any sealed entry), and written through cuFile. False, counted by
  // reason (orbitkv_ssd_gpu_encode_fallbacks_total), when the path declines
  // it: the caller takes the CPU path. `index` names the key in the caller's
  // request (Done::index). `dw` gets its completion: once the object is
  // encoded and its DRAM copy sealed when Options::detached_write_done is
  // set (Done::detached), else once its write finished.
  bool SubmitEncodedWrite(Instance& inst, const GroupLayout& g, const ObjectShape& shape,
                          const ObjectId& id, uint64_t page, size_t index,
                          const std::shared_ptr<DirectWrites>& dw);
  // Counts an encoded group of the instance that the GPU encode path did not
  // get (CufileSeries::kEncodeFallbacks).
  void NoteEncodeFallback(const Instance& inst, std::string_view reason);

  // Drains and frees the instance's worker. REQUIRES: no operation holds the instance.
  void Retire(InstanceId instance) EXCLUDES(mu_);

  struct Stats {
    uint64_t workers = 0, write_jobs = 0, inflight_batches = 0;
  };
  Stats stats() const EXCLUDES(mu_);

 private:
  struct Cell {
    Mutex mu;
    std::unique_ptr<SsdGpuWorker> worker GUARDED_BY(mu);
  };
  // The instance's worker, created on first use.
  Result<SsdGpuWorker*> Worker(Instance& inst) EXCLUDES(mu_);
  // Whether the GPU decode lane (arena `capacity`) takes an encoded block:
  // its extent fits and every slot decodes whole into a 16-byte aligned page.
  bool EncodedFitsGpu(const Instance& inst, const RestoreBlock& b, uint64_t capacity) const;
  // A cuFile buffer or I/O failure: under auto, stops new cuFile work.
  void OnFailure(const Status& st);
  bool explicit_read() const;

  Options o_;
  std::atomic<bool> admit_{true};
  mutable Mutex mu_;
  std::unordered_map<InstanceId, std::shared_ptr<Cell>> cells_ GUARDED_BY(mu_);
};

}  // namespace orbitkv
