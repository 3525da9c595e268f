#include "manager/uring_route.h"

#include "manager/cost_timer.h"
#include "orbitkv/logging.h"
#include "store/object_format.h"

namespace orbitkv {

UringRoute::UringRoute(Options options) : o_(std::move(options)) {
  host_restore_ = std::make_unique<WorkQueue<CopyJob>>("okv-ssd-copy", o_.queue, 1,
                                                       [this](size_t, std::vector<CopyJob>& jobs) {
                                                         for (CopyJob& j : jobs) CopyLane(j);
                                                       });
  reader_ = std::make_unique<WorkQueue<ReadJob>>("okv-ssd-read", o_.queue, o_.engines.size(),
                                                 [this](size_t w, std::vector<ReadJob>& jobs) {
                                                   for (ReadJob& j : jobs) ReadLane(w, j);
                                                 });
}

void UringRoute::Close() {
  reader_->Close();
  host_restore_->Close();
}

std::vector<RestoreBlock> UringRoute::Submit(const std::shared_ptr<RestoreRec>& r,
                                             std::vector<RestoreBlock> blocks) {
  r->SetSsdCost(o_.cost);
  ReadJob job;
  job.restore = r;
  job.blocks = std::move(blocks);
  job.token = o_.lanes->Start();
  if (o_.restore_reads) job.reading = o_.restore_reads->Start();
  if (!reader_->TryPush(job)) {
    job.token.Release();
    job.reading.Release();
    o_.queue_full->Inc();
    for (RestoreBlock& b : job.blocks) {
      o_.ssd->catalog().Cancel(b.src.lease);
      r->Finish(b.result, Tier::kSsd, Status::ResourceExhausted("SSD read queue is full"));
    }
  }
  return {};
}

bool UringRoute::Prepare(std::vector<QueryBlock> blocks, std::vector<uint64_t> slot_bytes) {
  ReadJob job;
  job.prepare = std::move(blocks);
  job.prepare_slot_bytes = std::move(slot_bytes);
  job.token = o_.lanes->Start();
  if (reader_->TryPush(job)) return true;
  for (QueryBlock& b : job.prepare) o_.ssd->catalog().Cancel(b.lease);
  o_.queue_full->Inc();
  return false;
}

uint32_t UringRoute::Cancel(const std::shared_ptr<RestoreRec>& r) {
  std::vector<ReadJob> jobs = reader_->RemoveIf([&](const ReadJob& j) { return j.restore == r; });
  uint32_t released = 0;
  for (ReadJob& j : jobs) {
    for (RestoreBlock& b : j.blocks) {
      ++released;
      o_.ssd->catalog().Cancel(b.src.lease);
      o_.cancelled->Inc();
      r->Finish(b.result, Tier::kSsd, Status::Cancelled("restore cancelled"));
    }
    j.token.Release();
    j.reading.Release();
  }
  return released;
}

std::vector<Status> UringRoute::ReadIntoStaging(IoEngine& io, std::span<QueryBlock*> srcs,
                                                std::span<DramView*> scratch, RestoreRec* restore) {
  std::vector<Status> out(srcs.size());
  std::vector<size_t> live;
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < srcs.size(); ++i) {
    if (!o_.ssd->catalog().Submit(srcs[i]->lease).ok()) {
      out[i] = Status::NotFound("SSD lease expired before the read was submitted");
      srcs[i]->lease = 0;
      continue;
    }
    live.push_back(i);
    sizes.push_back(srcs[i]->ref.length);
  }
  if (live.empty()) return out;
  std::vector<DramView> views;
  if (Status st = o_.staging->AllocateAll(sizes, &views); !st.ok()) {
    for (size_t i : live) {
      o_.ssd->catalog().Complete(srcs[i]->lease);
      srcs[i]->lease = 0;
      out[i] = st;
    }
    return out;
  }
  std::vector<ExtentRead> reads;
  for (size_t k = 0; k < live.size(); ++k) {
    *scratch[live[k]] = views[k];
    reads.push_back({srcs[live[k]]->ref, views[k].data, {}});
  }
  if (restore) restore->Stamp(RestoreRec::Stage::kIoSubmitted);
  o_.ssd->ReadExtents(io, reads).IgnoreError("statuses are per extent");
  if (restore) restore->Stamp(RestoreRec::Stage::kIoComplete);
  for (size_t k = 0; k < live.size(); ++k) out[live[k]] = reads[k].status;
  return out;
}

void UringRoute::ReadLane(size_t worker, ReadJob& job) {
  IoEngine& io = *o_.engines[worker];
  if (!job.restore) {
    PrepareReads(io, job);
    return;
  }
  std::vector<uint64_t> sizes;
  for (const RestoreBlock& b : job.blocks) sizes.push_back(b.src.ref.length);
  std::vector<std::pair<size_t, size_t>> runs = o_.staging->Runs(sizes);
  for (size_t r = 0; r < runs.size(); ++r) {
    CopyJob copy;
    copy.restore = job.restore;
    // The job's token goes with its first run; each further run takes its own.
    copy.token = r == 0 ? std::move(job.token) : o_.lanes->Start();
    std::vector<QueryBlock*> srcs;
    std::vector<DramView*> scratch;
    for (size_t i = runs[r].first; i < runs[r].second; ++i) {
      copy.blocks.push_back(std::move(job.blocks[i]));
    }
    for (RestoreBlock& b : copy.blocks) {
      srcs.push_back(&b.src);
      scratch.push_back(&b.scratch);
    }
    copy.read_status = ReadIntoStaging(io, srcs, scratch, job.restore.get());
    if (r + 1 == runs.size()) job.reading.Release();    // its reads are done: writes may go
    if (!host_restore_->TryPush(copy)) CopyLane(copy);  // lane full: copy here
  }
  job.reading.Release();  // no run at all
}

