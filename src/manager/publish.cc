// Manager::Publish (DESIGN.md "Publish"): pages -> the pinned pool (memcpy, or
// D2H on the instance's stream), then writeback to SSD; complete groups of CUDA
// instances go straight from their pages to SSD through cuFile (CufileRoute).
#include <algorithm>
#include <cstring>

#include "manager/manager_impl.h"
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
  auto dw = std::make_shared<DirectWrites>();

  PublishResult out;
  // The first error ends the call; what it started still finishes below.
  Status failed;
  for (size_t i = 0; i < req.keys.size(); ++i) {
    const ObjectId id = inst->Object(req.group_id, req.keys[i]);
    if (x.dram->Contains(id) || (x.ssd && x.ssd->catalog().Lookup(StoreKey(id)).has_value())) {
      ++out.skipped;
      x.m.publish_skipped->Inc();
      continue;
    }
    WriteObjectHeader(id, shape.slot_bytes, ObjectCodec{}, {}, header);  // CRCs at seal
    auto begin = [&] { return x.dram->BeginAssembly(id, shape.object_size, g.num_slots, header); };
    Result<DramView> v = begin();
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
      continue;
    }
    uint64_t copied = 0;
    std::vector<gpu::CopyOp> ops;  // CUDA pages: D2H on the instance's stream
    for (const SlotLayout* s : slots) {
      const SegmentPos& seg = shape.segments[s->slot_id];
      if (inst->cuda()) {
        ops.push_back({reinterpret_cast<gpu::DevPtr>(v->data + seg.offset),
                       inst->DevicePage(*s, req.pages[i]), s->bytes_per_page});
      } else {
        std::memcpy(v->data + seg.offset, inst->HostPage(*s, req.pages[i]), s->bytes_per_page);
      }
      const uint64_t padded = AlignUp(s->bytes_per_page, 512);
      std::memset(v->data + seg.offset + s->bytes_per_page, 0, padded - s->bytes_per_page);
      copied += s->bytes_per_page;
    }
    if (Status st = inst->CopyAndWait(/*to_device=*/false, ops); !st.ok()) {
      x.dram->AbortAssembly(*v);
      failed = st;
      break;
    }
    // This call's slots' payload CRCs, from the pool copy (what SSD gets).
    for (const SlotLayout* s : slots) {
      const SegmentPos& seg = shape.segments[s->slot_id];
      SetSegmentCrc({v->data, shape.header_bytes}, s->slot_id,
                    Crc32c({v->data + seg.offset, seg.size}));
    }
    x.m.bytes_publish->Inc(copied);
    const uint8_t* dram_header = v->data;  // stays: a sealed entry waits for its writeback
    Result<bool> sealed = x.dram->CompleteParts(*v, parts);
    if (!sealed.ok()) {
      failed = sealed.status();
      break;
    }
    ++out.stored;
    if (!*sealed) {
      inst->NotePartial(v->id, *x.dram);
      continue;
    }
    if (slots.size() != g.num_slots) inst->ForgetPartial(v->id);
    ++out.sealed;
    x.m.publish_objects->Inc();
    if (direct() && x.cufile->SubmitWrite(*inst, g, shape, id, req.pages[i], dram_header, dw)) {
      continue;
    }
    if (x.ssd) x.writeback->Queue(id, inst->codec);
  }
  // On every return: the pages stay the engine's only after this call's SSD
  // writes finished (the GPU gathers from them), and each write's DRAM entry
  // leaves writeback-pending.
  for (DirectWrites::Done& d : dw->Wait()) {
    if (d.scratch.data) x.staging->Release(d.scratch);
    if (d.status.ok()) {
      x.m.bytes_writeback_cufile->Inc(shape.object_size);
      if (auto w = x.dram->TakeWriteback(d.id)) x.dram->FinishWriteback(*w, true);
      if (!d.dram_copy) {
        ++out.stored;  // SSD only: stored once its write finished
        ++out.sealed;
      }
    } else if (d.dram_copy) {
      x.writeback->Queue(d.id, inst->codec);  // the DRAM copy can still reach SSD through io_uring
    } else {
      ++out.dropped;  // no DRAM copy and the SSD write failed: the block is gone
      x.m.publish_pool_full->Inc();
    }
  }
  if (!failed.ok()) return failed;
  x.m.publish_seconds->Observe(ToSeconds(x.config.clock->Now() - start));
  return out;
}

}  // namespace orbitkv
