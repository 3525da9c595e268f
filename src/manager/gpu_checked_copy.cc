#include "manager/gpu_checked_copy.h"

#include <algorithm>

#include "orbitkv/logging.h"
#include "orbitkv/units.h"
#include "store/object_format.h"

namespace orbitkv {
namespace {

// Objects sit at this alignment in the staging (the DMAs' and the CRC
// kernel's loads stay aligned).
constexpr uint64_t kPlacement = 4096;
// The smallest segment (object_format.h: 512-aligned, non-empty): a buffer's
// result array holds one CRC per 512 bytes of it.
constexpr uint64_t kMinSegment = 512;

}  // namespace

GpuCheckedCopy::~GpuCheckedCopy() {
  MutexLock l(mu_);
  for (auto& [device, list] : made_) {
    for (auto& b : list) Destroy(*b);
  }
}

void GpuCheckedCopy::Destroy(Buffer& b) {
  if (b.stream) b.device->Synchronize(*b.stream).IgnoreError("freeing GPU-checked copy staging");
  b.event.reset();
  b.stream.reset();
  if (b.crcs) b.device->FreeHost(reinterpret_cast<uint8_t*>(b.crcs)).IgnoreError("teardown");
  if (b.data) {
    b.device->Free(b.data).IgnoreError("teardown");
    o_.staging_bytes->Sub(static_cast<int64_t>(o_.buffer_bytes));
  }
}

GpuCheckedCopy::Buffer* GpuCheckedCopy::Take(gpu::Device& device) {
  if (o_.buffer_bytes < kPlacement) return nullptr;
  MutexLock l(mu_);
  std::vector<Buffer*>& free = free_[&device];
  if (!free.empty()) {
    Buffer* b = free.back();
    free.pop_back();
    return b;
  }
  std::vector<std::unique_ptr<Buffer>>& made = made_[&device];
  if (made.size() >= o_.buffers || refused_.count(&device)) return nullptr;
  // Made under the lock: rare (at most `buffers` per device, ever).
  auto b = std::make_unique<Buffer>();
  b->device = &device;
  Status st = [&]() -> Status {
    ORBITKV_ASSIGN_OR_RETURN(b->stream, device.CreateStream());
    ORBITKV_ASSIGN_OR_RETURN(b->event, device.CreateEvent());
    ORBITKV_ASSIGN_OR_RETURN(uint8_t * crcs,
                             device.AllocateHost(o_.buffer_bytes / kMinSegment * sizeof(uint32_t)));
    b->crcs = reinterpret_cast<uint32_t*>(crcs);
    ORBITKV_ASSIGN_OR_RETURN(b->data, device.Allocate(o_.buffer_bytes));
    o_.staging_bytes->Add(static_cast<int64_t>(o_.buffer_bytes));
    return Status::OK();
  }();
  if (!st.ok()) {
    // Not tried again (each run would retry and log): the buffers made so
    // far serve, the rest of the runs take the CPU check.
    refused_.insert(&device);
    OKV_LOG_WARN(
        "cuda:{}: no more GPU staging for io_uring restores ({}; {} of {} buffers made); runs "
        "without one keep the CPU CRC32C check until restart",
        device.ordinal(), st.ToString(), made.size(), o_.buffers);
    Destroy(*b);
    return nullptr;
  }
  made.push_back(std::move(b));
  return made.back().get();
}

void GpuCheckedCopy::Give(Buffer* b) {
  MutexLock l(mu_);
  free_[b->device].push_back(b);
}

std::vector<std::optional<Status>> GpuCheckedCopy::Restore(const Instance& inst,
                                                           std::span<const Block> blocks) {
  std::vector<std::optional<Status>> out(blocks.size());
  Buffer* buf = blocks.empty() ? nullptr : Take(inst.device());
  if (buf == nullptr) {
    o_.declined->Inc(blocks.size());
    return out;
  }
  const uint64_t max_crcs = o_.buffer_bytes / kMinSegment;
  std::vector<Item> round;
  uint64_t used = 0, crcs = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    const uint64_t size = b.object.size();
    // The header only: it says whether the GPU takes the object at all.
    Result<ParsedHeader> h = inst.MatchedHeader(b.group, b.object, b.id);
    if (!h.ok()) {
      out[i] = h.status();
      continue;
    }
    if (h->codec != kCodecRaw || h->segments.size() > max_crcs) {
      o_.declined->Inc();
      continue;  // the CPU path: decoded there, or more segments than results
    }
    // Larger than a buffer: read in place by the GPU, where it can.
    const bool in_place = size > o_.buffer_bytes;
    if (in_place && !inst.device().KernelsReadHost(b.object.data(), size)) {
      o_.declined->Inc();
      continue;
    }
    const uint64_t staged = in_place ? 0 : size;
    if (AlignUp(used, kPlacement) + staged > o_.buffer_bytes ||
        crcs + h->segments.size() > max_crcs) {
      Round(inst, *buf, blocks, round, out);
      round.clear();
      used = crcs = 0;
    }
    gpu::DevPtr src = reinterpret_cast<gpu::DevPtr>(b.object.data());
    if (!in_place) {
      used = AlignUp(used, kPlacement);
      src = buf->data + used;
      used += size;
    }
    crcs += h->segments.size();
    round.push_back({i, src, in_place, std::move(h).value()});
  }
  if (!round.empty()) Round(inst, *buf, blocks, round, out);
  Give(buf);
  return out;
}