void UringRoute::PrepareReads(IoEngine& io, ReadJob& job) {
  std::vector<uint64_t> sizes;
  for (const QueryBlock& b : job.prepare) sizes.push_back(b.ref.length);
  for (auto [begin, end] : o_.staging->Runs(sizes)) {
    std::vector<QueryBlock*> srcs;
    std::vector<DramView> views(end - begin);
    std::vector<DramView*> scratch;
    for (size_t i = begin; i < end; ++i) {
      srcs.push_back(&job.prepare[i]);
      scratch.push_back(&views[i - begin]);
    }
    std::vector<Status> st = ReadIntoStaging(io, srcs, scratch, nullptr);
    for (size_t k = 0; k < srcs.size(); ++k) {
      QueryBlock& b = *srcs[k];
      if (st[k].ok()) {
        // Only a whole, checked object enters the pool (DRAM restores trust it).
        const std::span<const uint8_t> obj(views[k].data, b.ref.object_size);
        auto h = ParseObjectHeader(obj, b.ref.object_size);
        Status ok = h.ok() ? CheckObjectMatches(*h, b.id, job.prepare_slot_bytes) : h.status();
        if (ok.ok()) ok = VerifyObjectPayload(*h, obj);
        if (!ok.ok()) {
          OKV_LOG_WARN("prepare of {}: {}", b.id.key.ShortHex(), ok.ToString());
          o_.ssd->DropIfCorrupt(b.ref, b.id, ok);
        } else if (o_.dram->InsertSealed(b.id, obj).ok()) {
          o_.bytes_prepare->Inc(b.ref.object_size);
        }
      }
      if (views[k].data) o_.staging->Release(views[k]);
      if (b.lease != 0) o_.ssd->catalog().Complete(b.lease);
    }
  }
  job.token.Release();
}

void UringRoute::CopyLane(CopyJob& job) {
  const auto& r = job.restore;
  Instance& inst = *r->inst;
  // CUDA pages: the GPU checks and copies what it takes (gpu_checked_copy.h).
  std::vector<std::optional<Status>> on_gpu(job.blocks.size());
  if (inst.cuda() && o_.checked != nullptr) {
    std::vector<GpuCheckedCopy::Block> gpu_blocks;
    std::vector<size_t> which;
    for (size_t i = 0; i < job.blocks.size(); ++i) {
      const RestoreBlock& b = job.blocks[i];
      if (!job.read_status[i].ok()) continue;
      gpu_blocks.push_back(
          {{b.scratch.data, b.src.ref.object_size}, b.src.id, b.src.id.group, b.page});
      which.push_back(i);
    }
    const CostTimer check(o_.cost_gpu_check);
    std::vector<std::optional<Status>> got = o_.checked->Restore(inst, gpu_blocks);
    check.Observe();
    for (size_t k = 0; k < which.size(); ++k) on_gpu[which[k]] = std::move(got[k]);
  }
  for (size_t i = 0; i < job.blocks.size(); ++i) {
    RestoreBlock& b = job.blocks[i];
    Status st = job.read_status[i];
    if (st.ok() && on_gpu[i].has_value()) {
      st = *on_gpu[i];
    } else if (st.ok()) {
      Instance::PageCopies copies(o_.dram);
      const CostTimer verify(o_.cost_verify);
      st = inst.ObjectToPages(b.src.id.group, {b.scratch.data, b.src.ref.object_size}, b.src.id,
                              b.page,
                              /*from_ssd=*/true, &copies);
      verify.Observe();
      if (inst.cuda() && o_.crc_cpu_bytes) o_.crc_cpu_bytes->Inc(b.src.ref.object_size);
      if (st.ok()) st = inst.CopyAndWait(/*to_device=*/true, copies.ops);
    }
    if (job.read_status[i].ok()) o_.ssd->DropIfCorrupt(b.src.ref, b.src.id, st);
    if (st.ok()) {
      o_.bytes_restore->Inc(b.src.ref.object_size);
      // Not an object dropped while this restore read it (a cleared namespace).
      if (o_.promote && !o_.dram->Contains(b.src.id) && o_.ssd->catalog().IsCurrent(b.src.ref)) {
        const CostTimer promote(o_.cost_promote);
        o_.dram->InsertSealed(b.src.id, {b.scratch.data, b.src.ref.object_size})
            .IgnoreError("promotion to DRAM is best effort");
        promote.Observe();
      }
    }
    if (b.scratch.data) o_.staging->Release(b.scratch);
    if (b.src.lease != 0) o_.ssd->catalog().Complete(b.src.lease);
    r->Stamp(RestoreRec::Stage::kCopyComplete);
    r->Finish(b.result, Tier::kSsd, std::move(st));
  }
  job.token.Release();
}

}  // namespace orbitkv
