#include "manager/gpu_decode_lane.h"

#include <algorithm>
#include <chrono>
#include "common/thread_name.h"
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
  if (host_bytes > 0) {
    ORBITKV_ASSIGN_OR_RETURN(host, device->AllocateHost(host_bytes));
  }
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
    // As many stages as keep the decoders' scratch within a quarter of the
    // share (one at least).
    uint64_t scratch = 0;
    for (int i = 0; i < kMaxStages; ++i) {
      std::unique_ptr<gpu::FrameDecoder> dec;
      ORBITKV_ASSIGN_OR_RETURN(dec, d.CreateFrameDecoder(l.o_.max_frames));
      const uint64_t more = dec->scratch_bytes();
      if (i > 0 && 4 * (scratch + more) > l.o_.budget_bytes) break;
      l.stages_[i].decoder = std::move(dec);
      scratch += more;
      l.stages_n_ = i + 1;
    }
    l.mem_.device = &d;
    l.mem_.budget = l.o_.budget;
    l.mem_.budget_bytes = l.o_.budget_bytes;
    ORBITKV_RETURN_IF_ERROR(l.mem_.Acquire(scratch, 0, "decode"));
    l.arena_bytes_ = l.mem_.arena_bytes;
    l.arena_ = l.mem_.arena;
    l.stages_[0].stream = l.mem_.stream.get();
    for (int i = 1; i < l.stages_n_; ++i) {
      ORBITKV_ASSIGN_OR_RETURN(l.stages_[i].own_stream, d.CreateStream());
      l.stages_[i].stream = l.stages_[i].own_stream.get();
    }
    return Status::OK();
  }();
  if (!st.ok()) {
    l.Free();
    return st.WithContext("GPU decode lane on device " + std::to_string(d.ordinal()));
  }
  l.batch_bytes_ = l.o_.max_batch_bytes != 0
                       ? l.o_.max_batch_bytes
                       : std::max<uint64_t>(l.arena_bytes_ / (l.stages_n_ + 1), kRangeAlign);
  {
    MutexLock g(l.mu_);
    l.ranges_ = RangeAllocator(l.arena_bytes_);
    for (int i = 0; i < l.stages_n_; ++i) l.free_.push_back(&l.stages_[i]);
  }
  GpuDecodeLane* p = lane.get();
  l.thread_ = std::thread([p] { p->Loop(); });
  l.finisher_ = std::thread([p] { p->FinishLoop(); });
  return lane;
}

GpuDecodeLane::~GpuDecodeLane() {
  Close();
  Free();
}

void GpuDecodeLane::Free() {
  for (Stage& s : stages_) {
    if (s.stream) o_.device->Synchronize(*s.stream).IgnoreError("decode lane teardown");
  }
  for (Stage& s : stages_) {
    s.decoder.reset();
    s.stream = nullptr;
    s.own_stream.reset();
  }
  mem_.Free();
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
    if (finisher_.joinable()) finisher_.join();
  });
}

