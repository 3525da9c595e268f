// GpuDecodeLane: the GPU half of an encoded cuFile demand read (spec "Encoded
// demand reads") for one instance/device. It owns the codec arena (device
// memory in which the cuFile worker assembles encoded objects out of its two
// staging slots: the bounded GPU input), a frame decoder (gpu::FrameDecoder:
// CudaDecoder on CUDA, the CPU codec on the fake platform), its stream, and
// one thread, so the cuFile worker keeps polling its slots while objects
// decode. DRAM restores (dram_gpu_decode.h) use a lane of their own: their
// tasks name the encoded object's pinned pool bytes (Task::host_input), which
// the lane copies into the task's arena range first.
//
// The thread takes queued tasks of one codec in batches (up to max_frames
// segments): one H2D copy of their host inputs, one CRC32C launch over every
// segment, one prefix copy and one wait, then one DecodeAsync of every frame
// of the tasks that passed. Failures stay per task.
//
// Each submitted object (a task) is checked before a byte of it is decoded:
// a CRC32C kernel over every segment in the arena, compared on the host with
// the header's payload CRCs (a mismatch counted on crc_failures), and every
// target frame's prefix (magic, codec and version, dtype, decoded size, frame
// size, head_dim) copied to the host and matched; then the frames are decoded
// straight into the engine pages, the decoder checking each frame's prefix
// and own CRC32C again before it writes that frame. Any failure is a
// Corruption of the task, counted by codec (orbitkv_codec_*): a segment CRC
// mismatch or a prefix that does not match leaves every page untouched; a
// frame failing its own CRC (its segment CRC passed: a writer's bug or a
// resealed header) leaves its slot untouched while the other slots may be
// decoded; a frame malformed past its CRC leaves its slot unspecified.
// The task's arena range is returned before its `done` runs.
//
// Budget: Create reserves the arena and the decoder's scratch from the
// Manager's CodecBudget for the lane's life (ResourceExhausted when they do
// not fit); the destructor releases them.
//
// Thread-safety: TryTake, Give and Submit from any thread. `done` and
// on_space run on the lane thread (Give: on the caller's) with no lock held.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "gpu/platform.h"
#include "manager/storage_codec.h"
#include "store/object_format.h"

namespace orbitkv {

// First-fit allocation of 4 KiB aligned ranges of [0, bytes). Not thread-safe.
class RangeAllocator {
 public:
  explicit RangeAllocator(uint64_t bytes);
  std::optional<uint64_t> Take(uint64_t bytes);
  // REQUIRES: [offset, +bytes) came from Take(bytes) and was not given back.
  void Give(uint64_t offset, uint64_t bytes);
  uint64_t free_bytes() const;

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> size, disjoint, never adjacent
};

// What a GPU codec lane (this one, gpu_encode_lane.h) holds for its life:
// `budget_bytes` of the Manager's CodecBudget, its codec's device scratch
// plus an arena of whole 4 KiB units, the arena itself, a stream, an event
// and pinned host memory. Not thread-safe.
struct CodecLaneMemory {
  gpu::Device* device = nullptr;
  CodecBudget* budget = nullptr;
  uint64_t budget_bytes = 0;
  uint64_t arena_bytes = 0;  // set by Acquire
  gpu::DevPtr arena = 0;
  std::unique_ptr<gpu::Stream> stream;
  std::unique_ptr<gpu::Event> event;
  uint8_t* host = nullptr;
  // Reserves budget_bytes and makes the rest. ResourceExhausted when
  // `scratch` leaves no arena or the budget cannot hold the share (`what`
  // names the arena in the message); the platform's errors. On an error,
  // Free releases what was made.
  Status Acquire(uint64_t scratch, uint64_t host_bytes, const char* what);
  // Waits for the stream, then frees everything and releases the budget.
  // Idempotent.
  void Free();

