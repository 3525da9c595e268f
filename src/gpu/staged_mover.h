// StagedMover: the staged host<->device mover of one CUDA device and one
// direction (ORBITKV_GPU_COPY=staged, gpu/copy_options.h). It executes a
// StagedCopyPlan (gpu/staged_copy_plan.h) through two device staging buffers
// of shape.chunk_bytes, double-buffered over two internal streams so that the
// DMA of one chunk overlaps the scatter (gather) kernel of the previous one:
//
//   to the device: xfer: wait drained[b]; span DMAs host -> buf[b]; filled[b]
//                  work: wait filled[b]; scatter buf[b] -> pages; drained[b]
//   to the host:   work: wait drained[b]; gather pages -> buf[b]; filled[b]
//                  xfer: wait filled[b]; span DMAs buf[b] -> host; drained[b]
//
// Enqueue orders the plan after the caller stream's earlier work and makes the
// caller stream wait for its last chunk, so the caller's next event covers it.
// Buffers, streams and events are created on first Enqueue (2 x chunk_bytes of
// device memory, outside the Manager's --pool-size) and kept until
// destruction. Calls of several threads serialise on a mutex for the enqueue
// only (the work itself runs in FIFO order on the internal streams).
// Coupling: the internal streams are shared by every caller stream of the
// device, in enqueue order, so a caller stream still busy before its staged
// copies (cuFile I/O, a held host function) would delay the staged copies
// other streams enqueue after it. The CUDA platform therefore stages only
// from caller streams with nothing pending (cudaStreamQuery) and sends a busy
// stream's copies to the copy engines on that stream.
// REQUIRES: the calling thread's current device is the mover's device.
// CUDA builds only (C++20, CUDA runtime API types).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "gpu/staged_copy_plan.h"

namespace orbitkv::gpu {

class StagedMover {
 public:
  StagedMover(CopyDirection direction, StagingShape shape) : direction_(direction), shape_(shape) {}
  ~StagedMover();  // waits for its streams, then frees everything
  StagedMover(const StagedMover&) = delete;
  StagedMover& operator=(const StagedMover&) = delete;

  // Enqueues plan.chunks (not plan.direct), then calls `beside` (which may
  // enqueue other work on `caller` that runs concurrently with the chunks),
  // then makes `caller` wait for the chunks. Returns the first CUDA error (of
  // a set-up, a refused copy or launch, or `beside`'s); earlier chunks may be
  // enqueued then.
  cudaError_t Enqueue(const StagedCopyPlan& plan, cudaStream_t caller,
                      const std::function<cudaError_t()>& beside);
  // Device bytes allocated (0 before the first Enqueue).
  uint64_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }

 private:
  cudaError_t InitLocked();
  cudaError_t ChunkLocked(const StagedCopyPlan& plan, const StagedCopyPlan::Chunk& chunk, int b);

  const CopyDirection direction_;
  const StagingShape shape_;
  std::mutex mu_;
  bool ready_ = false;  // guarded by mu_
  void* buf_[2] = {nullptr, nullptr};
  cudaStream_t xfer_ = nullptr;  // DMA between host and staging
  cudaStream_t work_ = nullptr;  // scatter / gather kernels
  cudaEvent_t filled_[2] = {nullptr, nullptr};
  cudaEvent_t drained_[2] = {nullptr, nullptr};
  cudaEvent_t entry_ = nullptr;
  cudaEvent_t exit_ = nullptr;
  int next_ = 0;  // guarded by mu_: the buffer of the next chunk
  std::atomic<uint64_t> allocated_{0};
};

}  // namespace orbitkv::gpu
