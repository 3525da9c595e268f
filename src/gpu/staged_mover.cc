#include "gpu/staged_mover.h"

#include "gpu/cuda_check.h"
#include "gpu/cuda_device.h"

namespace orbitkv::gpu {

StagedMover::~StagedMover() {
  // Best effort: errors here are logged by the checks and not kept.
  if (xfer_) ORBITKV_CUDA_STATUS(cudaStreamSynchronize(xfer_)).IgnoreError("destroying a mover");
  if (work_) ORBITKV_CUDA_STATUS(cudaStreamSynchronize(work_)).IgnoreError("destroying a mover");
  for (cudaEvent_t e : {filled_[0], filled_[1], drained_[0], drained_[1], entry_, exit_}) {
    if (e) ORBITKV_CUDA_STATUS(cudaEventDestroy(e)).IgnoreError("destroying a mover");
  }
  for (cudaStream_t s : {xfer_, work_}) {
    if (s) ORBITKV_CUDA_STATUS(cudaStreamDestroy(s)).IgnoreError("destroying a mover");
  }
  ScopedRelaxedCaptureMode relaxed;
  for (void* p : buf_) {
    if (p) ORBITKV_CUDA_STATUS(cudaFree(p)).IgnoreError("destroying a mover");
  }
}

cudaError_t StagedMover::InitLocked() {
  if (ready_) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  {
    ScopedRelaxedCaptureMode relaxed;  // an engine thread may be capturing a graph
    for (void*& p : buf_) {
      if (p == nullptr && (err = cudaMalloc(&p, shape_.chunk_bytes)) != cudaSuccess) return err;
    }
  }
  for (cudaStream_t* s : {&xfer_, &work_}) {
    if (*s == nullptr && (err = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking)) != cudaSuccess)
      return err;
  }
  for (cudaEvent_t* e : {&filled_[0], &filled_[1], &drained_[0], &drained_[1], &entry_, &exit_}) {
    if (*e == nullptr && (err = cudaEventCreateWithFlags(e, cudaEventDisableTiming)) != cudaSuccess)
      return err;
  }
  ready_ = true;
  allocated_.store(2 * shape_.chunk_bytes, std::memory_order_relaxed);
  return cudaSuccess;
}

cudaError_t StagedMover::ChunkLocked(const StagedCopyPlan& plan, const StagedCopyPlan::Chunk& c,
                                     int b) {
  const auto staging = reinterpret_cast<uint64_t>(buf_[b]);
  const bool to_device = direction_ == CopyDirection::kToDevice;
  dma_.clear();
  for (size_t i = c.span_begin; i < c.span_end; ++i) {
    const StagedCopyPlan::Span& s = plan.spans[i];
    const uint64_t st = staging + s.staging_offset;
    dma_.push_back(to_device ? CopyDesc{st, s.host, s.bytes} : CopyDesc{s.host, st, s.bytes});
  }
  kernel_.clear();
  for (size_t i = c.piece_begin; i < c.piece_end; ++i) {
    const StagedCopyPlan::Piece& p = plan.pieces[i];
    const uint64_t st = staging + p.staging_offset;
    kernel_.push_back(to_device ? CopyDesc{p.device, st, p.bytes}
                                : CopyDesc{st, p.device, p.bytes});
  }
  cudaError_t err = cudaSuccess;
  if (to_device) {
    if ((err = cudaStreamWaitEvent(xfer_, drained_[b], 0)) != cudaSuccess) return err;
    if ((err = EnqueueEngineCopies(dma_.data(), dma_.size(), xfer_)) != cudaSuccess) return err;
    if ((err = cudaEventRecord(filled_[b], xfer_)) != cudaSuccess) return err;
    if ((err = cudaStreamWaitEvent(work_, filled_[b], 0)) != cudaSuccess) return err;
    if ((err = LaunchGatherScatter(kernel_.data(), kernel_.size(), work_)) != cudaSuccess) {
      return err;
    }
    return cudaEventRecord(drained_[b], work_);
  }
  const CopyDesc* const pieces = kernel_.data();
  const size_t count = kernel_.size();
  return ToHostLocked(
      b, [pieces, count](cudaStream_t work) { return LaunchGatherScatter(pieces, count, work); });
}

template <typename Fill>
cudaError_t StagedMover::ToHostLocked(int b, const Fill& fill) {
  cudaError_t err = cudaSuccess;
  if ((err = cudaStreamWaitEvent(work_, drained_[b], 0)) != cudaSuccess) return err;
  if ((err = fill(work_)) != cudaSuccess) return err;
  if ((err = cudaEventRecord(filled_[b], work_)) != cudaSuccess) return err;
  if ((err = cudaStreamWaitEvent(xfer_, filled_[b], 0)) != cudaSuccess) return err;
  if ((err = EnqueueEngineCopies(dma_.data(), dma_.size(), xfer_)) != cudaSuccess) return err;
  return cudaEventRecord(drained_[b], xfer_);
}

cudaError_t StagedMover::Begin(cudaStream_t caller) {
  MutexLock lock(mu_);
  cudaError_t err = InitLocked();
  if (err != cudaSuccess) return err;
  // After the caller's earlier work: the first stream of each chunk waits for
  // it (the second waits for the first).
  if ((err = cudaEventRecord(entry_, caller)) != cudaSuccess) return err;
  cudaStream_t first = direction_ == CopyDirection::kToDevice ? xfer_ : work_;
  return cudaStreamWaitEvent(first, entry_, 0);
}

cudaError_t StagedMover::Chunks(const StagedCopyPlan& plan, size_t first, size_t last) {
  MutexLock lock(mu_);
  if (!ready_) return cudaErrorNotReady;  // no Begin
  for (size_t i = first; i < last; ++i) {
    const cudaError_t err = ChunkLocked(plan, plan.chunks[i], next_);
    if (err != cudaSuccess) return err;
    next_ ^= 1;
  }
  return cudaSuccess;
}

cudaError_t StagedMover::FilledChunk(const std::function<cudaError_t(uint64_t, cudaStream_t)>& fill,
                                     std::span<const CopyDesc> spans) {
  MutexLock lock(mu_);
  if (!ready_) return cudaErrorNotReady;  // no Begin
  if (direction_ != CopyDirection::kToHost) return cudaErrorInvalidValue;
  const int b = next_;
  const auto staging = reinterpret_cast<uint64_t>(buf_[b]);
  dma_.clear();
  for (const CopyDesc& s : spans) dma_.push_back({s.dst, staging + s.src, s.bytes});
  const cudaError_t err = ToHostLocked(b, [&](cudaStream_t work) { return fill(staging, work); });
  if (err == cudaSuccess) next_ ^= 1;
  return err;
}

cudaError_t StagedMover::End(cudaStream_t caller) {
  MutexLock lock(mu_);
  if (!ready_) return cudaErrorNotReady;  // no Begin
  cudaStream_t last = direction_ == CopyDirection::kToDevice ? work_ : xfer_;
  cudaError_t err = cudaEventRecord(exit_, last);
  if (err != cudaSuccess) return err;
  return cudaStreamWaitEvent(caller, exit_, 0);
}

}  // namespace orbitkv::gpu
