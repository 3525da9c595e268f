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
// Begin orders the chunks after the caller stream's earlier work and End
// makes the caller stream wait for its last chunk, so the caller's next event
// covers it. Buffers, streams and events are created on first Begin (2 x chunk_bytes of
// device memory, outside the Manager's --pool-size) and kept until
// destruction. Calls of several threads serialise on a mutex for the enqueue
// only (the work itself runs in FIFO order on the internal streams), and not
// for the planning between a call's Chunks.
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
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "gpu/copy_kernels.h"
#include "gpu/staged_copy_plan.h"

namespace orbitkv::gpu {

class StagedMover {
 public:
  StagedMover(CopyDirection direction, StagingShape shape) : direction_(direction), shape_(shape) {}
  ~StagedMover();  // waits for its streams, then frees everything
  StagedMover(const StagedMover&) = delete;
  StagedMover& operator=(const StagedMover&) = delete;

  // A call's staged copies, in three steps (each takes the mover's mutex, so
  // other threads' chunks may run between a call's own):
  //   Begin:  the mover's next chunks wait for `caller`'s earlier work;
  //   Chunks: enqueues plan.chunks[first, last) (not plan.direct), as often
  //           as the caller has final chunks (StagedCopyPlanner);
  //   End:    `caller` waits for every chunk enqueued so far (the call's and
  //           any other thread's before them: the internal streams are FIFO).
  // Each returns the first CUDA error of a set-up, a refused copy or launch;
  // earlier chunks may be enqueued then, so a caller that Began calls End
  // even after an error, for its stream's next event to cover them.
  cudaError_t Begin(cudaStream_t caller);
  cudaError_t Chunks(const StagedCopyPlan& plan, size_t first, size_t last);
  // To the host, between Begin and End like Chunks: one chunk whose staging
  // bytes a kernel writes: fill(staging buffer address, work stream)
  // enqueues it (Device::GatherObjectsAsync's gather), then `spans` go to the
  // host, their src an offset into the staging buffer. REQUIRES: every span
  // within shape.chunk_bytes.
  cudaError_t FilledChunk(const std::function<cudaError_t(uint64_t, cudaStream_t)>& fill,
                          std::span<const CopyDesc> spans);
  cudaError_t End(cudaStream_t caller);
  // Device bytes allocated (0 before the first Enqueue).
  uint64_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }

 private:
  cudaError_t InitLocked() REQUIRES(mu_);
  cudaError_t ChunkLocked(const StagedCopyPlan& plan, const StagedCopyPlan::Chunk& chunk, int b)
      REQUIRES(mu_);
  // A chunk to the host through buffer b: once its last DMAs drained,
  // fill(work stream) writes it, then dma_ goes to the host.
  template <typename Fill>
  cudaError_t ToHostLocked(int b, const Fill& fill) REQUIRES(mu_);

  const CopyDirection direction_;
  const StagingShape shape_;
  Mutex mu_;
  bool ready_ GUARDED_BY(mu_) = false;
  // Set once by InitLocked, then only read (by calls holding mu_).
  void* buf_[2] GUARDED_BY(mu_) = {nullptr, nullptr};
  cudaStream_t xfer_ GUARDED_BY(mu_) = nullptr;  // DMA between host and staging
  cudaStream_t work_ GUARDED_BY(mu_) = nullptr;  // scatter / gather kernels
  cudaEvent_t filled_[2] GUARDED_BY(mu_) = {nullptr, nullptr};
  cudaEvent_t drained_[2] GUARDED_BY(mu_) = {nullptr, nullptr};
  cudaEvent_t entry_ GUARDED_BY(mu_) = nullptr;
  cudaEvent_t exit_ GUARDED_BY(mu_) = nullptr;
  int next_ GUARDED_BY(mu_) = 0;  // the buffer of the next chunk
  // Scratch of ChunkLocked (capacity kept): span DMAs and kernel pieces.
  std::vector<CopyDesc> dma_ GUARDED_BY(mu_);
  std::vector<CopyDesc> kernel_ GUARDED_BY(mu_);
  std::atomic<uint64_t> allocated_{0};
};

}  // namespace orbitkv::gpu
