// GpuEncodeLane: the GPU half of an encoded cuFile writeback (spec "Optional
// GPU storage encoding also supports direct cuFile payloads") for one
// instance/device. It owns the codec arena (device memory holding encoded
// objects from their encode until their disk write completed), a frame
// encoder (gpu::FrameEncoder: CudaEncoder on CUDA, the CPU codec on the fake
// platform), its stream, pinned results and one thread, so the cuFile worker
// keeps polling its slots while groups encode.
//
// A task is one complete group: every slot's raw bytes in engine pages. Its
// arena range (Bound(): the header plus each slot's MaxEncodedSize, each at a
// 512 boundary) is taken at Submit. On the lane thread the frames are encoded
// into the range, their CRC32Cs computed on the GPU, and the object header
// (codec id and version, the frame sizes and CRCs: store/object_format.h)
// built on the host. The object is then described by Encoded: its header and
// where each frame lies in the arena and goes in the object (SegmentLayout of
// the frame sizes), byte for byte the object the CPU's EncodeObject writes.
// `encoded` then runs on the lane thread; the range stays taken until
// Release (the caller's disk write completed). A failed encode is counted
// (orbitkv_codec_failures_total{op="encode"}) and gives its range back
// before `encoded` sees the error.
//
// Budget: Create reserves the arena and the encoder's scratch from the
// Manager's CodecBudget for the lane's life (ResourceExhausted when they do
// not fit); the destructor releases them.
//
// Thread-safety: Submit and Release from any thread; CopyToHost only from
// `encoded` (the lane thread). `encoded` runs with no lock held.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "gpu/platform.h"
#include "manager/gpu_decode_lane.h"
#include "manager/storage_codec.h"
#include "orbitkv/metrics.h"
#include "store/object_id.h"

namespace orbitkv {

struct GpuEncodeLaneOptions {
  gpu::Device* device = nullptr;
  uint64_t budget_bytes = 0;  // arena + encoder scratch, from `budget`
  CodecBudget* budget = nullptr;
  const CodecMetrics* metrics = nullptr;
  Histogram* seconds = nullptr;  // optional: one object's encode, CRCs and header
};

class GpuEncodeLane {
 public:
  // Groups of more slots take the CPU path (the encoder's batch).
  static constexpr uint32_t kMaxSegments = 512;

  // ResourceExhausted when the budget cannot hold budget_bytes or the
  // encoder's scratch leaves no arena; the platform's errors otherwise.
  static Result<std::unique_ptr<GpuEncodeLane>> Create(GpuEncodeLaneOptions options);
  ~GpuEncodeLane();  // Close(), then frees the arena and releases the budget

  uint64_t capacity() const { return arena_bytes_; }
  // The arena bytes a group of `slot_bytes` encoded by `c` takes.
  static uint64_t Bound(const NamespaceCodec& c, const std::vector<uint64_t>& slot_bytes);

  // One encoded object in the arena.
  struct Frame {
    uint64_t object_offset = 0;  // where it goes in the object
    uint64_t bytes = 0;          // the frame's size
    gpu::DevPtr src = 0;         // where it is in the arena
  };
  struct Encoded {
    uint64_t object_size = 0;     // header + frames (unaligned)
    std::vector<uint8_t> header;  // the object's header bytes
    std::vector<Frame> frames;    // in slot order
    gpu::DevPtr range = 0;        // the arena range, for Release
    uint64_t range_bytes = 0;
  };
  struct Task {
    ObjectId id;
    NamespaceCodec codec;              // REQUIRES: !codec.raw()
    std::vector<uint64_t> slot_bytes;  // the group's raw slot sizes, slot order
    std::vector<gpu::DevPtr> sources;  // each slot's bytes, 16-byte aligned
    std::function<void(Result<Encoded>)> encoded;
  };
  // Takes the task's arena range and queues it. InvalidArgument for a task
  // the lane cannot encode (more than kMaxSegments slots, misaligned
  // sources); Busy when the arena has no room now (nothing taken);
  // Cancelled after Close.
  Status Submit(Task task) EXCLUDES(mu_);
  // Copies the whole object (header, frames, zeros between them) to pinned
  // host memory [dst, +object_size). REQUIRES: on the lane thread, inside
  // `encoded`, before Release of `e`.
  Status CopyToHost(const Encoded& e, uint8_t* dst);
  // Gives an encoded object's range back (no GPU work uses it any more).
  void Release(gpu::DevPtr range, uint64_t range_bytes) EXCLUDES(mu_);
  // Tasks not started yet see Cancelled; the one encoding finishes. Then
  // stops the thread.
  void Close() EXCLUDES(mu_);

  uint64_t arena_free_bytes() const EXCLUDES(mu_);
  size_t queued() const EXCLUDES(mu_);

 private:
  GpuEncodeLane() = default;
  void Loop() EXCLUDES(mu_);
  Result<Encoded> Encode(const Task& t, gpu::DevPtr range, uint64_t range_bytes);
  void Free();

  GpuEncodeLaneOptions o_;
  CodecLaneMemory mem_;
  uint64_t arena_bytes_ = 0;  // mem_'s
  gpu::DevPtr arena_ = 0;
  std::unique_ptr<gpu::FrameEncoder> encoder_;
  gpu::Stream* stream_ = nullptr;  // mem_'s
  gpu::Event* event_ = nullptr;
  uint32_t* crcs_ = nullptr;  // pinned (mem_.host): kMaxSegments CRC32C results

  struct Queued {
    Task task;
    gpu::DevPtr range = 0;
    uint64_t range_bytes = 0;
  };
  mutable Mutex mu_;
  CondVar cv_;
  RangeAllocator ranges_ GUARDED_BY(mu_){0};
  std::deque<Queued> queue_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::once_flag joined_;
};

}  // namespace orbitkv