void GpuDecodeLane::Loop() {
  SetThreadName("okv-gpu-decode");
  while (true) {
    Stage* s = nullptr;
    {
      MutexLock l(mu_);
      while ((queue_.empty() || free_.empty()) && !(closing_ && queue_.empty())) cv_.Wait(mu_);
      if (queue_.empty()) {  // closing, drained
        enqueuer_done_ = true;
        cv_.NotifyAll();
        return;
      }
      s = free_.front();
      free_.pop_front();
      // The queue's head and the tasks after it of the same codec, while
      // their segments and bytes fit one batch (any one task does: max_frames
      // >= kMaxSlotsPerGroup, and the head is taken whatever its size).
      uint64_t segments = 0, bytes = 0;
      while (!queue_.empty()) {
        const Task& t = queue_.front();
        const Task* first = s->batch.empty() ? nullptr : &s->batch[0];
        const uint64_t in = AlignUp(t.input_bytes, kRangeAlign);
        if (first &&
            (t.codec.id != first->codec.id || t.codec.info.head_dim != first->codec.info.head_dim ||
             segments + Segments(t) > o_.max_frames || bytes + in > batch_bytes_)) {
          break;
        }
        segments += Segments(t);
        bytes += in;
        s->batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    Enqueue(*s);
    {
      MutexLock l(mu_);
      enqueued_.push_back(s);
    }
    cv_.NotifyAll();
  }
}

void GpuDecodeLane::FinishLoop() {
  SetThreadName("okv-gpu-dec-fin");
  while (true) {
    Stage* s = nullptr;
    {
      MutexLock l(mu_);
      while (enqueued_.empty() && !enqueuer_done_) cv_.Wait(mu_);
      if (enqueued_.empty()) return;  // the enqueuer stopped and everything finished
      s = enqueued_.front();
      enqueued_.pop_front();
    }
    std::vector<Status> st = Complete(*s);
    std::vector<Task> batch = std::move(s->batch);
    s->batch.clear();
    {
      MutexLock l(mu_);
      free_.push_back(s);
    }
    cv_.NotifyAll();
    for (size_t i = 0; i < batch.size(); ++i) {
      Give(batch[i].input, batch[i].input_bytes);
      batch[i].done(std::move(st[i]));
    }
  }
}

void GpuDecodeLane::Enqueue(Stage& s) {
  s.start = std::chrono::steady_clock::now();
  gpu::Device& d = *o_.device;
  const std::span<const Task> batch = s.batch;
  s.failed.assign(batch.size(), Status::OK());
  s.ops.clear();
  s.op_task.clear();
  s.op_slot.clear();
  std::vector<gpu::CopyOp> h2d;
  const bool tq = batch[0].codec.id == codec::CodecId::kTurboQuant4 ||
                  batch[0].codec.id == codec::CodecId::kTurboQuant3;
  for (size_t k = 0; k < batch.size(); ++k) {
    const Task& t = batch[k];
    if (t.host_input) {
      h2d.push_back({t.input, reinterpret_cast<gpu::DevPtr>(t.host_input), t.input_bytes});
    }
    // One decode group per task: the target frames, then check-only ops for
    // the segments it does not restore (their stored bytes' CRC only).
    const uint32_t group = static_cast<uint32_t>(s.ops.size());
    std::vector<bool> target(t.header.segments.size(), false);
    for (const Target& tg : t.targets) {
      const SegmentPos& seg = t.header.segments[tg.slot];
      target[tg.slot] = true;
      gpu::DecodeOp& op = s.ops.emplace_back();
      op.frame = t.input + seg.offset;
      op.frame_size = seg.size;
      op.out = tg.dst;
      op.out_size = tg.bytes;
      op.segment_crc = t.header.crcs[tg.slot];
      op.dtype = static_cast<uint8_t>(t.codec.info.dtype);
      if (tq) op.param = t.codec.info.head_dim;
      op.group = group;
      s.op_task.push_back(k);
      s.op_slot.push_back(tg.slot);
    }
    for (uint32_t j = 0; j < t.header.segments.size(); ++j) {
      if (target[j]) continue;
      gpu::DecodeOp& op = s.ops.emplace_back();
      op.frame = t.input + t.header.segments[j].offset;
      op.frame_size = t.header.segments[j].size;
      op.segment_crc = t.header.crcs[j];
      op.check_only = true;
      op.group = group;
      s.op_task.push_back(k);
      s.op_slot.push_back(j);
    }
  }
  Status st = h2d.empty() ? Status::OK() : d.CopyAsync(h2d, *s.stream);
  if (st.ok()) {
    st = s.decoder->DecodeAsync(batch[0].codec.id, batch[0].codec.info.head_dim, s.ops, *s.stream);
  }
  if (!st.ok()) {
    d.Synchronize(*s.stream).IgnoreError("draining after a failed enqueue");
    st = st.WithContext(h2d.empty() ? "GPU decode of an encoded object"
                                    : "H2D copy and GPU decode of an encoded object");
    const CodecMetrics::Series& series = o_.metrics->of(batch[0].codec.id);
    for (Status& f : s.failed) {
      series.decode.failures->Inc();
      f = st;
    }
    s.ops.clear();
  }
  if (o_.cost_enqueue) o_.cost_enqueue->Observe(Since(s.start));
}

std::vector<Status> GpuDecodeLane::Complete(Stage& s) {
  std::vector<Status> out = std::move(s.failed);
  if (s.ops.empty()) return out;  // the enqueue failed: nothing ran
  const CodecMetrics::Series& series = o_.metrics->of(s.batch[0].codec.id);
  const auto wait_start = std::chrono::steady_clock::now();
  Result<std::vector<gpu::DecodeResult>> done = s.decoder->Finish(*s.stream);
  if (o_.cost_wait) o_.cost_wait->Observe(Since(wait_start));
  if (!done.ok()) {
    o_.device->Synchronize(*s.stream).IgnoreError("draining after a failed decode");
    const Status st = done.status().WithContext("GPU decode of an encoded object");
    for (Status& o : out) {
      series.decode.failures->Inc();
      o = st;
    }
    return out;
  }
  for (size_t i = 0; i < done->size(); ++i) {
    const gpu::DecodeResult& r = (*done)[i];
    const size_t k = s.op_task[i];
    if (r.status.ok() || r.check == gpu::DecodeCheck::kSibling || !out[k].ok()) continue;
    // The first failure of a task is its result, counted once.
    if (r.check == gpu::DecodeCheck::kSegmentCrc) {
      series.crc_failures->Inc();
    } else {
      series.decode.failures->Inc();
    }
    out[k] = Status::Corruption("slot " + std::to_string(s.op_slot[i]) +
                                " of an encoded object: " + std::string(r.status.message()));
  }
  uint64_t frames_bytes = 0, raw_bytes = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (s.ops[i].check_only || !out[s.op_task[i]].ok()) continue;
    frames_bytes += s.ops[i].frame_size;
    raw_bytes += s.ops[i].out_size;
  }
  series.decode.bytes_in->Inc(frames_bytes);
  series.decode.bytes_out->Inc(raw_bytes);
  series.decode.seconds->Observe(Since(s.start));
  return out;
}

}  // namespace orbitkv
