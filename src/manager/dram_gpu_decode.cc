#include "manager/dram_gpu_decode.h"

#include <algorithm>

#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/object_format.h"

namespace orbitkv {
namespace {

// Segments (CRCs) and frames one lane batch checks and decodes: 64 objects
// of a 64-slot model (a 64 MiB restore of an 8B model at once), about 240
// KiB of decoder scratch per pipeline stage.
constexpr uint32_t kLaneFrames = 4096;
// Encoded bytes per submission to the lane (at most its max_batch_bytes):
// large enough for full-rate H2D copies and few launches (4 blocks of an 8B
// model at a 2x codec), small enough that the lane starts on a 64 MiB call's
// first blocks while the rest are built, and its pipeline stages overlap.
constexpr uint64_t kDecodeBatchBytes = 8ull << 20;

}  // namespace

DramGpuDecode::~DramGpuDecode() {
  MutexLock l(mu_);
  for (auto& [device, lane] : lanes_) {
    if (lane->lane) lane->lane->Close();
  }
  lanes_.clear();
}

void DramGpuDecode::Attach(gpu::Device& device) {
  {
    MutexLock l(mu_);
    std::unique_ptr<Lane>& lane = lanes_[&device];
    if (!lane) lane = std::make_unique<Lane>();
    ++lane->users;
  }
  // Made now, at register, not inside the first restore (its arena, decoders
  // and streams take milliseconds).
  LaneFor(device);
}

void DramGpuDecode::Detach(gpu::Device& device) {
  std::unique_ptr<Lane> gone;
  {
    MutexLock l(mu_);
    auto it = lanes_.find(&device);
    if (it == lanes_.end() || --it->second->users > 0) return;
    gone = std::move(it->second);
    lanes_.erase(it);
  }
  if (gone->lane) gone->lane->Close();  // idle: its device has no instance left
}

DramGpuDecode::Lane* DramGpuDecode::LaneFor(gpu::Device& device) {
  MutexLock l(mu_);
  auto it = lanes_.find(&device);
  if (it == lanes_.end()) return nullptr;  // not attached (no GPU decode)
  Lane* p = it->second.get();
  if (p->tried) return p->lane ? p : nullptr;
  p->tried = true;
  GpuDecodeLaneOptions lo;
  lo.device = &device;
  lo.budget_bytes = o_.share_bytes;
  lo.budget = o_.budget;
  lo.metrics = o_.metrics;
  lo.max_frames = kLaneFrames;
  lo.cost_enqueue = o_.cost_enqueue;
  lo.cost_wait = o_.cost_wait;
  lo.on_space = [p] {
    {
      MutexLock g(p->mu);
      ++p->gen;
    }
    p->space.NotifyAll();
  };
  Result<std::unique_ptr<GpuDecodeLane>> made =
      o_.share_bytes == 0 ? Result<std::unique_ptr<GpuDecodeLane>>(
                                Status::ResourceExhausted("no --codec-budget share"))
                          : GpuDecodeLane::Create(std::move(lo));
  if (made.ok()) {
    p->lane = std::move(made).value();
    OKV_LOG_INFO("device {}: encoded DRAM entries decode on the GPU ({} arena, {} pipeline stages)",
                 device.ordinal(), FormatByteSize(p->lane->capacity()), p->lane->stages());
  } else {
    OKV_LOG_WARN("device {}: encoded DRAM entries decode on the CPU: {}", device.ordinal(),
                 made.status().ToString());
  }
  return p->lane ? p : nullptr;
}

std::vector<std::optional<Status>> DramGpuDecode::Restore(const Instance& inst,
                                                          std::span<const Block> blocks) {
  std::vector<std::optional<Status>> out(blocks.size());
  const CodecMetrics::Series& series = o_.metrics->of(inst.codec.id);
  struct Pending {
    Mutex mu;
    CondVar cv;
    size_t left GUARDED_BY(mu) = 0;
  } pending;
  Lane* lane = nullptr;
  bool lane_known = false;
  std::vector<GpuDecodeLane::Task> batch;
  uint64_t batch_bytes = 0;
  auto submit = [&] {
    if (batch.empty()) return;
    lane->lane->SubmitBatch(std::move(batch));
    batch.clear();
    batch_bytes = 0;
  };
  uint64_t declined = 0, decoded = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const ObjectShape& shape = *inst.shapes.at(b.group);
    const uint64_t size = b.object.size();
    Result<ParsedHeader> h = inst.MatchedHeader(b.group, b.object, b.id);
    if (h.ok() && h->codec == kCodecRaw) continue;  // a raw entry: the caller copies it
    Status st = h.status();
    if (st.ok()) st = CheckObjectCodec(inst.codec, *h);
    if (!st.ok()) {
      out[i] = std::move(st);  // nothing moved
      continue;
    }
    if (!lane_known) {
      lane = LaneFor(inst.device());
      lane_known = true;
    }
    GpuDecodeLane::Task t;
    bool fits = lane != nullptr && size <= lane->lane->capacity();
    for (const SlotLayout& s : inst.groups.at(b.group)->slots) {
      if (!fits) break;
      const gpu::DevPtr dst = inst.DevicePage(s, b.page);
      // The decoder writes whole slots into 16-byte aligned pages.
      fits = s.bytes_per_page == shape.slot_bytes[s.slot_id] && dst % 16 == 0;
      t.targets.push_back({s.slot_id, dst, s.bytes_per_page});
    }
    if (!fits) {
      ++declined;
      continue;
    }
    std::optional<gpu::DevPtr> at;
    while (true) {
      uint64_t gen = 0;
      {
        MutexLock l(lane->mu);
        gen = lane->gen;
      }
      at = lane->lane->TryTake(size);
      if (at) break;
      // What this call holds goes to the lane, which gives ranges back as it
      // decodes; other callers' ranges are submitted before they wait too.
      submit();
      MutexLock l(lane->mu);
      while (lane->gen == gen) lane->space.Wait(lane->mu);
    }
    t.input = *at;
    t.input_bytes = size;
    t.host_input = b.object.data();
    t.header = std::move(h).value();
    t.codec = inst.codec;
    t.done = [&pending, &out, i](Status s) {
      out[i] = std::move(s);
      MutexLock l(pending.mu);
      if (--pending.left == 0) pending.cv.NotifyAll();
    };
    {
      MutexLock l(pending.mu);
      ++pending.left;
    }
    ++decoded;
    batch.push_back(std::move(t));
    batch_bytes += AlignUp(size, 4096);
    // The lane copies and decodes one batch while this call fills the next.
    if (batch_bytes >= std::min(kDecodeBatchBytes, lane->lane->max_batch_bytes())) submit();
  }
  if (lane) submit();
  {
    MutexLock l(pending.mu);
    while (pending.left != 0) pending.cv.Wait(pending.mu);
  }
  series.dram_gpu_decodes->Inc(decoded);
  series.dram_cpu_fallbacks->Inc(declined);
  return out;
}

}  // namespace orbitkv