 private:
  bool reserved_ = false;
};

struct GpuDecodeLaneOptions {
  gpu::Device* device = nullptr;
  uint64_t budget_bytes = 0;  // arena + decoder scratch, from `budget`
  CodecBudget* budget = nullptr;
  const CodecMetrics* metrics = nullptr;
  std::function<void()> on_space;  // a range went back to the arena
  // Segments one batch checks and frames it decodes (the decoder's batch);
  // at least kMaxSlotsPerGroup, so any one object fits.
  uint32_t max_frames = kMaxSlotsPerGroup;
};

class GpuDecodeLane {
 public:
  // ResourceExhausted when the budget cannot hold budget_bytes or the
  // decoder's scratch leaves no arena; the platform's errors otherwise.
  static Result<std::unique_ptr<GpuDecodeLane>> Create(GpuDecodeLaneOptions options);
  ~GpuDecodeLane();  // Close(), then frees the arena and releases the budget

  uint64_t capacity() const { return arena_bytes_; }  // the largest object it takes
  // A range of the arena for an object of `bytes`; nullopt when it is full.
  std::optional<gpu::DevPtr> TryTake(uint64_t bytes) EXCLUDES(mu_);
  // Returns a range no GPU work uses any more, without decoding it.
  void Give(gpu::DevPtr at, uint64_t bytes) EXCLUDES(mu_);

  struct Target {
    uint32_t slot = 0;    // the segment to decode
    gpu::DevPtr dst = 0;  // 16-byte aligned engine page bytes
    uint64_t bytes = 0;   // the slot's raw size
  };
  struct Task {
    gpu::DevPtr input = 0;  // from TryTake(input_bytes): the whole object
    uint64_t input_bytes = 0;
    // Pinned host bytes of the object (input_bytes), copied into `input` on
    // the lane's stream before the checks; null: `input` holds it already.
    // REQUIRES: valid until `done` runs.
    const uint8_t* host_input = nullptr;
    ParsedHeader header;  // parsed from the object's bytes and matched to its id
    NamespaceCodec codec;
    std::vector<Target> targets;
    std::function<void(Status)> done;
  };
  // Queues the task (after Close: done(Cancelled) at once, range returned).
  void Submit(Task task) EXCLUDES(mu_);
  // Queues the tasks together (they may share a batch), as Submit each.
  void SubmitBatch(std::vector<Task> tasks) EXCLUDES(mu_);
  // Decodes what is queued, then stops the thread.
  void Close() EXCLUDES(mu_);

 private:
  GpuDecodeLane() = default;
  void Loop() EXCLUDES(mu_);
  // Checks and decodes `batch` (one codec): a Status per task.
  std::vector<Status> Decode(std::span<const Task> batch);
  // The segments a task makes the batch check (its CRCs).
  static uint64_t Segments(const Task& t) { return t.header.segments.size(); }
  // The frame prefix `p` (host copy) of target `tg` is the one `t` expects.
  static Status CheckPrefix(const Task& t, const Target& tg, const uint8_t* p);
  void Free();

  GpuDecodeLaneOptions o_;
  CodecLaneMemory mem_;
  uint64_t arena_bytes_ = 0;  // mem_'s
  gpu::DevPtr arena_ = 0;
  std::unique_ptr<gpu::FrameDecoder> decoder_;
  gpu::Stream* stream_ = nullptr;  // mem_'s
  gpu::Event* event_ = nullptr;
  uint32_t* crcs_ = nullptr;     // pinned (mem_.host): max_frames CRC32C results, then
  uint8_t* prefixes_ = nullptr;  // max_frames frame prefixes
  std::vector<gpu::CrcOp> crc_ops_;
  std::vector<gpu::DecodeOp> ops_;

  Mutex mu_;
  CondVar cv_;
  RangeAllocator ranges_ GUARDED_BY(mu_){0};
  std::deque<Task> queue_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::once_flag joined_;
};

}  // namespace orbitkv
