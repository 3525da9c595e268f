// Manager: construction, teardown, sessions and instances, drain and gauges.
// Publish, Query/Prepare and restores are in publish.cc, query.cc, restore.cc.
#include "manager/manager.h"
#include "common/thread_name.h"

#include <algorithm>

#include "manager/manager_impl.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/object_format.h"

namespace orbitkv {

// ---- construction ----------------------------------------------------------

Result<std::unique_ptr<Manager>> Manager::Create(const ManagerConfig& config) {
  if (config.metrics == nullptr)
    return Status::InvalidArgument("ManagerConfig.metrics is required");
  ORBITKV_RETURN_IF_ERROR(config.options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const ManagerOptions& o = config.options;
  Result<codec::CodecId> default_codec = codec::ParseCodecName(o.storage_codec);
  if (!default_codec.ok()) return default_codec.status().WithContext("--storage-codec");
  impl->default_codec = *default_codec;
  const bool ssd_on = !o.ssd_cache_path.empty();
  const uint64_t pool = AlignDown(o.pool_size, 4096);
  const uint64_t staging = ssd_on ? AlignDown(config.read_staging_bytes ? config.read_staging_bytes
                                                                        : o.ReadStagingBytes(),
                                              4096)
                                  : 0;
  if (ssd_on && (staging < (64u << 10) || staging >= pool)) {
    return Status::InvalidArgument("--pool-size " + FormatByteSize(pool) +
                                   " leaves no room for SSD read staging of " +
                                   FormatByteSize(staging));
  }
  // The SSD cache opens before the pool is mapped and locked: a bad or foreign
  // cache file is refused at once, not after the pool (seconds to minutes for a
  // large one on a busy host) was faulted in.
  SsdBackendSelection backend;
  if (ssd_on) {
    SsdStoreOptions so;
    so.path = o.ssd_cache_path;
    so.capacity = o.ssd_cache_capacity;
    so.shards = o.ssd_shards;
    so.reserve_capacity = false;  // io_uring: logical sizing
    so.fs = config.fs;
    so.clock = config.clock;
    so.metrics = config.metrics;
    ORBITKV_ASSIGN_OR_RETURN(impl->ssd, SsdStore::Open(so));
    // Cache-wide: cuFile for every shard (then reserved up front) or io_uring.
    ORBITKV_ASSIGN_OR_RETURN(
        backend, SelectSsdBackend(o, config.gpu, config.gpu_unavailable, *impl->ssd, config.fs));
    impl->backend_reason = backend.reason;
    OKV_LOG_INFO("SSD backend: {}", backend.reason);
  }
  DramCacheOptions d;
  d.capacity = pool - staging;
  d.lock_memory = config.lock_memory;
  d.admission = o.admission_reuse ? AdmissionPolicy::kReuse : AdmissionPolicy::kAll;
  if (o.checkpoint_dram_percent < 100) {
    d.checkpoint_capacity = AlignDown((pool - staging) / 100 * o.checkpoint_dram_percent, 4096);
  }
  d.clock = config.clock;
  // With SSD on, a sealed object waits for writeback (never evicted before it).
  d.writeback_on_seal = ssd_on;
  d.on_arena = config.register_host_memory;
  d.on_arena_release = config.unregister_host_memory;
  // Fragments set their slots' payload CRCs; the last one seals the header.
  d.on_seal = [](std::span<uint8_t> object) { SealObjectHeader(object); };
  ORBITKV_ASSIGN_OR_RETURN(impl->dram, DramCache::Create(d));
  if (ssd_on) {
    DramCacheOptions st = d;
    st.checkpoint_capacity = UINT64_MAX;
    st.capacity = staging;
    st.writeback_on_seal = false;
    ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<DramCache> pool, DramCache::Create(st));
    impl->staging = std::make_unique<ReadStaging>(std::move(pool), o.ssd_read_run);
  }
  Impl& x = *impl;
  x.m = ManagerMetrics::Register(*config.metrics, ssd_on, o.cost_observations);
  x.codec_metrics = std::make_unique<CodecMetrics>(*config.metrics);
  x.host_copier = std::make_unique<HostCopier>(HostCopier::Options{
      .threads = o.host_copy_threads,
      .helped_bytes =
          config.metrics->GetCounter("orbitkv_host_copy_helped_bytes_total",
                                     "Bytes of restores into host pages copied by "
                                     "--host-copy-threads helpers, not the serving thread.")});
  x.codec_budget = std::make_unique<CodecBudget>(o.codec_budget, x.codec_metrics->budget_used);
  x.cufile_series = std::make_unique<CufileSeries>(config.metrics, config.gpu);
  if (ssd_on) {
    Writeback::Options w;
    UringRoute::Options r;
    for (uint32_t i = 0; i < o.ssd_io_workers; ++i) {
      ORBITKV_ASSIGN_OR_RETURN(auto we, CreateUringEngine({o.ssd_queue_depth, config.io_faults}));
      w.engines.push_back(std::move(we));
      ORBITKV_ASSIGN_OR_RETURN(auto re, CreateUringEngine({o.ssd_queue_depth, config.io_faults}));
      r.engines.push_back(std::move(re));
    }
    w.dram = x.dram.get();
    w.ssd = x.ssd.get();
    w.lanes = &x.lanes;
    w.queue = config.writeback_queue;
    w.batch = o.ssd_queue_depth / 2;  // a batch fills the queue depth (several chunks per object)
    w.bytes = x.m.bytes_writeback;
    w.queue_full = x.m.writeback_queue_full;
    w.codec_metrics = x.codec_metrics.get();
    w.codec_budget = o.codec_budget;
    w.encoded_dram_copies = o.codec_dram_copy_encoded;
    w.restore_reads = &x.restore_reads;
    w.yield = std::chrono::milliseconds(o.writeback_yield_ms);
    w.yield_seconds = x.m.writeback_yield_seconds;
    x.writeback = std::make_unique<Writeback>(std::move(w));
    r.ssd = x.ssd.get();
    r.dram = x.dram.get();
    r.staging = x.staging.get();
    r.lanes = &x.lanes;
    r.restore_reads = &x.restore_reads;
    r.queue = config.read_queue;
    r.promote = !o.admission_reuse;
    r.bytes_restore = x.m.bytes_restore_ssd;
    r.bytes_prepare = x.m.bytes_prepare;
    r.queue_full = x.m.read_queue_full;
    r.cancelled = x.m.restore_cancelled;
    r.cost = x.m.cost_uring;
    r.cost_verify = x.m.cost_uring_verify;
    r.cost_promote = x.m.cost_uring_promote;
    r.cost_gpu_check = x.m.cost_uring_gpu_check;
    r.crc_cpu_bytes = x.m.uring_crc_cpu_bytes;
    if (config.gpu != nullptr && o.ssd_uring_gpu_staging != 0) {
      GpuCheckedCopy::Options gc;
      gc.buffer_bytes = AlignDown(o.ssd_uring_gpu_staging / gc.buffers, 4096);
      gc.staging_bytes = x.m.uring_gpu_staging_bytes;
      gc.checked_bytes = x.m.uring_crc_gpu_bytes;
      gc.declined = x.m.uring_gpu_declined;
      x.uring_checked = std::make_unique<GpuCheckedCopy>(gc);
      r.checked = x.uring_checked.get();
    }
    x.uring = std::make_unique<UringRoute>(std::move(r));
    if (backend.cufile) {
      CufileRoute::Options c;
      c.backend = o.ssd_backend;
      c.read_path = o.ssd_read_path;
      c.selection = std::move(backend);
      c.ssd = x.ssd.get();
      c.staging = x.staging.get();
      c.lanes = &x.lanes;
      c.restore_reads = &x.restore_reads;
      c.series = x.cufile_series.get();
      c.slot_bytes = config.gpu_slot_bytes;
      c.max_write_jobs = config.gpu_max_write_jobs;
      c.clock = config.clock;
      c.backend_fallbacks = x.m.backend_fallbacks;
      c.write_fallbacks = x.m.gpu_write_fallbacks;
      c.bytes_restore = x.m.bytes_restore_cufile;
      c.cancelled = x.m.restore_cancelled;
      c.cost = x.m.cost_cufile;
      c.codec_budget = x.codec_budget.get();
      // Each device holds up to three shares: its cuFile worker's GPU decode
      // and encode lanes, and the DRAM decode lane (below).
      const int lanes = 3 * (config.gpu ? std::max(config.gpu->device_count(), 1) : 1);
      c.codec_budget_bytes = GpuCodecShare(o.codec_budget, lanes);
      c.encode_budget_bytes = GpuCodecShare(o.codec_budget, lanes);
      c.dram = x.dram.get();
      c.codec_metrics = x.codec_metrics.get();
      // A detached GPU-encoded write ended (Publish returned at its encode):
      // as Publish ends an attached one.
      c.detached_write_done = [xp = &x](const ObjectId& id, uint64_t size, Status st) {
        if (st.ok()) {
          xp->m.bytes_writeback_cufile->Inc(size);
          if (auto w = xp->dram->TakeWriteback(id)) xp->dram->FinishWriteback(*w, true);
        } else if (xp->writeback) {
          // The encoded DRAM copy reaches SSD through io_uring, written as it is.
          xp->writeback->Queue(id, NamespaceCodec{});
        }
      };
      x.cufile = std::make_unique<CufileRoute>(std::move(c));
    }
  }
  if (config.gpu) {
    x.dram_decode = std::make_unique<DramGpuDecode>(DramGpuDecode::Options{
        x.codec_budget.get(),
        GpuCodecShare(o.codec_budget, (x.cufile ? 3 : 1) * std::max(config.gpu->device_count(), 1)),
        x.codec_metrics.get(), x.m.cost_gpu_decode_enqueue, x.m.cost_gpu_decode_wait});
  }
  x.sessions = std::make_unique<SessionTable>(&x.next_id);
  QueryMetrics qm{x.m.hits_dram,           x.m.hits_ssd,       x.m.misses, x.m.budget_cuts_manager,
                  x.m.budget_cuts_session, x.m.queries_expired};
  x.queries = std::make_unique<QueryTable>(
      &x.next_id, config.query_budget_bytes ? config.query_budget_bytes : d.capacity, x.dram.get(),
      x.ssd.get(), qm);
  x.restore_env = {config.clock, x.m.restore_blocks_ok, x.m.restore_blocks_failed,
                   x.m.restore_seconds, x.queries.get()};
  x.RegisterCollector();
  x.reaper = std::thread([&x] { x.ReaperLoop(); });
  return std::unique_ptr<Manager>(new Manager(std::move(impl)));
}

Manager::Manager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Manager::~Manager() {
  for (SessionId s : impl_->sessions->Sessions()) CloseSession(s);
  {
    MutexLock l(impl_->reaper_mu);
    impl_->stopping = true;
  }
  impl_->reaper_cv.NotifyAll();
  impl_->reaper.join();
  if (impl_->cufile) impl_->cufile->Close();
  if (impl_->uring) impl_->uring->Close();  // readers, then the host-restore lane
  if (impl_->writeback) impl_->writeback->Close();
  impl_->dram_decode.reset();  // its lanes' arenas and budget
  impl_->config.metrics->RemoveCollector(impl_->collector);
}

void Manager::Impl::ReaperLoop() {
  SetThreadName("okv-reaper");
  MutexLock l(reaper_mu);
  while (!stopping) {
    reaper_cv.WaitFor(reaper_mu, std::chrono::milliseconds(50));
    if (stopping) break;
    l.Unlock();
    queries->Expire(config.clock->Now());
    if (ssd) ssd->catalog().ExpireLeases();
    dram->ExpireAssemblies();
    l.Lock();
  }
}

void Manager::Impl::RegisterCollector() {
  collector = config.metrics->AddCollector([this](MetricWriter& w) {
    DramStats s = dram->stats();
    auto g = [&](std::string_view name, std::string_view help, double v) {
      w.Family(name, help, "gauge");
      w.Sample(name, {}, v);
    };
    auto c = [&](std::string_view name, std::string_view help, double v) {
      w.Family(name, help, "counter");
      w.Sample(name, {}, v);
    };
    g("orbitkv_pool_capacity_bytes", "DRAM pool size (--pool-size).", double(s.capacity));
    g("orbitkv_pool_used_bytes", "DRAM pool bytes allocated (objects, assemblies, scratch).",
      double(s.used_bytes));
    g("orbitkv_pool_objects", "Sealed objects in DRAM.", double(s.sealed_entries));
    g("orbitkv_pool_assembling_objects", "Objects being assembled from fragments.",
      double(s.assembling_entries));
    g("orbitkv_pool_pinned_bytes", "DRAM bytes pinned by queries, restores and writeback.",
      double(s.pinned_bytes));
    g("orbitkv_pool_writeback_pending", "Sealed objects waiting for SSD writeback.",
      double(s.writeback_pending));
    c("orbitkv_pool_evictions_total", "DRAM objects evicted (LRU).", double(s.evictions));
    c("orbitkv_pool_evicted_bytes_total", "DRAM bytes evicted.", double(s.evicted_bytes));
    c("orbitkv_pool_admission_rejects_total", "Objects not kept in DRAM by the reuse policy.",
      double(s.admission_rejects));
    g("orbitkv_checkpoint_dram_bytes",
      "Hybrid models' recurrent checkpoints in DRAM, unpinned (capped by "
      "--checkpoint-dram-percent).",
      double(s.checkpoint_bytes));
    c("orbitkv_checkpoints_demoted_total",
      "Checkpoints that left DRAM for the checkpoint cap (their SSD copy stays).",
      double(s.checkpoints_demoted));
    c("orbitkv_checkpoint_demoted_bytes_total", "Bytes of checkpoints demoted.",
      double(s.checkpoint_demoted_bytes));
    if (staging) {
      DramStats st = staging->stats();
      g("orbitkv_ssd_read_staging_capacity_bytes", "Pinned DRAM staging for SSD reads.",
        double(st.capacity));
      g("orbitkv_ssd_read_staging_used_bytes", "SSD read staging in use.",
        double(st.scratch_bytes));
    }
    const QueryTable::Stats q = queries->stats();
    g("orbitkv_sessions", "Connected sessions.", double(sessions->session_count()));
    g("orbitkv_instances", "Registered instances.", double(sessions->instance_count()));
    g("orbitkv_queries_active", "Queries holding sources.", double(q.queries));
    g("orbitkv_query_budget_used_bytes", "Logical bytes charged by live queries.",
      double(q.budget_used));
    g("orbitkv_restores_inflight", "Restores not yet complete.", double(q.restores));
    g("orbitkv_ssd_restore_reads", "Restores' SSD read jobs queued or reading (writeback yields).",
      double(restore_reads.outstanding()));
  });
}

// ---- sessions and instances ------------------------------------------------

SessionId Manager::OpenSession(int peer_pid) { return impl_->sessions->Open(peer_pid); }

void Manager::CloseSession(SessionId session) {
  Impl& x = *impl_;
  if (!x.sessions->Contains(session)) return;
  std::vector<InstanceId> ids = x.sessions->InstancesOf(session);
  // Cancel what has not started, then unregister (waits for the rest).
  for (RestoreId r : x.queries->RestoresOf(session)) {
    CancelRestore(session, r).status().IgnoreError("session closing");
  }
  for (InstanceId id : ids) UnregisterInstance(session, id).IgnoreError("session closing");
  x.queries->DropSession(session);
  x.sessions->Close(session);
  if (x.ssd) x.ssd->catalog().ReleaseSession(session);
}

Result<InstanceId> Manager::RegisterInstance(SessionId session, const RegisterRequest& req,
                                             std::vector<int> region_fds) {
  ORBITKV_ASSIGN_OR_RETURN(std::shared_ptr<Instance> inst,
                           Instance::Create(session, req, std::move(region_fds), impl_->config.gpu,
                                            impl_->config.gpu_unavailable));
  // The storage codec is part of the namespace's identity (SessionTable::Add).
  ORBITKV_ASSIGN_OR_RETURN(inst->codec,
                           SelectNamespaceCodec(req.storage, impl_->default_codec, inst->layout));
  inst->codec_metrics = impl_->codec_metrics.get();
  inst->host_copier = impl_->host_copier.get();
  for (int d = 0; d < 2; ++d) {
    inst->cost_copy_enqueue[d] = impl_->m.cost_copy_enqueue[d];
    inst->cost_copy_wait[d] = impl_->m.cost_copy_wait[d];
    inst->cost_copy_call[d] = impl_->m.cost_copy_call[d];
  }
  inst->cost_crc_launch = impl_->m.cost_crc_launch;
  // Attached before its first restore can run; detached at unregister.
  const bool gpu_decode = inst->cuda() && !inst->codec.raw() && impl_->dram_decode;
  if (gpu_decode) impl_->dram_decode->Attach(inst->device());
  if (Status st = impl_->sessions->Add(inst); !st.ok()) {
    if (gpu_decode) impl_->dram_decode->Detach(inst->device());
    return st;
  }
  if (inst->hybrid()) {
    // The recurrent groups' objects are checkpoints for the DRAM admission cap.
    uint64_t recurrent = 0;
    for (const GroupDescription& g : inst->model->groups) {
      if (g.kind == GroupKind::kRecurrent) recurrent |= uint64_t{1} << g.storage_group;
    }
    impl_->dram->SetCheckpointGroups(inst->ns, recurrent);
  }
  OKV_LOG_INFO(
      "registered instance {} (namespace '{}', rank {}, {}, {} pages, {} groups, storage codec {})",
      inst->id, req.ns, req.rank, req.device, req.layout.num_pages, req.layout.groups.size(),
      inst->codec.raw() ? "none" : inst->codec.Identity());
  return inst->id;
}

Status Manager::UnregisterInstance(SessionId session, InstanceId id) {
  Impl& x = *impl_;
  ORBITKV_ASSIGN_OR_RETURN(std::shared_ptr<Instance> inst, x.sessions->Find(session, id));
  inst->BeginClose();
  x.queries->DropInstance(id);
  x.sessions->Remove(session, id);
  // A writer that leaves never completes its fragments: free them now.
  if (size_t aborted = inst->AbortPartials(*x.dram); aborted > 0) {
    x.m.assemblies_aborted->Inc(aborted);
    OKV_LOG_INFO("instance {}: aborted {} unsealed fragment assemblies", id, aborted);
  }
  // Every operation of the instance has finished: drain and release its
  // cuFile worker, then its streams and mappings (host mappings go with the
  // last reference).
  if (x.cufile) x.cufile->Retire(id);
  if (inst->cuda() && !inst->codec.raw() && x.dram_decode) x.dram_decode->Detach(inst->device());
  inst->ReleaseDevice();
  OKV_LOG_INFO("unregistered instance {}", id);
  return Status::OK();
}

void Manager::Drain() { impl_->lanes.Drain(); }

std::string Manager::ssd_backend() const { return impl_->backend_reason; }

Manager::Gauges Manager::gauges() const {
  const Impl& x = *impl_;
  Gauges g;
  g.sessions = x.sessions->session_count();
  g.instances = x.sessions->instance_count();
  const QueryTable::Stats q = x.queries->stats();
  g.queries = q.queries;
  g.restores_inflight = q.restores;
  g.ssd_restore_reads = static_cast<uint64_t>(x.restore_reads.outstanding());
  g.query_budget_used = q.budget_used;
  g.dram = x.dram->stats();
  if (x.ssd) {
    CatalogStats s = x.ssd->catalog().stats();
    g.ssd_leases = s.active_leases;
    g.ssd_pinned_bytes = s.pinned_bytes;
    g.ssd_reservations = s.writing_extents;
  }
  g.cufile_selected = x.cufile != nullptr;
  g.cufile_admitting = x.cufile && x.cufile->admitting();
  for (const auto& inst : x.sessions->Instances()) g.gpu_ipc_mappings += inst->ipc_mappings();
  if (x.cufile) {
    const CufileRoute::Stats s = x.cufile->stats();
    g.gpu_workers = s.workers;
    g.gpu_write_jobs = s.write_jobs;
    g.gpu_inflight_batches = s.inflight_batches;
  }
  return g;
}

}  // namespace orbitkv