void GpuCheckedCopy::Round(const Instance& inst, Buffer& buf, std::span<const Block> blocks,
                           std::span<const Item> round, std::vector<std::optional<Status>>& out) {
  gpu::Device& d = *buf.device;
  std::vector<gpu::CopyOp> h2d;
  std::vector<gpu::CrcOp> crc_ops;
  uint64_t over_pcie = 0;  // staged H2D, or read in place by the CRC kernels
  for (const Item& it : round) {
    const Block& b = blocks[it.block];
    over_pcie += b.object.size();
    if (!it.in_place) {
      h2d.push_back({it.src, reinterpret_cast<gpu::DevPtr>(b.object.data()), b.object.size()});
    }
    for (const SegmentPos& seg : it.header.segments) {
      crc_ops.push_back({it.src + seg.offset, seg.size});
    }
  }
  auto fail = [&](const Status& st, auto&& blocks_of) {
    d.Synchronize(*buf.stream).IgnoreError("draining a failed GPU-checked copy");
    for (size_t i : blocks_of) out[i] = st;
  };
  // The staged objects into the staging and every segment's CRC, then one wait.
  Status st = h2d.empty() ? Status::OK() : d.CopyAsync(h2d, *buf.stream);
  if (st.ok()) st = d.Crc32cAsync(crc_ops, buf.crcs, *buf.stream);
  if (st.ok()) st = d.Record(*buf.event, *buf.stream);
  // A run of several objects takes longer than any spin: sleep at once.
  if (st.ok()) st = d.WaitForBytes(*buf.event, over_pcie);
  if (!st.ok()) {
    // No page byte is written yet: the objects read in place go to the CPU
    // check (declined), the staged ones fail with the error.
    std::vector<size_t> staged;
    for (const Item& it : round) {
      if (it.in_place) {
        o_.declined->Inc();
      } else {
        staged.push_back(it.block);
      }
    }
    return fail(st.WithContext("GPU-checked copy into staging"), staged);
  }
  // Compare; scatter the objects that match.
  std::vector<size_t> good;
  std::vector<gpu::CopyOp> scatter;
  size_t k = 0;
  for (const Item& it : round) {
    const ParsedHeader& h = it.header;
    Status ok;
    for (uint32_t j = 0; j < h.segments.size(); ++j, ++k) {
      if (ok.ok()) ok = CheckSegmentCrc(h, j, buf.crcs[k]);
    }
    o_.checked_bytes->Inc(blocks[it.block].object.size());
    if (!ok.ok()) {
      out[it.block] = ok;
      continue;
    }
    good.push_back(it.block);
    const GroupLayout& g = *inst.groups.at(blocks[it.block].group);
    for (const SlotLayout& s : g.slots) {
      scatter.push_back({inst.DevicePage(s, blocks[it.block].page),
                         it.src + h.segments[s.slot_id].offset, s.bytes_per_page});
    }
  }
  if (good.empty()) return;
  st = d.CopyAsync(scatter, *buf.stream);
  if (st.ok()) st = d.Record(*buf.event, *buf.stream);
  if (st.ok()) st = d.Wait(*buf.event);
  if (!st.ok()) return fail(st.WithContext("GPU-checked copy into the pages"), good);
  for (size_t i : good) out[i] = Status::OK();
}

}  // namespace orbitkv
