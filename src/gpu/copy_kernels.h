// The two halves of Device::CopyAsync on CUDA (gpu/cuda_platform.h decides
// which op goes where):
//  * LaunchGatherScatter: ops between device memory of the current device
//    (cudaMalloc'd, IPC-opened, managed) run in a gather/scatter kernel. The
//    descriptors travel by value as kernel parameters, kCopyOpsPerLaunch per
//    launch, so nothing is staged in device memory and nothing outlives the
//    call. Each op gets one or more thread blocks (about kCopyBytesPerBlock
//    each); a pair of addresses congruent modulo 16 (8, 4, 2) copies its body
//    in 16 (8, 4, 2) byte words with byte-wise head and tail, others byte-wise.
//  * EnqueueEngineCopies: ops touching pinned host memory (or another device)
//    use the copy engines: cudaMemcpyBatchAsync calls where the runtime and
//    driver provide it (CUDA 12.8+), else one cudaMemcpyAsync(cudaMemcpyDefault)
//    per op. A driver that refuses the batch call (too old, not supported) is
//    remembered process-wide and the per-op path used from then on.
// Both enqueue on `stream` and return at once; ops must not overlap each other.
// They return the first CUDA error, of a refused launch or copy (earlier
// chunks may already be enqueued then); callers turn it into a Status with
// ORBITKV_CUDA_STATUS. Failures of the copies themselves show up at a later
// event. REQUIRES: the calling thread's current device is the stream's
// device. Thread-safe.
//
// C++17 and CUDA-runtime-API types only: included by .cu and .cc files alike.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace orbitkv::gpu {

// One copy: `bytes` from src to dst (device or UVA host addresses).
struct CopyDesc {
  uint64_t dst = 0;
  uint64_t src = 0;
  uint64_t bytes = 0;
};

// Ops per kernel launch: a call of up to kCopyOpsPerLaunch ops passes a
// parameter block under 4 KiB; a larger call launches kCopyOpsPerLargeLaunch
// ops at a time (28 KiB of parameters, CUDA 12.1+ on Volta and later), so its
// host cost is a few launches, not one per 128 ops.
inline constexpr size_t kCopyOpsPerLaunch = 128;
inline constexpr size_t kCopyOpsPerLargeLaunch = 1024;
// The share of one op a thread block copies (larger ops get more blocks).
inline constexpr uint64_t kCopyBytesPerBlock = 32u << 10;

// Enqueues ceil(count / kCopyOpsPerLaunch) kernel launches for at most
// kCopyOpsPerLaunch non-empty ops, else ceil(count / kCopyOpsPerLargeLaunch). Zero-byte ops are
// allowed (no-ops). REQUIRES: every address is device memory the current
// device can access in a kernel.
cudaError_t LaunchGatherScatter(const CopyDesc* ops, size_t count, cudaStream_t stream);

// Ops per cudaMemcpyBatchAsync call of EnqueueEngineCopies.
inline constexpr size_t kEngineOpsPerBatch = 128;

// Enqueues the ops on the copy engines, at most kEngineOpsPerBatch per
// cudaMemcpyBatchAsync call. `first_batch` (0: kEngineOpsPerBatch) is the
// first call's share, each later call's twice the one before, up to
// kEngineOpsPerBatch: the copy engines start moving the first ops while the
// rest are enqueued. *batched (optional) is set to whether
// cudaMemcpyBatchAsync carried them (the last call's). REQUIRES: every op has bytes > 0;
// `stream` is not the legacy default stream (cudaMemcpyBatchAsync refuses it).
cudaError_t EnqueueEngineCopies(const CopyDesc* ops, size_t count, cudaStream_t stream,
                                bool* batched = nullptr, size_t first_batch = 0);

// Whether this build's runtime has cudaMemcpyBatchAsync and the driver has not
// refused it so far.
bool EngineBatchCopyAvailable();

}  // namespace orbitkv::gpu
