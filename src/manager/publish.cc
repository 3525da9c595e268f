// Manager::Publish (DESIGN.md "Publish"): pages -> the pinned pool (memcpy, or
// for CUDA pages one D2H job per batch of objects on the instance's stream),
// then writeback to SSD; complete groups of CUDA instances go straight from
// their pages to SSD through cuFile (CufileRoute).
#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_set>

#include "manager/cost_timer.h"
#include "manager/manager_impl.h"
#include "manager/publish_batches.h"
#include "store/crc32c.h"
#include "store/object_format.h"

namespace orbitkv {
namespace {

// The slots written by a publish: only slots this instance holds, so every
// assembly it starts or joins gets at least one part from it.
Result<std::vector<const SlotLayout*>> PublishedSlots(const GroupLayout& g,
                                                      const PublishRequest& req) {
  std::vector<const SlotLayout*> slots;
  const std::string where = "publish: group " + std::to_string(req.group_id) + ": ";
  if (req.slot_ids.empty()) {
    if (g.slots.empty()) {
      return Status::InvalidArgument(where + "this instance holds none of its " +
                                     std::to_string(g.num_slots) + " slots");
    }
    for (const SlotLayout& s : g.slots) slots.push_back(&s);
    return slots;
  }
  for (uint32_t id : req.slot_ids) {
    auto it = std::find_if(g.slots.begin(), g.slots.end(),
                           [&](const SlotLayout& s) { return s.slot_id == id; });
    if (it == g.slots.end()) {
      return Status::InvalidArgument(where + "slot " + std::to_string(id) +
                                     " is not held by this instance");
    }
    if (std::count(req.slot_ids.begin(), req.slot_ids.end(), id) > 1) {
      return Status::InvalidArgument(where + "slot " + std::to_string(id) + " given twice");
    }
    slots.push_back(&*it);
  }
  return slots;
}

}  // namespace

Result<PublishResult> Manager::Publish(SessionId session, const PublishRequest& req) {
  Impl& x = *impl_;
  const Clock::TimePoint start = x.config.clock->Now();
  const CostTimer call(x.m.cost_publish_call);
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, x.sessions->Acquire(session, req.instance));
  auto git = inst->groups.find(req.group_id);
  if (git == inst->groups.end()) {
    return Status::InvalidArgument("group " + std::to_string(req.group_id) +
                                   " is not in this instance's layout");
  }
  const GroupLayout& g = *git->second;
  const ObjectShape& shape = *inst->shapes.at(req.group_id);
  if (req.keys.size() != req.pages.size()) {
    return Status::InvalidArgument("publish: " + std::to_string(req.keys.size()) + " keys but " +
                                   std::to_string(req.pages.size()) + " pages");
  }
  for (uint64_t p : req.pages) {
    if (p >= inst->layout.num_pages) {
      return Status::InvalidArgument("publish: page " + std::to_string(p) + " out of range (" +
                                     std::to_string(inst->layout.num_pages) + " pages)");
    }
  }
  ORBITKV_ASSIGN_OR_RETURN(std::vector<const SlotLayout*> slots, PublishedSlots(g, req));
  std::vector<uint32_t> parts;
  for (const SlotLayout* s : slots) parts.push_back(s->slot_id);
  std::vector<uint8_t> header(shape.header_bytes);
  // Complete groups of CUDA instances go to SSD straight from their pages
  // through cuFile; the DRAM copy (if the pool takes it) is for hot reuse.
  // Admission is asked per group: an auto fallback part way through sends
  // the rest of the call to D2H + io_uring.
  const bool complete = x.ssd && slots.size() == g.num_slots;
  auto direct = [&] { return complete && x.cufile && x.cufile->ServesWrites(*inst); };
  // Complete groups of an encoded namespace: encoded on the GPU from the
  // pages and written through cuFile, the DRAM copy encoded too; declined
  // ones (and fragmented publishes) take the CPU path below.
  bool gpu_encode_allowed = true;  // off for the second pass (retries)
  auto gpu_encode = [&] {
    return gpu_encode_allowed && complete && x.cufile && x.cufile->ServesEncodedWrites(*inst);
  };
  auto dw = std::make_shared<DirectWrites>();
  std::unordered_set<Key, KeyHash> encoding;  // keys this call sent to the GPU encode path

