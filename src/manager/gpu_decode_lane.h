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
// The lane's thread takes queued tasks of one codec in batches (up to
// max_frames segments and max_batch_bytes of input) and enqueues each batch on one of up to three
// pipeline stages (a stream and a frame decoder each): one H2D copy of their
// host inputs, then one DecodeAsync of every segment of every task. A second
// thread finishes the stages in order, so the next batches' H2D copies run
// while the previous one decodes. A share too small for the stages' decoder
// scratch to stay within a quarter of it gets fewer stages (at least one).
// Failures stay per task.
//
// Each submitted object (a task) is checked on the GPU before a byte of it
// is decoded: every segment's stored bytes against the header's payload
// CRC32C (segments the task does not restore are checked too: check-only
// ops), and every target frame's prefix (magic, codec and version, dtype,
// decoded size, frame size, head_dim) and own CRC32C. A task's segments are
// one decode group, so any of these failing leaves every page of the task
// untouched; it is a Corruption of the task, counted by codec (orbitkv_codec_*:
// crc_failures for a segment CRC, decode failures for the rest). A frame
// malformed past its checks leaves its slot unspecified (a decode failure).
// The task's arena range is returned before its `done` runs.
//
// Budget: Create reserves the arena and the decoder's scratch from the
// Manager's CodecBudget for the lane's life (ResourceExhausted when they do
// not fit); the destructor releases them.
//
// Thread-safety: TryTake, Give and Submit from any thread. `done` and
// on_space run on the lane's finishing thread (Give: on the caller's; both
// on the caller's after Close) with no lock held.
#pragma once

#include <chrono>
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
#include "orbitkv/metrics.h"
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
  // Reserves budget_bytes and makes the rest (no pinned host memory when
  // host_bytes is 0). ResourceExhausted when
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
  // Segments one batch checks and decodes (a decoder's batch); at least
  // kMaxSlotsPerGroup, so any one object fits.
  uint32_t max_frames = kMaxSlotsPerGroup;
  // Encoded bytes one batch holds at most (a task larger than it is a batch
  // of its own); 0: the arena / (stages + 1). A batch's ranges come back only
  // when it completes, so a batch that took the whole arena would leave the
  // other stages, and the callers' next tasks, nothing: the pipeline would run
  // one batch at a time.
  uint64_t max_batch_bytes = 0;
  // Opt-in cost observations (ORBITKV_COST_OBSERVATIONS; null: none): the
  // host time to build and enqueue a batch, and a batch's wait for the GPU.
  Histogram* cost_enqueue = nullptr;
  Histogram* cost_wait = nullptr;
};

class GpuDecodeLane {
 public:
  // ResourceExhausted when the budget cannot hold budget_bytes or the
  // decoder's scratch leaves no arena; the platform's errors otherwise.
  static Result<std::unique_ptr<GpuDecodeLane>> Create(GpuDecodeLaneOptions options);
  ~GpuDecodeLane();  // Close(), then frees the arena and releases the budget

  uint64_t capacity() const { return arena_bytes_; }  // the largest object it takes
  int stages() const { return stages_n_; }            // pipeline stages (1 to 3)
  uint64_t max_batch_bytes() const { return batch_bytes_; }
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
  // A pipeline stage: one batch's GPU work at a time (on its own stream and
  // decoder, so one stage's H2D copy overlaps another's decode).
  struct Stage {
    std::unique_ptr<gpu::FrameDecoder> decoder;
    gpu::Stream* stream = nullptr;  // stage 0: mem_'s; the others: own_stream
    std::unique_ptr<gpu::Stream> own_stream;
    std::vector<Task> batch;
    std::vector<gpu::DecodeOp> ops;
    std::vector<size_t> op_task;    // ops[i] belongs to batch[op_task[i]]
    std::vector<uint32_t> op_slot;  // and is its segment op_slot[i]
    std::vector<Status> failed;     // per task, set before the GPU ran (enqueue)
    std::chrono::steady_clock::time_point start;
  };
  static constexpr int kMaxStages = 3;

  GpuDecodeLane() = default;
  void Loop() EXCLUDES(mu_);        // takes batches, enqueues them on free stages
  void FinishLoop() EXCLUDES(mu_);  // waits for enqueued stages in order, completes their tasks
  // Enqueues the stage's batch (one codec): the H2D copies and one
  // DecodeAsync. On a failure nothing runs on the GPU for the batch any more
  // and `failed` holds why for every task.
  void Enqueue(Stage& s);
  // Waits for the stage's GPU work; a Status per task of its batch.
  std::vector<Status> Complete(Stage& s);
  // The segments a task makes the batch check (its CRCs).
  static uint64_t Segments(const Task& t) { return t.header.segments.size(); }
  void Free();

  GpuDecodeLaneOptions o_;
  CodecLaneMemory mem_;
  uint64_t arena_bytes_ = 0;  // mem_'s
  gpu::DevPtr arena_ = 0;
  Stage stages_[kMaxStages];
  int stages_n_ = 0;          // in use
  uint64_t batch_bytes_ = 0;  // a batch's encoded bytes at most (o_.max_batch_bytes resolved)

  Mutex mu_;
  CondVar cv_;  // the queue, a free stage or an enqueued one changed, or closing
  RangeAllocator ranges_ GUARDED_BY(mu_){0};
  std::deque<Task> queue_ GUARDED_BY(mu_);
  std::deque<Stage*> free_ GUARDED_BY(mu_);      // stages without a batch
  std::deque<Stage*> enqueued_ GUARDED_BY(mu_);  // in order, for FinishLoop
  bool closing_ GUARDED_BY(mu_) = false;
  bool enqueuer_done_ GUARDED_BY(mu_) = false;  // Loop returned: nothing more is enqueued
  std::thread thread_, finisher_;
  std::once_flag joined_;
};

}  // namespace orbitkv
