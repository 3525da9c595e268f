// Manager: the cache service. Owns the DRAM tier, the SSD store and the lanes
// that move bytes between them and engine pages; implements the cache API for
// sessions (one per client connection) and their instances.
//
// Threads: any number of session threads call in concurrently. Publish and
// DRAM restores copy on the caller's thread. SSD work runs on lanes: the
// writeback lane (io_uring, bounded queue; a full queue drops the SSD copy and
// counts it), the host-reader lane (io_uring reads into pinned DRAM scratch,
// bounded queue) and the SSD host-restore lane (copies read objects into
// engine pages, then releases leases and scratch). A reaper expires queries,
// lease interests and stale assemblies.
//
// CUDA instances ("cuda:N") register IPC handles; their pages are mapped and
// every copy runs on the instance's H2D/D2H streams with an event per job.
// With cuFile selected (ssd_backend.h) their SSD reads and complete-group
// writes go through a lazily created per-instance SsdGpuWorker; an I/O or
// buffer failure under auto stops new cuFile admission until restart and
// counts orbitkv_ssd_backend_fallbacks_total once.
//
// Ownership: a query pins its DRAM sources and leases its SSD extents until it
// is restored, released, expires, or its session ends. A restore owns what it
// took from its query until every block completes; cancelling before
// submission releases them at once, after submission at completion.
// UnregisterInstance and CloseSession wait for in-flight work of the instance
// before unmapping its memory.
//
// Parts (src/manager/, each with its own state and lock): Instance and
// SessionTable (sessions, namespaces, instances), QueryTable (queries, budget,
// restore registry), RestoreRec (one restore), ReadStaging, Writeback, the SSD
// routes (ssd_route.h: UringRoute, CufileRoute over SsdGpuWorker) and the
// LaneCounter that Drain waits on; manager_impl.h joins them.
//
// Lock order (a lock may be taken while holding only locks above it; none of
// them is held across a call into another part unless listed here):
//   1. SessionTable::mu_ -> Instance::mu_ (Acquire's hold)
//   2. QueryTable::mu_ -> RestoreRec::mu_ (Take), then the DRAM pool's and the
//      SSD catalog's own locks (pins, leases)
//   3. CufileRoute::mu_, then a worker cell's mu (held across worker creation)
//   4. Instance::h2d_mu_ / d2h_mu_ (held across one job's enqueue, never a wait)
//   5. ReadStaging::mu_, Writeback::room_mu_ (each may call into the pool)
//   6. leaves: SsdGpuWorker::Impl::mu (never held across a CUDA or cuFile
//      call), DirectWrites, LaneCounter, WorkQueue, metrics
// Members say which lock guards them (GUARDED_BY) and clang checks it
// (-Werror=thread-safety; scripts/thread_safety_check.py in CI).
// RestoreRec::Finish takes RestoreRec::mu_, releases it, then QueryTable::mu_;
// completion callbacks (RestoreDone, worker item_done) run with no lock held.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/platform.h"
#include "io/file_system.h"
#include "io/io_engine.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/clock.h"
#include "orbitkv/metrics.h"
#include "orbitkv/options.h"
#include "orbitkv/status.h"
#include "store/dram_cache.h"

namespace orbitkv {

struct ManagerConfig {
  ManagerOptions options;
  uint64_t query_budget_bytes = 0;  // 0: the pool size
  bool lock_memory = true;
  uint32_t writeback_queue = 4096;  // objects waiting for SSD writeback
  uint32_t read_queue = 1024;       // SSD read jobs waiting for a reader
  // Pinned staging for SSD reads, taken from pool_size (0: the options'
  // ReadStagingBytes(), --ssd-read-staging).
  uint64_t read_staging_bytes = 0;
  // How long a Publish waits for writeback to free pool room before dropping.
  std::chrono::milliseconds publish_wait{2000};
  // CUDA pages: Publish computes the segment CRCs on the GPU (off: on the CPU
  // from the pool copy, as host pages always do; tests compare the two).
  bool publish_gpu_crc = true;
  // Registers the pinned pool and staging with the GPU runtime (src/gpu's
  // HostMemoryHooks); empty on hosts without CUDA.
  std::function<Status(void*, uint64_t)> register_host_memory;
  std::function<void(void*)> unregister_host_memory;
  // The GPU storage tier's CUDA and cuFile seam (gpu/platform.h); null on a
  // host without CUDA, where "cuda:N" instances are refused with
  // gpu_unavailable and auto selects io_uring. Not owned; outlives the Manager.
  gpu::Platform* gpu = nullptr;
  std::string gpu_unavailable = "this build has no CUDA";
  // Per instance/device SSD worker geometry (spec: two 4 MiB slots, eight writes).
  uint64_t gpu_slot_bytes = 4u << 20;
  uint32_t gpu_max_write_jobs = 8;
  FileSystem* fs = FileSystem::Default();
  Clock* clock = Clock::Real();
  MetricsRegistry* metrics = nullptr;    // required
  IoFaultInjector* io_faults = nullptr;  // tests
};

class Manager {
 public:
  static Result<std::unique_ptr<Manager>> Create(const ManagerConfig& config);
  // Closes every session (draining their work) and stops the lanes.
  ~Manager();