  PublishResult out;
  // The first error ends the call; what it started still finishes below.
  Status failed;
  // Objects whose bytes are being copied into their pool assemblies: on CUDA
  // pages one D2H job moves a whole batch (small slots: one gather of whole
  // objects with their slot CRCs; else the staged mover, which merges the
  // slots' copies into few large DMAs), then each is sealed. Batches are pipelined
  // --publish-depth deep: the next one is assembled and its job enqueued
  // while the earlier jobs' copies run, and only then is the oldest waited
  // for and sealed. Bounded: a call holds at most depth batches of the pool
  // unsealed (depth - 1 in flight, one being assembled). Batch sizes:
  // PublishBatchTarget (the last ones shrink, so little copy is left after
  // the last enqueue), at most --publish-batch-bytes.
  struct Pending {
    ObjectId id;
    DramView view;
    uint64_t page = 0;
    uint64_t copied = 0;
    size_t op_begin = 0, op_end = 0;  // its copies in its batch's `ops`
  };
  const uint64_t batch_cap = x.config.options.publish_batch_bytes;
  std::vector<Pending> batch;
  std::unordered_set<Key, KeyHash> batched;  // keys in `batch` and `flying` (one ns and group)
  std::vector<gpu::CopyOp> ops;              // CUDA pages: the batch's D2H copies
  // Host pages: the batch's slot CRCs (per_object per object), each taken
  // right after its slot's copy, while the bytes are still in the CPU's cache.
  std::vector<uint32_t> host_crcs;
  uint64_t batch_bytes = 0;
  // A batch whose D2H job (copies, then the segment CRCs) was enqueued.
  struct Flight {
    std::vector<Pending> batch;
    std::vector<gpu::CopyOp> ops;
    std::vector<uint32_t> host_crcs;
    std::optional<DramView> crc_out;  // pinned pool scratch for the GPU CRCs
    std::optional<Instance::ToHostJob> job;
    Status enqueue_error;
  };
  std::deque<Flight> flying;  // oldest first
  const size_t depth = std::max<uint32_t>(1, x.config.options.publish_depth);
  const size_t per_object = slots.size();
  uint64_t object_bytes = 0;  // this call's bytes of one object
  for (const SlotLayout* s : slots) object_bytes += s->bytes_per_page;
  // Small slots of CUDA pages, every slot this instance holds: a batch is
  // one gather of whole objects with their CRCs (Instance::GatherTable), not
  // a copy and a CRC descriptor per slot. Null: slot by slot.
  const gpu::SlotTable* gather = inst->cuda() && x.config.options.publish_gather &&
                                         x.config.publish_gpu_crc && req.slot_ids.empty()
                                     ? inst->GatherTable(req.group_id)
                                     : nullptr;
  // The D2H copies of one pending object's slots, appended to `to`.
  auto append_ops = [&](const DramView& v, uint64_t page, std::vector<gpu::CopyOp>* to) {
    for (const SlotLayout* sl : slots) {
      const SegmentPos& seg = shape.segments[sl->slot_id];
      to->push_back({reinterpret_cast<gpu::DevPtr>(v.data + seg.offset),
                     inst->DevicePage(*sl, page), sl->bytes_per_page});
    }
  };
  // Takes the batch and enqueues its job. CUDA pages: the segment CRCs come
  // from the GPU (the CRC32C kernel over the same page bytes, after the D2H
  // on its stream) into pinned scratch of the pool, so the CPU never reads
  // the payload. No scratch, or a batch redone object by object: the CPU
  // CRCs the pool copy as before.
  auto launch = [&]() -> Flight {
    Flight f;
    f.batch = std::move(batch);
    f.ops = std::move(ops);
    f.host_crcs = std::move(host_crcs);
    batch.clear();
    ops.clear();
    host_crcs.clear();
    batch_bytes = 0;
    if (!inst->cuda() || f.batch.empty()) return f;
    std::vector<gpu::CrcOp> crc_ops;
    if (x.config.publish_gpu_crc) {
      Result<DramView> scratch =
          x.dram->AllocateScratch(f.batch.size() * per_object * sizeof(uint32_t));
      if (scratch.ok()) f.crc_out = *scratch;
    }
    uint32_t* const crc_out = f.crc_out ? reinterpret_cast<uint32_t*>(f.crc_out->data) : nullptr;
    Result<Instance::ToHostJob> job = Status::OK();
    if (gather && crc_out) {
      std::vector<gpu::ObjectGather> objects;
      objects.reserve(f.batch.size());
      for (const Pending& p : f.batch) {
        objects.push_back({p.page, reinterpret_cast<gpu::DevPtr>(p.view.data)});
      }
      job = inst->EnqueueGatherToHost(*gather, objects, crc_out);
    } else {
      if (gather) {  // no CRC scratch: the batch's copies, slot by slot
        for (Pending& p : f.batch) {
          p.op_begin = f.ops.size();
          append_ops(p.view, p.page, &f.ops);
          p.op_end = f.ops.size();
        }
      }
      if (crc_out) {
        crc_ops.reserve(f.batch.size() * per_object);
        for (const Pending& p : f.batch) {
          for (const SlotLayout* sl : slots) {
            crc_ops.push_back({inst->DevicePage(*sl, p.page), sl->bytes_per_page});
          }
        }
      }
      job = inst->EnqueueToHost(f.ops, crc_ops, crc_out);
    }
    if (job.ok()) {
      f.job = std::move(job).value();
    } else {
      f.enqueue_error = job.status();
    }
    return f;
  };
  // Waits for a launched batch and seals it; the first error aborts what is
  // left of it. A failed batch copy is redone object by object, so the
  // objects before the one that fails are stored, as one copy per object
  // would have stored them.
  auto land = [&](Flight& f) -> Status {
    // Not the call's last job in flight: its end is not needed at once.
    Status copy_error =
        f.job ? inst->WaitToHost(*f.job, /*more_queued=*/flying.size() > 1) : f.enqueue_error;
    const CostTimer seal(x.m.cost_publish_seal);
    const uint32_t* gpu_crcs = nullptr;
    if (f.crc_out && copy_error.ok()) gpu_crcs = reinterpret_cast<const uint32_t*>(f.crc_out->data);
    size_t copied_ok = f.batch.size();
    if (!copy_error.ok()) {
      copy_error = Status::OK();
      std::vector<gpu::CopyOp> gathered;  // a gathered object's copies, slot by slot
      for (copied_ok = 0; copied_ok < f.batch.size(); ++copied_ok) {
        const Pending& p = f.batch[copied_ok];
        std::span<const gpu::CopyOp> one =
            std::span(f.ops).subspan(p.op_begin, p.op_end - p.op_begin);
        if (one.empty()) {
          gathered.clear();
          append_ops(p.view, p.page, &gathered);
          one = gathered;
        }
        copy_error = inst->CopyAndWait(/*to_device=*/false, one);
        if (!copy_error.ok()) break;
      }
    }
    Status st;  // the first sealing error
    for (size_t k = 0; k < f.batch.size(); ++k) {
      Pending& p = f.batch[k];
      batched.erase(p.id.key);
      if (k >= copied_ok || !st.ok()) {
        x.dram->AbortAssembly(p.view);
        continue;
      }
      // This call's slots' payload CRCs: of the page bytes the pool copy
      // holds (what SSD gets), from the GPU, from the copy into the pool
      // (host pages), or from the pool copy.
      for (size_t j = 0; j < per_object; ++j) {
        const SlotLayout* sl = slots[j];
        const SegmentPos& seg = shape.segments[sl->slot_id];
        const size_t at = k * per_object + j;
        SetSegmentCrc({p.view.data, shape.header_bytes}, sl->slot_id,
                      gpu_crcs               ? gpu_crcs[at]
                      : !f.host_crcs.empty() ? f.host_crcs[at]
                                             : Crc32c({p.view.data + seg.offset, seg.size}));
      }
      (gpu_crcs ? x.m.publish_crc_gpu_bytes : x.m.publish_crc_cpu_bytes)->Inc(p.copied);
      x.m.bytes_publish->Inc(p.copied);
      const uint8_t* dram_header = p.view.data;  // stays: a sealed entry waits for its writeback
      Result<bool> sealed = x.dram->CompleteParts(p.view, parts);
      if (!sealed.ok()) {
        st = sealed.status();
        continue;
      }
      ++out.stored;
      if (!*sealed) {
        inst->NotePartial(p.view.id, *x.dram);
        continue;
      }
      if (slots.size() != g.num_slots) inst->ForgetPartial(p.view.id);
      ++out.sealed;
      x.m.publish_objects->Inc();
      if (direct() && x.cufile->SubmitWrite(*inst, g, shape, p.id, p.page, dram_header, dw)) {
        continue;
      }
      if (x.ssd) x.writeback->Queue(p.id, inst->codec);
    }
    if (f.crc_out) x.dram->ReleaseScratch(*f.crc_out);
    seal.Observe();
    return st.ok() ? copy_error : st;
  };
  // Lands the oldest launched batch; the first error is kept.
  auto land_oldest = [&](Status& st) {
    Status landed = land(flying.front());
    flying.pop_front();
    if (st.ok()) st = landed;
  };
  // Launches the batch, then lands the oldest ones until depth - 1 are in
  // flight.
  auto flush = [&]() -> Status {
    Flight f = launch();
    if (!f.batch.empty()) flying.push_back(std::move(f));
    Status st;
    while (flying.size() >= depth) land_oldest(st);
    return st;
  };
  // Launches and lands everything: this call's objects are all sealed (or
  // aborted) when it returns.
  auto drain = [&]() -> Status {
    Status st = flush();
    while (!flying.empty()) land_oldest(st);
    return st;
  };
  // One key of the request: skipped, sent to the GPU encode path, or copied
  // into the pool (and on through cuFile or the io_uring writeback lane).
  auto put = [&](size_t i) {
    const CostTimer assemble(x.m.cost_publish_assemble);
    const ObjectId id = inst->Object(req.group_id, req.keys[i]);
    // A key given twice: its first copy is sealed before the second is looked at.
    if (batched.count(id.key)) failed = drain();
    if (!failed.ok()) return;
    if (x.dram->Contains(id) || (x.ssd && x.ssd->catalog().Lookup(StoreKey(id)).has_value())) {
      ++out.skipped;
      x.m.publish_skipped->Inc();
      return;
    }
    if (gpu_encode()) {
      if (encoding.count(id.key)) {  // a key given twice: its first copy is on its way
        ++out.skipped;
        x.m.publish_skipped->Inc();
        return;
      }
      if (x.cufile->SubmitEncodedWrite(*inst, g, shape, id, req.pages[i], i, dw)) {
        encoding.insert(id.key);
        return;
      }
    } else if (!complete && x.ssd && x.cufile && gpu_encode_allowed &&
               x.cufile->ServesEncodedWrites(*inst)) {
      x.cufile->NoteEncodeFallback(*inst, "fragmented");
    }
    WriteObjectHeader(id, shape.slot_bytes, ObjectCodec{}, {}, header);  // CRCs at seal
    auto begin = [&] { return x.dram->BeginAssembly(id, shape.object_size, g.num_slots, header); };
    const CostTimer pool(x.m.cost_publish_pool_begin);
    Result<DramView> v = begin();
    pool.Observe();
    if (!v.ok() && v.status().code() == StatusCode::kResourceExhausted &&
        (!batch.empty() || !flying.empty())) {
      // This call's own unsealed objects hold room: seal them (they become
      // writeback candidates) before waiting for any.
      failed = drain();
      if (!failed.ok()) return;
      v = begin();
    }
    if (!v.ok() && v.status().code() == StatusCode::kResourceExhausted && x.ssd) {
      // The pool is full of objects waiting for SSD writeback: wait for it
      // (bounded) instead of dropping the block.
      v = x.writeback->WaitForRoom(std::move(v),
                                   std::chrono::steady_clock::now() + x.config.publish_wait, begin);
    }
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kAlreadyExists) {
        ++out.skipped;
        x.m.publish_skipped->Inc();
      } else if (!direct() ||
                 !x.cufile->SubmitWrite(*inst, g, shape, id, req.pages[i], nullptr, dw)) {
        ++out.dropped;
        x.m.publish_pool_full->Inc();
      }  // else no room in DRAM: straight to SSD, counted when its write finished
      return;
    }
    uint64_t copied = 0;
    const size_t op_begin = ops.size();
    if (inst->cuda() && !gather) append_ops(*v, req.pages[i], &ops);
    for (const SlotLayout* sl : slots) {
      const SegmentPos& seg = shape.segments[sl->slot_id];
      if (!inst->cuda()) {
        std::memcpy(v->data + seg.offset, inst->HostPage(*sl, req.pages[i]), sl->bytes_per_page);
      }
      const uint64_t padded = AlignUp(sl->bytes_per_page, 512);
      std::memset(v->data + seg.offset + sl->bytes_per_page, 0, padded - sl->bytes_per_page);
      if (!inst->cuda()) host_crcs.push_back(Crc32c({v->data + seg.offset, seg.size}));
      copied += sl->bytes_per_page;
    }
    batch.push_back({id, *v, req.pages[i], copied, op_begin, ops.size()});
    batched.insert(id.key);
    batch_bytes += copied;
    assemble.Observe();
    const uint64_t remaining = batch_bytes + (req.keys.size() - i - 1) * object_bytes;
    if (batch_bytes >= PublishBatchTarget(remaining, batch_cap)) failed = flush();
  };
  for (size_t i = 0; i < req.keys.size() && failed.ok(); ++i) put(i);
  if (Status st = drain(); failed.ok()) failed = st;
  // On every return: the pages stay the engine's only after this call's SSD
  // writes finished (the GPU gathers from them) or, for a GPU-encoded group
  // with a DRAM copy, once it was encoded (its write goes on from the encode
  // arena, detached); each finished write's DRAM entry leaves
  // writeback-pending.
  std::vector<size_t> retry;  // GPU-encoded groups that failed with no copy anywhere
  auto finish_writes = [&] {
    for (DirectWrites::Done& d : dw->Wait()) {
      if (d.scratch.data) x.staging->Release(d.scratch);
      if (d.encoded && (d.status.ok() || d.dram_copy)) {
        ++out.stored;  // not counted at a seal: the GPU encode path made the copies
        ++out.sealed;
        x.m.publish_objects->Inc();
        if (d.dram_copy) x.m.bytes_publish->Inc(d.object_size);
      }
      if (d.detached) continue;  // its write ends after this call (detached_write_done)
      if (d.status.ok()) {
        x.m.bytes_writeback_cufile->Inc(d.encoded ? d.object_size : shape.object_size);
        if (auto w = x.dram->TakeWriteback(d.id)) x.dram->FinishWriteback(*w, true);
        if (!d.dram_copy && !d.encoded) {
          ++out.stored;  // SSD only: stored once its write finished
          ++out.sealed;
        }
      } else if (d.dram_copy) {
        // The DRAM copy can still reach SSD through io_uring; an encoded one
        // is written as it is (a raw codec: no second encode).
        x.writeback->Queue(d.id, d.encoded ? NamespaceCodec{} : inst->codec);
      } else if (d.encoded) {
        retry.push_back(d.index);  // the pages are still held: the CPU path takes it
      } else {
        ++out.dropped;  // no DRAM copy and the SSD write failed: the block is gone
        x.m.publish_pool_full->Inc();
      }
    }
  };
  finish_writes();
  if (!retry.empty() && failed.ok()) {
    gpu_encode_allowed = false;
    std::sort(retry.begin(), retry.end());
    for (size_t i : retry) {
      if (!failed.ok()) break;
      put(i);
    }
    if (Status st = drain(); failed.ok()) failed = st;
    finish_writes();
  }
  if (!failed.ok()) return failed;
  x.m.publish_seconds->Observe(ToSeconds(x.config.clock->Now() - start));
  call.Observe();
  return out;
}

}  // namespace orbitkv
