// Manager::StartRestore, Restore and CancelRestore (DESIGN.md "Restore"): take
// the selected blocks out of their query (QueryTable::Take), hand the SSD ones
// to a route (SubmitSsd: the one place a route is chosen), and copy the DRAM
// ones on the caller's thread from the entries the query pinned.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "manager/manager_impl.h"
#include "orbitkv/logging.h"

namespace orbitkv {
namespace {

// Pinned scratch that decoded DRAM entries of CUDA pages hold before their
// H2D copy runs (Manager::StartRestore).
constexpr uint64_t kDecodeScratchRun = 64ull << 20;

}  // namespace

void Manager::Impl::SubmitSsd(const std::shared_ptr<RestoreRec>& r, const Instance& inst,
                              std::vector<RestoreBlock> blocks) {
  const bool cufile_serves = cufile && cufile->ServesReads(inst);
  r->StartSsd(blocks.size(), cufile_serves ? m.cost_cufile : m.cost_uring);
  if (cufile_serves) blocks = cufile->Submit(r, std::move(blocks));
  if (!blocks.empty()) {
    std::vector<RestoreBlock> declined = uring->Submit(r, std::move(blocks));
    (void)declined;  // io_uring declines nothing
  }
}

void Manager::Impl::RefuseForeignGroups(const std::shared_ptr<RestoreRec>& r, const Instance& inst,
                                        QueryTable::Taken& taken) {
  auto refuse = [&](std::vector<RestoreBlock>& blocks) {
    std::erase_if(blocks, [&](const RestoreBlock& b) {
      if (inst.groups.count(b.src.id.group)) return false;
      if (b.src.tier == Tier::kDram) dram->Unpin(b.src.dram.id);
      if (b.src.tier == Tier::kSsd) ssd->catalog().Cancel(b.src.lease);
      r->Finish(
          b.result, b.src.tier,
          Status::InvalidArgument("restore: block " + std::to_string(b.result) +
                                  " is a piece of storage group " + std::to_string(b.src.id.group) +
                                  ", which this instance's layout does not hold"));
      return true;
    });
  };
  refuse(taken.dram);
  refuse(taken.ssd);
}

Result<RestoreId> Manager::StartRestore(SessionId session, const RestoreRequest& req,
                                        RestoreDone done) {
  Impl& x = *impl_;
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, x.sessions->Acquire(session, req.instance));
  if (req.blocks.size() != req.pages.size()) {
    return Status::InvalidArgument("restore: " + std::to_string(req.blocks.size()) +
                                   " blocks but " + std::to_string(req.pages.size()) + " pages");
  }
  if (req.blocks.empty()) return Status::InvalidArgument("restore: no blocks");
  for (uint64_t p : req.pages) {
    if (p >= inst->layout.num_pages) {
      return Status::InvalidArgument("restore: page " + std::to_string(p) + " out of range (" +
                                     std::to_string(inst->layout.num_pages) + " pages)");
    }
  }
  auto r = std::make_shared<RestoreRec>();
  r->session = session;
  r->instance = req.instance;
  r->env = &x.restore_env;
  r->done = std::move(done);
  r->start = x.config.clock->Now();
  r->want_timeline = req.want_timeline;
  ORBITKV_ASSIGN_OR_RETURN(
      QueryTable::Taken taken,
      x.queries->Take(session, req.instance, req.query, req.blocks, req.pages, r));
  r->Stamp(RestoreRec::Stage::kSourceReady);
  // The restore holds the instance until its last block; this call holds it
  // too, so nothing below races with a lane finishing the restore.
  r->inst = inst.Share();
  const RestoreId id = r->id;
  if (inst->hybrid()) x.RefuseForeignGroups(r, *inst, taken);
  if (!taken.ssd.empty()) x.SubmitSsd(r, *inst, std::move(taken.ssd));
  // DRAM blocks copy here, on the caller's thread, from the entries the query
  // pinned: memcpy into host pages, or one H2D job (one event) for CUDA pages.
  // Encoded entries of CUDA pages decode into pinned scratch of the pool first:
  // the copies run (and the scratch goes back) every kDecodeScratchRun bytes
  // of it, and a block the pool has no scratch for waits for the run before
  // it, so a long encoded prefix never needs its whole decoded size of pool
  // room at once (it failed part way with ResourceExhausted).
  const size_t n = taken.dram.size();
  auto copies = std::make_unique<Instance::PageCopies>(x.dram.get());
  std::vector<Status> st(n);
  // Encoded entries of CUDA pages decode on the GPU where a lane takes them
  // (dram_gpu_decode.h); what it declines decodes on the CPU below.
  std::vector<std::optional<Status>> on_gpu(n);
  if (inst->cuda() && !inst->codec.raw() && x.dram_decode && n != 0) {
    std::vector<DramGpuDecode::Block> blocks;
    for (const RestoreBlock& b : taken.dram) {
      blocks.push_back({{b.src.dram.data, b.src.dram.size}, b.src.id, b.src.id.group, b.page});
    }
    on_gpu = x.dram_decode->Restore(*inst, blocks);
  }
  size_t run = 0;  // the first block of the copies not yet run
  // Opt-in cost observation: the per-block work before the copies, without
  // the copy runs themselves (Instance times those).
  const bool cost = x.m.cost_dram_plan != nullptr && n != 0;
  std::chrono::steady_clock::duration plan{};
  auto plan_start = std::chrono::steady_clock::now();
  auto copy_run = [&](size_t end) {
    if (cost) plan += std::chrono::steady_clock::now() - plan_start;
    const Status copied = inst->CopyAndWait(/*to_device=*/true, copies->ops);
    for (size_t j = run; j < end; ++j) {
      if (st[j].ok()) st[j] = copied;
    }
    copies = std::make_unique<Instance::PageCopies>(x.dram.get());  // releases the scratch
    run = end;
    if (cost) plan_start = std::chrono::steady_clock::now();
  };
  for (size_t i = 0; i < n; ++i) {
    const RestoreBlock& b = taken.dram[i];
    if (on_gpu[i]) {
      st[i] = std::move(*on_gpu[i]);
      continue;
    }
    auto to_pages = [&] {
      // A block that fails leaves no copy or scratch of its own behind: its
      // page keeps its bytes.
      const size_t ops = copies->ops.size(), scratch = copies->scratch.size();
      Status s = inst->ObjectToPages(b.src.id.group, {b.src.dram.data, b.src.dram.size}, b.src.id,
                                     b.page, /*from_ssd=*/false, copies.get());
      if (!s.ok()) copies->Truncate(ops, scratch);
      return s;
    };
    st[i] = to_pages();
    if (st[i].code() == StatusCode::kResourceExhausted && !copies->scratch.empty()) {
      copy_run(i);
      st[i] = to_pages();
    }
    if (copies->scratch_bytes() >= kDecodeScratchRun) copy_run(i + 1);
  }
  copy_run(n);
  if (cost) x.m.cost_dram_plan->Observe(std::chrono::duration<double>(plan).count());
  if (n != 0) r->Stamp(RestoreRec::Stage::kCopyComplete);
  for (size_t i = 0; i < n; ++i) {
    const RestoreBlock& b = taken.dram[i];
    if (st[i].ok()) x.m.bytes_restore_dram->Inc(b.src.dram.size);
    // A damaged DRAM copy (an encoded entry failing its CRCs or decode) leaves
    // the pool, so the next query finds the SSD copy or a miss.
    if (st[i].code() == StatusCode::kCorruption && x.dram->Discard(b.src.dram)) {
      OKV_LOG_WARN("restore: DRAM copy of {} dropped: {}", b.src.id.key.ShortHex(),
                   st[i].ToString());
    }
    x.dram->Unpin(b.src.dram.id);
    r->Finish(b.result, Tier::kDram, std::move(st[i]));
  }
  return id;
}

Result<RestoreResult> Manager::Restore(SessionId session, const RestoreRequest& req) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Result<RestoreResult>> out;
  Result<RestoreId> id = StartRestore(session, req, [&](Result<RestoreResult> r) {
    std::lock_guard<std::mutex> l(m);
    out.emplace(std::move(r));
    cv.notify_all();
  });
  if (!id.ok()) return id.status();
  std::unique_lock<std::mutex> l(m);
  cv.wait(l, [&] { return out.has_value(); });
  return std::move(*out);
}

Result<uint32_t> Manager::CancelRestore(SessionId session, RestoreId id) {
  Impl& x = *impl_;
  std::shared_ptr<RestoreRec> r = x.queries->FindRestore(session, id);
  if (!r) return Status::NotFound("restore is not in flight");
  if (!x.uring) return 0u;
  uint32_t released = 0;
  if (x.cufile) {
    // Holding the instance keeps its worker alive; an instance that is
    // unregistering cancels everything unsubmitted itself.
    if (Result<InstanceGuard> g = x.sessions->Acquire(session, r->instance); g.ok()) {
      released += x.cufile->Cancel(r);
    }
  }
  return released + x.uring->Cancel(r);
}

}  // namespace orbitkv