  SessionId OpenSession(int peer_pid);
  // Unregisters the session's instances (waiting for their in-flight work) and
  // releases every query, lease, pin and reservation the session held.
  void CloseSession(SessionId session);

  // Host instances pass one sealed memfd per layout region (ownership moves in).
  Result<InstanceId> RegisterInstance(SessionId session, const RegisterRequest& request,
                                      std::vector<int> region_fds);
  Status UnregisterInstance(SessionId session, InstanceId instance);

  Result<PublishResult> Publish(SessionId session, const PublishRequest& request);
  Result<QueryResult> Query(SessionId session, const QueryRequest& request);
  // Releases a query's remaining sources (the engine chose not to restore them).
  Status ReleaseQuery(SessionId session, QueryId query);

  using RestoreDone = std::function<void(Result<RestoreResult>)>;
  // Starts a restore; `done` runs exactly once, possibly before this returns
  // (DRAM-only restores complete inline) or later on a lane thread.
  Result<RestoreId> StartRestore(SessionId session, const RestoreRequest& request,
                                 RestoreDone done);
  // Blocking convenience wrapper around StartRestore.
  Result<RestoreResult> Restore(SessionId session, const RestoreRequest& request);
  // Cancels what has not been submitted; submitted blocks complete normally.
  // Returns how many blocks were released (0: everything was already submitted).
  Result<uint32_t> CancelRestore(SessionId session, RestoreId restore);

  // Queues SSD objects for warm-up into DRAM; returns how many were queued.
  Result<uint32_t> Prepare(SessionId session, const PrepareRequest& request);

  // Drops every object of the namespace of the session's instance
  // `request.instance`, in DRAM and on SSD; other namespaces are untouched.
  // What queries and restores hold (DRAM pins, SSD leases) stays readable until
  // released, then its memory and extents are reclaimed. Not atomic with work
  // in flight in the namespace: an object being published, written back or
  // promoted into DRAM while it runs may stay cached (SGLang clears an idle
  // cache). NotFound for an instance the session does not hold.
  Result<ClearNamespaceResult> ClearNamespace(SessionId session,
                                              const ClearNamespaceRequest& request);

  // Waits until the SSD writeback and read lanes are idle (tests, demo).
  void Drain();

  // The SSD backend selected at startup, with its reason (for logs).
  std::string ssd_backend() const;

  struct Gauges {
    uint64_t sessions = 0, instances = 0, queries = 0, restores_inflight = 0;
    uint64_t query_budget_used = 0;
    DramStats dram;
    uint64_t ssd_leases = 0, ssd_pinned_bytes = 0, ssd_reservations = 0;
    // Restores' SSD read jobs queued or reading, both routes (the io_uring
    // writeback yields to them: --writeback-yield-ms).
    uint64_t ssd_restore_reads = 0;
    // GPU storage tier.
    bool cufile_selected = false;   // startup selection (cache-wide)
    bool cufile_admitting = false;  // false after an auto fallback
    uint64_t gpu_workers = 0, gpu_write_jobs = 0, gpu_inflight_batches = 0;
    uint64_t gpu_ipc_mappings = 0;
  };
  Gauges gauges() const;

 private:
  struct Impl;
  explicit Manager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orbitkv
