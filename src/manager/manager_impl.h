// Manager::Impl: the parts a Manager is made of and the little that joins
// them. Each part owns its state and its lock (the lock order is in
// manager.h); the operation files (manager.cc: sessions and instances,
// publish.cc, query.cc: query and prepare, restore.cc) are the Manager's
// methods over these parts. Constant after Create except where a part says.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "manager/cufile_route.h"
#include "manager/dram_gpu_decode.h"
#include "manager/host_copier.h"
#include "manager/lane.h"
#include "manager/manager.h"
#include "manager/manager_metrics.h"
#include "manager/query_table.h"
#include "manager/read_staging.h"
#include "manager/restore.h"
#include "manager/session_table.h"
#include "manager/storage_codec.h"
#include "manager/uring_route.h"
#include "manager/writeback.h"
#include "store/dram_cache.h"
#include "store/ssd_store.h"

namespace orbitkv {

struct Manager::Impl {
  ManagerConfig config;
  ManagerMetrics m;
  std::unique_ptr<CodecMetrics> codec_metrics;
  // Restores into host pages copy through it (instances point here): declared
  // before the routes and sessions, so it outlives them.
  std::unique_ptr<HostCopier> host_copier;
  std::unique_ptr<CodecBudget> codec_budget;             // the GPU codec path's reservations
  codec::CodecId default_codec = codec::CodecId::kNone;  // --storage-codec
  std::atomic<uint64_t> next_id{1};  // sessions, namespaces, instances, queries, restores

  std::unique_ptr<DramCache> dram;
  // SSD tier (all null without --ssd-cache-path).
  std::unique_ptr<SsdStore> ssd;
  std::unique_ptr<ReadStaging> staging;
  std::string backend_reason;
  LaneCounter lanes;  // writeback, host reads, cuFile reads: what Drain waits for
  // Restores' io_uring read jobs queued or reading (the writeback lanes yield
  // to them: writeback.h).
  LaneCounter restore_reads;
  std::unique_ptr<CufileSeries> cufile_series;
  std::unique_ptr<Writeback> writeback;
  // io_uring restores' GPU CRC32C check (null without a GPU platform or with
  // --ssd-uring-gpu-staging 0); outlives `uring`.
  std::unique_ptr<GpuCheckedCopy> uring_checked;
  std::unique_ptr<UringRoute> uring;
  std::unique_ptr<CufileRoute> cufile;  // only when cuFile was selected
  // Encoded DRAM entries into CUDA pages (null without a GPU platform).
  std::unique_ptr<DramGpuDecode> dram_decode;

  std::unique_ptr<SessionTable> sessions;
  std::unique_ptr<QueryTable> queries;
  RestoreEnv restore_env;

  std::thread reaper;
  Mutex reaper_mu;
  CondVar reaper_cv;
  bool stopping GUARDED_BY(reaper_mu) = false;
  uint64_t collector = 0;

  // The route choice: cuFile for the instances it serves (unless it declines
  // under auto), io_uring for the rest.
  void SubmitSsd(const std::shared_ptr<RestoreRec>& r, const Instance& inst,
                 std::vector<RestoreBlock> blocks);
  // A hybrid query's pieces of storage groups this instance does not hold
  // (another instance of the namespace holds them) fail with InvalidArgument
  // and release their sources; the rest stay in `taken`.
  void RefuseForeignGroups(const std::shared_ptr<RestoreRec>& r, const Instance& inst,
                           QueryTable::Taken& taken);
  void ReaperLoop() EXCLUDES(reaper_mu);
  void RegisterCollector();
};

}  // namespace orbitkv
