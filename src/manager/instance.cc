#include "manager/instance.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "manager/cost_timer.h"
#include "manager/sources.h"
#include "orbitkv/device.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "recovery/object_keys.h"

namespace orbitkv {

Result<std::shared_ptr<Instance>> Instance::Create(SessionId session, const RegisterRequest& req,
                                                   std::vector<int> region_fds, gpu::Platform* gpu,
                                                   const std::string& no_gpu) {
  auto close_fds = [&] {
    for (int fd : region_fds) {
      if (fd >= 0) ::close(fd);
    }
    region_fds.clear();
  };
  if (req.ns.empty() || req.ns.size() > 4096) {
    close_fds();
    return Status::InvalidArgument("namespace must be 1..4096 bytes");
  }
  Result<DeviceSpec> device = ParseDevice(req.device);
  if (!device.ok()) {
    close_fds();
    return device.status();
  }
  const bool host = !device->cuda;
  if (!host) {
    if (gpu == nullptr) {
      close_fds();
      return Status::Unavailable("device '" + req.device + "': this Manager has no CUDA devices (" +
                                 no_gpu + ")");
    }
    if (!region_fds.empty()) {
      close_fds();
      return Status::InvalidArgument("device '" + req.device +
                                     "': CUDA regions are passed as IPC handles, not memfds");
    }
  }
  if (Status st = ValidateLayout(req.layout); !st.ok()) {
    close_fds();
    return st;
  }
  const size_t regions = req.layout.region_bytes.size();
  if (host && (region_fds.size() != regions || !req.ipc_handles.empty())) {
    close_fds();
    return Status::InvalidArgument("layout declares " + std::to_string(regions) + " regions, got " +
                                   std::to_string(region_fds.size()) + " fds" +
                                   (req.ipc_handles.empty() ? "" : " and IPC handles"));
  }
  if (!host && req.ipc_handles.size() != regions) {
    return Status::InvalidArgument("layout declares " + std::to_string(regions) + " regions, got " +
                                   std::to_string(req.ipc_handles.size()) + " CUDA IPC handles");
  }
  if (req.model) {
    // The socket decoder validated it; in-process callers get the same checks.
    Status st = recovery::ValidateModelDescription(*req.model);
    if (st.ok()) st = recovery::CheckLayoutAgreement(*req.model, req.layout);
    if (!st.ok()) {
      close_fds();
      return st;
    }
  }
  std::shared_ptr<Instance> inst(new Instance());
  inst->session = session;
  inst->ns_key = recovery::MakeNamespaceKey(req.ns, req.model);
  if (req.model) {
    inst->model = req.model;
    inst->masks = recovery::GroupMasks(*req.model);
    for (uint32_t i = 0; i < req.model->groups.size(); ++i) {
      inst->model_group[req.model->groups[i].storage_group] = i;
    }
  }
  inst->rank = req.rank;
  inst->ns_name = req.ns;
  inst->device_name = req.device;
  inst->layout = req.layout;
  for (const GroupLayout& g : inst->layout.groups) inst->groups[g.group_id] = &g;
  if (!host) {
    // Map every region and check it covers the layout before any I/O can
    // target it; a failure releases what was mapped (~Instance).
    ORBITKV_ASSIGN_OR_RETURN(inst->device_, gpu->device(static_cast<int>(device->ordinal)));
    for (size_t i = 0; i < regions; ++i) {
      Result<gpu::IpcMapping> m = inst->device_->OpenIpc(req.ipc_handles[i]);
      if (!m.ok()) return m.status().WithContext("region " + std::to_string(i) + " IPC handle");
      inst->mappings_.push_back(*m);
      inst->ipc_mappings_.fetch_add(1);
      if (m->bytes < req.layout.region_bytes[i]) {
        return Status::InvalidArgument("region " + std::to_string(i) + ": the CUDA allocation is " +
                                       std::to_string(m->bytes) + " bytes, the layout needs " +
                                       std::to_string(req.layout.region_bytes[i]));
      }
    }
    ORBITKV_ASSIGN_OR_RETURN(inst->h2d_, inst->device_->CreateStream());
    // One D2H stream up front: the common single-job case never makes one.
    ORBITKV_ASSIGN_OR_RETURN(gpu::Stream * d2h, inst->TakeD2hStream());
    inst->GiveD2hStream(d2h);
  }
  for (size_t i = 0; i < region_fds.size(); ++i) {
    Result<std::unique_ptr<HostRegion>> r =
        HostRegion::Map(region_fds[i], req.layout.region_bytes[i]);
    region_fds[i] = -1;  // Map owns it now
    if (!r.ok()) {
      close_fds();
      return r.status().WithContext("region " + std::to_string(i));
    }
    inst->regions_.push_back(std::move(r).value());
  }
  return inst;
}

ObjectId Instance::Object(uint32_t group, const BlockKey& chain_key) const {
  if (!model) return ObjectId{ns, group, ToKey(chain_key)};
  return ObjectId{ns, group, ToKey(recovery::ObjectKey(chain_key, masks[model_group.at(group)]))};
}

namespace {

// Times one copy job's enqueue and wait into the opt-in cost histograms.
class CopyCostTimer {
 public:
  CopyCostTimer(Histogram* enqueue, Histogram* wait) : enqueue_(enqueue), wait_(wait) {
    if (enqueue_ || wait_) start_ = std::chrono::steady_clock::now();
  }
  void Enqueued() {
    if (!enqueue_ && !wait_) return;
    const auto now = std::chrono::steady_clock::now();
    if (enqueue_) enqueue_->Observe(std::chrono::duration<double>(now - start_).count());
    start_ = now;
  }
  void Waited() {
    if (wait_) {
      wait_->Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  Histogram* const enqueue_;
  Histogram* const wait_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Status Instance::CopyAndWait(bool to_device, std::span<const gpu::CopyOp> ops) {
  if (ops.empty()) return Status::OK();
  if (!cuda()) {  // host pages: the ops are memcpys
    if (host_copier != nullptr) {
      host_copier->Copy(ops);
    } else {
      HostCopier::CopyHere(ops);
    }
    return Status::OK();
  }
  if (!to_device) return CopyToHostWithCrcs(ops, {}, nullptr);
  CopyCostTimer cost(cost_copy_enqueue[0], cost_copy_wait[0]);
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Event> ev, TakeEvent());
  {
    MutexLock l(h2d_mu_);
    const CostTimer call(cost_copy_call[0]);
    Status st = device_->CopyAsync(ops, *h2d_);
    call.Observe();
    if (st.ok()) st = device_->Record(*ev, *h2d_);
    if (!st.ok()) {
      device_->Synchronize(*h2d_).IgnoreError("draining a failed H2D job");
      GiveEvent(std::move(ev));
      return st;
    }
  }
  cost.Enqueued();
  uint64_t bytes = 0;
  for (const gpu::CopyOp& op : ops) bytes += op.bytes;
  Status st = device_->WaitForBytes(*ev, bytes).WithContext("H2D copy into engine pages");
  cost.Waited();
  if (st.ok()) GiveEvent(std::move(ev));  // an event of a failed wait is not reused
  return st;
}

Result<std::unique_ptr<gpu::Event>> Instance::TakeEvent() {
  {
    MutexLock l(events_mu_);
    if (!idle_events_.empty()) {
      std::unique_ptr<gpu::Event> e = std::move(idle_events_.back());
      idle_events_.pop_back();
      return e;
    }
  }
  return device_->CreateEvent();
}

void Instance::GiveEvent(std::unique_ptr<gpu::Event> e) {
  MutexLock l(events_mu_);
  idle_events_.push_back(std::move(e));
}

Status Instance::CopyToHostWithCrcs(std::span<const gpu::CopyOp> ops,
                                    std::span<const gpu::CrcOp> crcs, uint32_t* out) {
  ORBITKV_ASSIGN_OR_RETURN(ToHostJob job, EnqueueToHost(ops, crcs, out));
  return WaitToHost(job);
}

Result<gpu::Stream*> Instance::TakeD2hStream() {
  MutexLock l(d2h_mu_);
  if (!d2h_idle_.empty()) {
    gpu::Stream* s = d2h_idle_.back();
    d2h_idle_.pop_back();
    return s;
  }
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Stream> s, device_->CreateStream());
  d2h_.push_back(std::move(s));
  return d2h_.back().get();
}

void Instance::GiveD2hStream(gpu::Stream* s) {
  MutexLock l(d2h_mu_);
  d2h_idle_.push_back(s);
}

Result<Instance::ToHostJob> Instance::StartToHostJob() {
  ToHostJob job;
  job.started = std::chrono::steady_clock::now();
  ORBITKV_ASSIGN_OR_RETURN(job.event, TakeEvent());
  Result<gpu::Stream*> stream = TakeD2hStream();
  if (!stream.ok()) {
    GiveEvent(std::move(job.event));
    return stream.status();
  }
  job.stream = *stream;
  return job;
}

Result<Instance::ToHostJob> Instance::FinishToHostEnqueue(ToHostJob job, Status st) {
  if (st.ok()) st = device_->Record(*job.event, *job.stream);
  if (!st.ok()) {
    device_->Synchronize(*job.stream).IgnoreError("draining a failed D2H job");
    GiveD2hStream(job.stream);
    GiveEvent(std::move(job.event));  // idle: its stream was drained
    if (job.crc_stream) {
      device_->Synchronize(*job.crc_stream).IgnoreError("draining a failed D2H job's CRCs");
      GiveD2hStream(job.crc_stream);
      GiveEvent(std::move(job.crc_event));
    }
    return st;
  }
  job.enqueued = std::chrono::steady_clock::now();
  if (cost_copy_enqueue[1]) {
    cost_copy_enqueue[1]->Observe(
        std::chrono::duration<double>(job.enqueued - job.started).count());
  }
  return job;
}

Result<Instance::ToHostJob> Instance::EnqueueToHost(std::span<const gpu::CopyOp> ops,
                                                    std::span<const gpu::CrcOp> crcs,
                                                    uint32_t* out) {
  ORBITKV_ASSIGN_OR_RETURN(ToHostJob job, StartToHostJob());
  job.crcs = !crcs.empty();
  Status st;
  // The CRC kernels first, on a stream of their own when there are copies:
  // they read the pages, so they need not wait for the copies, and a launch
  // with nothing queued before it on its stream is the cheaper one. The
  // copies then go on the job's stream with nothing pending on it, as the
  // staged mover needs.
  if (!crcs.empty()) {
    gpu::Stream* crc_stream = job.stream;
    if (!ops.empty()) {
      if (Result<std::unique_ptr<gpu::Event>> ev = TakeEvent(); !ev.ok()) {
        st = ev.status();
      } else if (Result<gpu::Stream*> cs = TakeD2hStream(); !cs.ok()) {
        GiveEvent(std::move(ev).value());
        st = cs.status();
      } else {
        job.crc_event = std::move(ev).value();
        job.crc_stream = crc_stream = *cs;
      }
    }
    if (st.ok()) {
      const CostTimer crc(cost_crc_launch);
      st = device_->Crc32cAsync(crcs, out, *crc_stream);
      crc.Observe();
    }
    if (st.ok() && job.crc_stream) st = device_->Record(*job.crc_event, *job.crc_stream);
  }
  if (st.ok() && !ops.empty()) {
    const CostTimer call(cost_copy_call[1]);
    st = device_->CopyAsync(ops, *job.stream);
    call.Observe();
  }
  for (const gpu::CopyOp& op : ops) job.bytes += op.bytes;
  for (const gpu::CrcOp& op : crcs) job.bytes += op.bytes;
  return FinishToHostEnqueue(std::move(job), std::move(st));
}

const gpu::SlotTable* Instance::GatherTable(uint32_t group) {
  MutexLock l(gather_mu_);
  auto it = gather_tables_.find(group);
  if (it != gather_tables_.end()) return it->second.get();
  std::unique_ptr<gpu::SlotTable>& kept = gather_tables_[group];
  const GroupLayout& g = *groups.at(group);
  const ObjectShape& shape = *shapes.at(group);
  std::vector<gpu::SlotSpan> spans;
  uint64_t largest = 0;
  for (const SlotLayout& s : g.slots) {
    spans.push_back(
        {DevicePage(s, 0), s.page_stride, s.bytes_per_page, shape.segments[s.slot_id].offset});
    largest = std::max(largest, s.bytes_per_page);
  }
  // A gather writes an object from its first slot to its last, zeros between
  // them: only a writer of every slot of the group owns that whole span (a
  // writer of some slots would overwrite the others' parts of a shared
  // assembly).
  Result<std::unique_ptr<gpu::SlotTable>> made =
      !cuda() || spans.empty() ? Status::Unavailable("host pages")
      : g.slots.size() != g.num_slots
          ? Status::Unavailable("this instance writes " + std::to_string(g.slots.size()) + " of " +
                                std::to_string(g.num_slots) +
                                " slots; its objects are assembled with other writers' parts")
      : largest > gpu::kGatherSlotMaxBytes
          ? Status::Unavailable("slots of up to " + FormatByteSize(largest) + " (over " +
                                FormatByteSize(gpu::kGatherSlotMaxBytes) +
                                ": their copies are large enough for the copy engines)")
          : device_->CreateSlotTable(spans, layout.num_pages);
  if (made.ok()) {
    kept = std::move(made).value();
    OKV_LOG_INFO(
        "instance {} group {}: publishes gather whole objects on {} ({} slots of up to {} per "
        "object, one descriptor per object)",
        id, group, device_name, spans.size(), FormatByteSize(largest));
  } else if (cuda()) {
    OKV_LOG_INFO("instance {} group {}: publishes copy slot by slot: {}", id, group,
                 made.status().ToString());
  }
  return kept.get();
}

Result<Instance::ToHostJob> Instance::EnqueueGatherToHost(
    const gpu::SlotTable& table, std::span<const gpu::ObjectGather> objects, uint32_t* crcs) {
  ORBITKV_ASSIGN_OR_RETURN(ToHostJob job, StartToHostJob());
  job.crcs = true;
  const CostTimer call(cost_copy_call[1]);
  Status st = device_->GatherObjectsAsync(table, objects, crcs, *job.stream);
  call.Observe();
  job.bytes = table.object_bytes() * objects.size();
  return FinishToHostEnqueue(std::move(job), std::move(st));
}

Status Instance::WaitToHost(ToHostJob& job, bool more_queued) {
  auto wait = [&](gpu::Event& e) {
    return more_queued ? device_->WaitLong(e) : device_->WaitForBytes(e, job.bytes);
  };
  Status st = wait(*job.event);
  if (!st.ok()) device_->Synchronize(*job.stream).IgnoreError("draining a failed D2H job");
  if (job.crc_stream != nullptr) {
    Status crc = wait(*job.crc_event);
    if (!crc.ok()) {
      device_->Synchronize(*job.crc_stream).IgnoreError("draining a failed D2H job's CRCs");
      job.crc_event.reset();  // an event of a failed wait is not reused
    } else {
      GiveEvent(std::move(job.crc_event));
    }
    GiveD2hStream(std::exchange(job.crc_stream, nullptr));
    if (st.ok()) st = crc;
  }
  if (cost_copy_wait[1]) {
    cost_copy_wait[1]->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.enqueued).count());
  }
  GiveD2hStream(std::exchange(job.stream, nullptr));
  if (st.ok()) {
    GiveEvent(std::move(job.event));
  } else {
    job.event.reset();  // an event of a failed wait is not reused
  }
  return st.WithContext(job.crcs ? "D2H copy and CRC32C of engine pages"
                                 : "D2H copy from engine pages");
}

Status Instance::PageCrcs(const GroupLayout& g, uint64_t page, uint32_t* out) {
  std::vector<gpu::CrcOp> ops;
  for (const SlotLayout& s : g.slots) ops.push_back({DevicePage(s, page), s.bytes_per_page});
  return CopyToHostWithCrcs({}, ops, out);
}

Result<ParsedHeader> Instance::MatchedHeader(uint32_t group, std::span<const uint8_t> object,
                                             const ObjectId& id) const {
  const ObjectShape& shape = *shapes.at(group);
  const uint64_t size = object.size();
  ORBITKV_ASSIGN_OR_RETURN(
      ParsedHeader h, ParseObjectHeader({object.data(), std::min(size, shape.header_bytes)}, size));
  ORBITKV_RETURN_IF_ERROR(CheckObjectMatches(h, id, shape.slot_bytes));
  return h;
}

Status Instance::ObjectToPages(uint32_t group, std::span<const uint8_t> object, const ObjectId& id,
                               uint64_t page, bool from_ssd, PageCopies* copies) const {
  const GroupLayout* g = groups.at(group);
  ORBITKV_ASSIGN_OR_RETURN(ParsedHeader h, MatchedHeader(group, object, id));
  if (h.codec != kCodecRaw) {
    // Every segment is checked before the first is decoded, so a damaged
    // object leaves no page of it half written.
    if (codec.raw()) {
      return Status::Corruption("encoded object (codec " + std::to_string(h.codec) +
                                ") in a namespace without a storage codec");
    }
    ORBITKV_RETURN_IF_ERROR(CheckEncodedObject(codec, h, object, *codec_metrics));
    for (const SlotLayout& s : g->slots) {
      uint8_t* dst = nullptr;
      if (!cuda()) {
        dst = HostPage(s, page);
      } else {
        ORBITKV_ASSIGN_OR_RETURN(DramView v, copies->pool->AllocateScratch(s.bytes_per_page));
        copies->AddScratch(v);
        dst = v.data;
        copies->ops.push_back(
            {DevicePage(s, page), reinterpret_cast<gpu::DevPtr>(dst), s.bytes_per_page});
      }
      ORBITKV_RETURN_IF_ERROR(
          DecodeSegment(codec, h, object, s.slot_id, {dst, s.bytes_per_page}, *codec_metrics));
    }
    return Status::OK();
  }
  if (from_ssd) ORBITKV_RETURN_IF_ERROR(VerifyObjectPayload(h, object));
  for (const SlotLayout& s : g->slots) {
    const uint8_t* src = object.data() + h.segments[s.slot_id].offset;
    const gpu::DevPtr dst =
        cuda() ? DevicePage(s, page) : reinterpret_cast<gpu::DevPtr>(HostPage(s, page));
    copies->ops.push_back({dst, reinterpret_cast<gpu::DevPtr>(src), s.bytes_per_page});
  }
  return Status::OK();
}

Status Instance::Hold() {
  MutexLock l(mu_);
  if (closing_) return Status::Cancelled("instance is unregistering");
  ++inflight_;
  return Status::OK();
}

void Instance::HoldAgain() {
  MutexLock l(mu_);
  ++inflight_;
}

void Instance::Unhold() {
  {
    MutexLock l(mu_);
    --inflight_;
  }
  cv_.NotifyAll();
}

void Instance::BeginClose() {
  MutexLock l(mu_);
  closing_ = true;
  while (inflight_ != 0) cv_.Wait(mu_);
}

void Instance::ReleaseDevice() {
  if (!device_) return;
  if (h2d_) device_->Synchronize(*h2d_).IgnoreError("instance teardown");
  h2d_.reset();
  {
    MutexLock l(d2h_mu_);
    for (auto& s : d2h_) device_->Synchronize(*s).IgnoreError("instance teardown");
    d2h_idle_.clear();
    d2h_.clear();
  }
  {
    MutexLock l(events_mu_);
    idle_events_.clear();
  }
  {
    MutexLock l(gather_mu_);
    gather_tables_.clear();  // they name the mappings
  }
  for (const gpu::IpcMapping& m : mappings_) {
    if (Status st = device_->CloseIpc(m.base); !st.ok()) {
      OKV_LOG_WARN("instance {}: closing a CUDA IPC mapping failed: {}", id, st.ToString());
    }
  }
  mappings_.clear();
  ipc_mappings_.store(0);
  device_ = nullptr;
}

void Instance::NotePartial(EntryId entry, DramCache& dram) {
  MutexLock l(mu_);
  partial_.insert(entry);
  if (partial_.size() < partial_prune_at_) return;
  std::erase_if(partial_, [&](EntryId e) { return !dram.Assembling(e); });
  partial_prune_at_ = std::max<size_t>(64, 2 * partial_.size());
}

void Instance::ForgetPartial(EntryId entry) {
  MutexLock l(mu_);
  partial_.erase(entry);
}

size_t Instance::AbortPartials(DramCache& dram) {
  std::unordered_set<EntryId> partial;
  {
    MutexLock l(mu_);
    partial.swap(partial_);
  }
  size_t aborted = 0;
  for (EntryId e : partial) aborted += dram.AbortAssemblyEntry(e) ? 1 : 0;
  return aborted;
}

Result<InstanceGuard> InstanceGuard::Take(std::shared_ptr<Instance> inst) {
  ORBITKV_RETURN_IF_ERROR(inst->Hold());
  return InstanceGuard(std::move(inst));
}

InstanceGuard InstanceGuard::Share() const {
  inst_->HoldAgain();
  return InstanceGuard(inst_);
}

void InstanceGuard::Reset() {
  if (!inst_) return;
  inst_->Unhold();
  inst_.reset();
}

}  // namespace orbitkv
