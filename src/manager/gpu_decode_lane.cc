#include "manager/gpu_decode_lane.h"

#include <chrono>
#include <cstring>

#include "codec/frame_layout.h"

#include "orbitkv/logging.h"
#include "orbitkv/units.h"

namespace orbitkv {
namespace {

constexpr uint64_t kRangeAlign = 4096;
constexpr uint32_t kMaxBatchFrames = 65535;  // CudaDecoder's largest batch

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// ---- RangeAllocator -------------------------------------------------------------

RangeAllocator::RangeAllocator(uint64_t bytes) {
  const uint64_t usable = bytes / kRangeAlign * kRangeAlign;
  if (usable > 0) free_[0] = usable;
}

std::optional<uint64_t> RangeAllocator::Take(uint64_t bytes) {
  const uint64_t need = AlignUp(std::max<uint64_t>(bytes, 1), kRangeAlign);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t at = it->first, left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[at + need] = left;
    return at;
  }
  return std::nullopt;
}

void RangeAllocator::Give(uint64_t offset, uint64_t bytes) {
  uint64_t at = offset, size = AlignUp(std::max<uint64_t>(bytes, 1), kRangeAlign);
  auto next = free_.lower_bound(at);
  if (next != free_.end() && at + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[at] = size;
}

uint64_t RangeAllocator::free_bytes() const {
  uint64_t n = 0;
  for (const auto& [at, size] : free_) n += size;
  return n;
}

// ---- CodecLaneMemory -------------------------------------------------------------

Status CodecLaneMemory::Acquire(uint64_t scratch, uint64_t host_bytes, const char* what) {
  if (budget_bytes < scratch + kRangeAlign) {
    return Status::ResourceExhausted("codec budget share of " + FormatByteSize(budget_bytes) +
                                     " leaves no GPU " + what + " arena after the codec's " +
                                     FormatByteSize(scratch) + " of scratch");
  }
  if (!budget->TryReserve(budget_bytes)) {
    return Status::ResourceExhausted("--codec-budget: " + FormatByteSize(budget->reserved()) +
                                     " of " + FormatByteSize(budget->limit()) +
                                     " already reserved, no room for a GPU " + what + " arena of " +
                                     FormatByteSize(budget_bytes));
  }
  reserved_ = true;
  arena_bytes = (budget_bytes - scratch) / kRangeAlign * kRangeAlign;
  ORBITKV_ASSIGN_OR_RETURN(arena, device->Allocate(arena_bytes));
  ORBITKV_ASSIGN_OR_RETURN(stream, device->CreateStream());
  ORBITKV_ASSIGN_OR_RETURN(event, device->CreateEvent());
  ORBITKV_ASSIGN_OR_RETURN(host, device->AllocateHost(host_bytes));
  return Status::OK();
}

void CodecLaneMemory::Free() {
  if (!device) return;
  if (stream) device->Synchronize(*stream).IgnoreError("codec lane teardown");
  event.reset();
  stream.reset();
  if (host) {
    device->FreeHost(host).IgnoreError("codec lane teardown");
    host = nullptr;
  }
  if (arena) {
    device->Free(arena).IgnoreError("codec lane teardown");
    arena = 0;
  }
  if (reserved_) {
    budget->Release(budget_bytes);
    reserved_ = false;
  }
}

// ---- GpuDecodeLane -------------------------------------------------------------

Result<std::unique_ptr<GpuDecodeLane>> GpuDecodeLane::Create(GpuDecodeLaneOptions o) {
  if (!o.device || !o.budget || !o.metrics) {
    return Status::InvalidArgument("GpuDecodeLane: device, budget and metrics are required");
  }
  if (o.max_frames < kMaxSlotsPerGroup || o.max_frames > kMaxBatchFrames) {
    return Status::InvalidArgument("GpuDecodeLane: max_frames must be in [" +
                                   std::to_string(kMaxSlotsPerGroup) + ", " +
                                   std::to_string(kMaxBatchFrames) + "]");
  }
  std::unique_ptr<GpuDecodeLane> lane(new GpuDecodeLane());
  GpuDecodeLane& l = *lane;
  l.o_ = std::move(o);
  gpu::Device& d = *l.o_.device;
  Status st = [&]() -> Status {
    ORBITKV_ASSIGN_OR_RETURN(l.decoder_, d.CreateFrameDecoder(l.o_.max_frames));
    l.mem_.device = &d;
    l.mem_.budget = l.o_.budget;
    l.mem_.budget_bytes = l.o_.budget_bytes;
    // Pinned results: a CRC32C per segment, then a frame prefix per target.
    const uint64_t host_bytes = (sizeof(uint32_t) + codec::kFramePrefixBytes) * l.o_.max_frames;
    ORBITKV_RETURN_IF_ERROR(l.mem_.Acquire(l.decoder_->scratch_bytes(), host_bytes, "decode"));
    l.arena_bytes_ = l.mem_.arena_bytes;
    l.arena_ = l.mem_.arena;
    l.stream_ = l.mem_.stream.get();
    l.event_ = l.mem_.event.get();
    l.crcs_ = reinterpret_cast<uint32_t*>(l.mem_.host);
    l.prefixes_ = l.mem_.host + sizeof(uint32_t) * l.o_.max_frames;
    return Status::OK();
  }();
  if (!st.ok()) {
    l.Free();
    return st.WithContext("GPU decode lane on device " + std::to_string(d.ordinal()));
  }
  {
    MutexLock g(l.mu_);
    l.ranges_ = RangeAllocator(l.arena_bytes_);
  }
  GpuDecodeLane* p = lane.get();
  l.thread_ = std::thread([p] { p->Loop(); });
  return lane;
}

GpuDecodeLane::~GpuDecodeLane() {
  Close();
  Free();
}

void GpuDecodeLane::Free() {
  if (stream_) o_.device->Synchronize(*stream_).IgnoreError("decode lane teardown");
  decoder_.reset();
  mem_.Free();
  stream_ = nullptr;
  event_ = nullptr;
  crcs_ = nullptr;
  prefixes_ = nullptr;
  arena_ = 0;
}

std::optional<gpu::DevPtr> GpuDecodeLane::TryTake(uint64_t bytes) {
  MutexLock l(mu_);
  std::optional<uint64_t> at = ranges_.Take(bytes);
  if (!at) return std::nullopt;
  return arena_ + *at;
}

void GpuDecodeLane::Give(gpu::DevPtr at, uint64_t bytes) {
  {
    MutexLock l(mu_);
    ranges_.Give(at - arena_, bytes);
  }
  if (o_.on_space) o_.on_space();
}

void GpuDecodeLane::Submit(Task task) {
  std::vector<Task> one;
  one.push_back(std::move(task));
  SubmitBatch(std::move(one));
}

void GpuDecodeLane::SubmitBatch(std::vector<Task> tasks) {
  {
    MutexLock l(mu_);
    if (!closing_) {
      for (Task& t : tasks) queue_.push_back(std::move(t));
      cv_.NotifyAll();
      return;
    }
  }
  for (Task& t : tasks) {
    Give(t.input, t.input_bytes);
    t.done(Status::Cancelled("GPU decode lane closed"));
  }
}

void GpuDecodeLane::Close() {
  {
    MutexLock l(mu_);
    closing_ = true;
  }
  cv_.NotifyAll();
  std::call_once(joined_, [&] {
    if (thread_.joinable()) thread_.join();
  });
}

void GpuDecodeLane::Loop() {
  std::vector<Task> batch;
  while (true) {
    batch.clear();
    {
      MutexLock l(mu_);
      while (queue_.empty() && !closing_) cv_.Wait(mu_);
      if (queue_.empty()) return;  // closing, drained
      // The queue's head and the tasks after it of the same codec, while
      // their segments fit one batch (any one task does: max_frames >=
      // kMaxSlotsPerGroup).
      uint64_t segments = 0;
      while (!queue_.empty()) {
        const Task& t = queue_.front();
        if (!batch.empty() && (t.codec.id != batch[0].codec.id ||
                               t.codec.info.head_dim != batch[0].codec.info.head_dim ||
                               segments + Segments(t) > o_.max_frames)) {
          break;
        }
        segments += Segments(t);
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<Status> st = Decode(batch);
    for (size_t i = 0; i < batch.size(); ++i) {
      Give(batch[i].input, batch[i].input_bytes);
      batch[i].done(std::move(st[i]));
    }
  }
}

Status GpuDecodeLane::CheckPrefix(const Task& t, const Target& tg, const uint8_t* p) {
  using namespace codec;
  auto u32 = [&](uint32_t at) {
    uint32_t v;
    std::memcpy(&v, p + at, 4);
    return v;
  };
  auto u64 = [&](uint32_t at) {
    uint64_t v;
    std::memcpy(&v, p + at, 8);
    return v;
  };
  const bool tq = t.codec.id == CodecId::kTurboQuant4 || t.codec.id == CodecId::kTurboQuant3;
  const char* why = nullptr;
  if (u32(0) != kFrameMagic) {
    why = "no frame magic";
  } else if (p[kPrefixCodec] != static_cast<uint8_t>(t.codec.id) ||
             p[kPrefixVersion] != CodecFormatVersion(t.codec.id)) {
    why = "another codec or format version";
  } else if (p[kPrefixDType] != static_cast<uint8_t>(t.codec.info.dtype)) {
    why = "another element dtype";
  } else if (u64(kPrefixDecodedSize) != tg.bytes) {
    why = "another decoded size";
  } else if (u64(kPrefixFrameSize) != t.header.segments[tg.slot].size) {
    why = "a frame size other than its segment's";
  } else if (tq && u32(kPrefixParam) != t.codec.info.head_dim) {
    why = "another head_dim";
  }
  if (why == nullptr) return Status::OK();
  return Status::Corruption("slot " + std::to_string(tg.slot) +
                            " of an encoded object: frame prefix: " + why);
}

std::vector<Status> GpuDecodeLane::Decode(std::span<const Task> batch) {
  const auto start = std::chrono::steady_clock::now();
  const CodecMetrics::Series& series = o_.metrics->of(batch[0].codec.id);
  gpu::Device& d = *o_.device;
  std::vector<Status> out(batch.size());
  // Host inputs to the arena, every segment's payload CRC32C on the GPU and
  // the target frames' prefixes to the host, all before any frame is decoded.
  std::vector<gpu::CopyOp> h2d, prefixes;
  std::vector<uint32_t> crc_at(batch.size()), prefix_at(batch.size());
  crc_ops_.clear();
  for (size_t k = 0; k < batch.size(); ++k) {
    const Task& t = batch[k];
    if (t.host_input) {
      h2d.push_back({t.input, reinterpret_cast<gpu::DevPtr>(t.host_input), t.input_bytes});
    }
    crc_at[k] = static_cast<uint32_t>(crc_ops_.size());
    for (const SegmentPos& seg : t.header.segments) {
      crc_ops_.push_back({t.input + seg.offset, seg.size});
    }
    prefix_at[k] = static_cast<uint32_t>(prefixes.size());
    for (const Target& tg : t.targets) {
      const SegmentPos& seg = t.header.segments[tg.slot];
      if (seg.size < codec::kFramePrefixBytes) {
        out[k] = Status::Corruption("slot " + std::to_string(tg.slot) + " of an encoded object: " +
                                    std::to_string(seg.size) + " bytes are no codec frame");
        break;
      }
      prefixes.push_back(
          {reinterpret_cast<gpu::DevPtr>(prefixes_ + prefixes.size() * codec::kFramePrefixBytes),
           t.input + seg.offset, codec::kFramePrefixBytes});
    }
    if (!out[k].ok()) {
      series.decode.failures->Inc();
      prefixes.resize(prefix_at[k]);
    }
  }
  Status st = h2d.empty() ? Status::OK() : d.CopyAsync(h2d, *stream_);
  if (st.ok()) st = d.Crc32cAsync(crc_ops_, crcs_, *stream_);
  if (st.ok() && !prefixes.empty()) st = d.CopyAsync(prefixes, *stream_);
  if (st.ok()) st = d.Record(*event_, *stream_);
  if (st.ok()) st = d.Wait(*event_);
  if (!st.ok()) {
    d.Synchronize(*stream_).IgnoreError("draining after a failed CRC check");
    st = st.WithContext(h2d.empty() ? "GPU CRC32C of an encoded object"
                                    : "H2D copy and GPU CRC32C of an encoded object");
    for (Status& o : out) {
      if (o.ok()) o = st;
    }
    return out;
  }
  ops_.clear();
  std::vector<size_t> op_task;    // ops_[i] belongs to batch[op_task[i]]
  std::vector<uint32_t> op_slot;  // and decodes its slot op_slot[i]
  uint64_t frames_bytes = 0, raw_bytes = 0;
  for (size_t k = 0; k < batch.size(); ++k) {
    const Task& t = batch[k];
    if (!out[k].ok()) continue;
    for (uint32_t j = 0; j < t.header.segments.size() && out[k].ok(); ++j) {
      if (Status c = CheckSegmentCrc(t.header, j, crcs_[crc_at[k] + j]); !c.ok()) {
        series.crc_failures->Inc();
        out[k] = c;
      }
    }
    for (size_t i = 0; i < t.targets.size() && out[k].ok(); ++i) {
      const uint8_t* p = prefixes_ + (prefix_at[k] + i) * codec::kFramePrefixBytes;
      if (Status c = CheckPrefix(t, t.targets[i], p); !c.ok()) {
        series.decode.failures->Inc();
        out[k] = c;
      }
    }
    if (!out[k].ok()) continue;
    for (const Target& tg : t.targets) {
      const SegmentPos& seg = t.header.segments[tg.slot];
      ops_.push_back({t.input + seg.offset, seg.size, tg.dst, tg.bytes});
      op_task.push_back(k);
      op_slot.push_back(tg.slot);
    }
  }
  if (ops_.empty()) return out;
  st = decoder_->DecodeAsync(batch[0].codec.id, batch[0].codec.info.head_dim, ops_, *stream_);
  Result<std::vector<Status>> done =
      st.ok() ? decoder_->Finish(*stream_) : Result<std::vector<Status>>(st);
  if (!done.ok()) {
    d.Synchronize(*stream_).IgnoreError("draining after a failed decode");
    st = done.status().WithContext("GPU decode of an encoded object");
    for (size_t i = 0; i < op_task.size(); ++i) {
      if (out[op_task[i]].ok()) {
        series.decode.failures->Inc();
        out[op_task[i]] = st;
      }
    }
    return out;
  }
  for (size_t i = 0; i < done->size(); ++i) {
    const size_t k = op_task[i];
    if ((*done)[i].ok() || !out[k].ok()) continue;
    series.decode.failures->Inc();
    out[k] = Status::Corruption("slot " + std::to_string(op_slot[i]) +
                                " of an encoded object: " + std::string((*done)[i].message()));
  }
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!out[op_task[i]].ok()) continue;
    frames_bytes += ops_[i].frame_size;
    raw_bytes += ops_[i].out_size;
  }
  series.decode.bytes_in->Inc(frames_bytes);
  series.decode.bytes_out->Inc(raw_bytes);
  series.decode.seconds->Observe(Since(start));
  return out;
}

}  // namespace orbitkv
