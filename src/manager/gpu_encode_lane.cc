#include "manager/gpu_encode_lane.h"

#include <cstring>

#include "common/thread_name.h"
#include "orbitkv/units.h"
#include "store/object_format.h"

namespace orbitkv {
namespace {

constexpr uint64_t kRangeAlign = 4096;  // the arena's unit (RangeAllocator)

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Where slot k's frame is encoded in a range: the header first, then each
// slot's MaxEncodedSize at the next 512 boundary (EncodeObject's bound).
std::vector<uint64_t> EncodePlaces(const NamespaceCodec& c, const std::vector<uint64_t>& slots,
                                   uint64_t* end) {
  std::vector<uint64_t> at;
  uint64_t e = ObjectHeaderSize(static_cast<uint32_t>(slots.size()));
  for (uint64_t bytes : slots) {
    at.push_back(AlignUp(e, kObjectAlign));
    e = at.back() + codec::MaxEncodedSize(c.id, c.info, bytes);
  }
  *end = e;
  return at;
}

}  // namespace

uint64_t GpuEncodeLane::Bound(const NamespaceCodec& c, const std::vector<uint64_t>& slot_bytes) {
  uint64_t end = 0;
  EncodePlaces(c, slot_bytes, &end);
  return AlignUp(end, kRangeAlign);
}

Result<std::unique_ptr<GpuEncodeLane>> GpuEncodeLane::Create(GpuEncodeLaneOptions o) {
  if (!o.device || !o.budget || !o.metrics) {
    return Status::InvalidArgument("GpuEncodeLane: device, budget and metrics are required");
  }
  std::unique_ptr<GpuEncodeLane> lane(new GpuEncodeLane());
  GpuEncodeLane& l = *lane;
  l.o_ = std::move(o);
  gpu::Device& d = *l.o_.device;
  Status st = [&]() -> Status {
    ORBITKV_ASSIGN_OR_RETURN(l.encoder_, d.CreateFrameEncoder(kMaxSegments));
    l.mem_.device = &d;
    l.mem_.budget = l.o_.budget;
    l.mem_.budget_bytes = l.o_.budget_bytes;
    ORBITKV_RETURN_IF_ERROR(
        l.mem_.Acquire(l.encoder_->scratch_bytes(), sizeof(uint32_t) * kMaxSegments, "encode"));
    l.arena_bytes_ = l.mem_.arena_bytes;
    l.arena_ = l.mem_.arena;
    l.stream_ = l.mem_.stream.get();
    l.event_ = l.mem_.event.get();
    l.crcs_ = reinterpret_cast<uint32_t*>(l.mem_.host);
    return Status::OK();
  }();
  if (!st.ok()) {
    l.Free();
    return st.WithContext("GPU encode lane on device " + std::to_string(d.ordinal()));
  }
  {
    MutexLock g(l.mu_);
    l.ranges_ = RangeAllocator(l.arena_bytes_);
  }
  GpuEncodeLane* p = lane.get();
  l.thread_ = std::thread([p] { p->Loop(); });
  return lane;
}

GpuEncodeLane::~GpuEncodeLane() {
  Close();
  Free();
}

void GpuEncodeLane::Free() {
  if (stream_) o_.device->Synchronize(*stream_).IgnoreError("encode lane teardown");
  encoder_.reset();
  mem_.Free();
  stream_ = nullptr;
  event_ = nullptr;
  crcs_ = nullptr;
  arena_ = 0;
}

Status GpuEncodeLane::Submit(Task t) {
  if (t.codec.raw() || !t.encoded || t.slot_bytes.empty() ||
      t.sources.size() != t.slot_bytes.size()) {
    return Status::InvalidArgument("GPU encode: a raw codec, no slots or no callback");
  }
  if (t.slot_bytes.size() > kMaxSegments) {
    return Status::InvalidArgument("GPU encode: " + std::to_string(t.slot_bytes.size()) +
                                   " slots, the encoder takes " + std::to_string(kMaxSegments));
  }
  for (gpu::DevPtr s : t.sources) {
    if (s == 0 || s % 16 != 0) {
      return Status::InvalidArgument("GPU encode: a slot's bytes are not 16-byte aligned");
    }
  }
  const uint64_t need = Bound(t.codec, t.slot_bytes);
  {
    MutexLock l(mu_);
    if (closing_) return Status::Cancelled("GPU encode lane closed");
    std::optional<uint64_t> at = ranges_.Take(need);
    if (!at) {
      return Status::Busy("GPU encode arena: no " + FormatByteSize(need) + " free of " +
                          FormatByteSize(arena_bytes_));
    }
    queue_.push_back({std::move(t), arena_ + *at, need});
  }
  cv_.NotifyAll();
  return Status::OK();
}

void GpuEncodeLane::Release(gpu::DevPtr range, uint64_t range_bytes) {
  MutexLock l(mu_);
  ranges_.Give(range - arena_, range_bytes);
}

uint64_t GpuEncodeLane::arena_free_bytes() const {
  MutexLock l(mu_);
  return ranges_.free_bytes();
}

size_t GpuEncodeLane::queued() const {
  MutexLock l(mu_);
  return queue_.size();
}

void GpuEncodeLane::Close() {
  std::deque<Queued> cancelled;
  {
    MutexLock l(mu_);
    closing_ = true;
    cancelled.swap(queue_);
  }
  cv_.NotifyAll();
  for (Queued& q : cancelled) {
    Release(q.range, q.range_bytes);
    q.task.encoded(Status::Cancelled("GPU encode lane closed before the group was encoded"));
  }
  std::call_once(joined_, [&] {
    if (thread_.joinable()) thread_.join();
  });
}

void GpuEncodeLane::Loop() {
  SetThreadName("okv-gpu-encode");
  while (true) {
    Queued q;
    {
      MutexLock l(mu_);
      while (queue_.empty() && !closing_) cv_.Wait(mu_);
      if (queue_.empty()) return;  // closing (Close cancelled what was queued)
      q = std::move(queue_.front());
      queue_.pop_front();
    }
    Result<Encoded> e = Encode(q.task, q.range, q.range_bytes);
    if (!e.ok()) Release(q.range, q.range_bytes);
    q.task.encoded(std::move(e));
  }
}

Result<GpuEncodeLane::Encoded> GpuEncodeLane::Encode(const Task& t, gpu::DevPtr range,
                                                     uint64_t range_bytes) {
  const auto start = std::chrono::steady_clock::now();
  const CodecMetrics::Op& op = o_.metrics->of(t.codec.id).encode;
  gpu::Device& d = *o_.device;
  uint64_t end = 0;
  const std::vector<uint64_t> places = EncodePlaces(t.codec, t.slot_bytes, &end);
  std::vector<gpu::EncodeOp> ops;
  for (size_t k = 0; k < t.slot_bytes.size(); ++k) {
    ops.push_back({t.sources[k], t.slot_bytes[k], range + places[k],
                   codec::MaxEncodedSize(t.codec.id, t.codec.info, t.slot_bytes[k])});
  }
  auto fail = [&](Status st) {
    d.Synchronize(*stream_).IgnoreError("draining after a failed GPU encode");
    op.failures->Inc();
    return st.WithContext("GPU encode of a " + std::string(codec::CodecName(t.codec.id)) +
                          " object");
  };
  Status st = encoder_->EncodeAsync(t.codec.id, t.codec.info, ops, *stream_);
  if (!st.ok()) return fail(st);
  Result<std::vector<uint64_t>> sizes = encoder_->Finish(*stream_);
  if (!sizes.ok()) return fail(sizes.status());
  if (sizes->size() != ops.size()) {
    return fail(Status::Internal("the encoder gave " + std::to_string(sizes->size()) +
                                 " frame sizes for " + std::to_string(ops.size()) + " segments"));
  }
  std::vector<gpu::CrcOp> crc_ops;
  for (size_t k = 0; k < ops.size(); ++k) {
    const uint64_t n = (*sizes)[k];
    if (n == 0 || n > ops[k].frame_capacity) {
      return fail(Status::Internal("the encoder gave a frame of " + std::to_string(n) +
                                   " bytes for a buffer of " +
                                   std::to_string(ops[k].frame_capacity)));
    }
    crc_ops.push_back({ops[k].frame, n});
  }
  // The segment table's payload CRC32C of every frame, from the GPU.
  st = d.Crc32cAsync(crc_ops, crcs_, *stream_);
  if (st.ok()) st = d.Record(*event_, *stream_);
  if (st.ok()) st = d.Wait(*event_);
  if (!st.ok()) return fail(st.WithContext("CRC32C of the frames"));
  Encoded e;
  e.range = range;
  e.range_bytes = range_bytes;
  const std::vector<SegmentPos> layout = SegmentLayout(*sizes);
  e.object_size = ObjectSize(*sizes);
  e.header.resize(ObjectHeaderSize(static_cast<uint32_t>(sizes->size())));
  WriteObjectHeader(t.id, *sizes, t.codec.object_codec(),
                    std::span<const uint32_t>(crcs_, sizes->size()), e.header);
  uint64_t raw_bytes = 0, coded_bytes = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    e.frames.push_back({layout[k].offset, (*sizes)[k], ops[k].frame});
    raw_bytes += t.slot_bytes[k];
    coded_bytes += (*sizes)[k];
  }
  op.bytes_in->Inc(raw_bytes);
  op.bytes_out->Inc(coded_bytes);
  const double seconds = Since(start);
  op.seconds->Observe(seconds);
  if (o_.seconds) o_.seconds->Observe(seconds);
  return e;
}

Status GpuEncodeLane::CopyToHost(const Encoded& e, uint8_t* dst) {
  gpu::Device& d = *o_.device;
  std::memcpy(dst, e.header.data(), e.header.size());
  std::memset(dst + e.header.size(), 0, e.object_size - e.header.size());
  std::vector<gpu::CopyOp> ops;
  for (const Frame& f : e.frames) {
    ops.push_back({reinterpret_cast<gpu::DevPtr>(dst + f.object_offset), f.src, f.bytes});
  }
  Status st = d.CopyAsync(ops, *stream_);
  if (st.ok()) st = d.Record(*event_, *stream_);
  if (st.ok()) st = d.Wait(*event_);
  if (!st.ok()) {
    d.Synchronize(*stream_).IgnoreError("draining after a failed D2H of an encoded object");
    return st.WithContext("copying an encoded object to pinned memory");
  }
  return Status::OK();
}

}  // namespace orbitkv
