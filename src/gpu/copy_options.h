// GpuCopyOptions: how the CUDA platform moves bytes between pinned host memory
// and device memory (Device::CopyAsync's host<->device ops: DRAM restores into
// and publishes from engine HBM). Declared once here with their defaults, read
// once from the environment when the platform is created:
//
//   ORBITKV_GPU_COPY=staged|engines|kernel   (default staged)
//     staged:  the ops' host side merged into large DMA transfers through a
//              bounded, double-buffered device staging area, then one scatter
//              (gather) kernel into (out of) the pages (gpu/staged_copy_plan.h)
//     engines: one copy-engine DMA per op (cudaMemcpyBatchAsync), the mover
//              before issue 18
//     kernel:  the gather kernel reading/writing mapped pinned memory directly
//              (zero copy)
//   ORBITKV_GPU_COPY_STAGING=SIZE            (default 8mib; 1mib..256mib)
//     one staging buffer; the staged mover allocates four per device on first
//     use (two per direction), outside --pool-size.
//   ORBITKV_GPU_COPY_DIRECT=SIZE             (default 32kib; 4kib..256mib)
//     staged: ops of at least SIZE skip the staging and go to the copy
//              engines as they are. The copy engines need no multiprocessor
//              time, so they keep their rate while an engine's kernels hold
//              the GPU (the GPU time-slices between processes' contexts, and
//              the staging's kernels wait for the Manager's slice); ops
//              smaller than SIZE are staged, since one DMA per small op is
//              slow even on an idle GPU. Measured on the H200 (issue 18,
//              docs/bench/history.md, session 9): 32 KiB slots at 98% of H2D through the
//              copy engines idle and 97% beside a busy GPU, staged 101% and
//              12%; 4 KiB slots 11% through the copy engines, staged 112%.
//   ORBITKV_GPU_WAIT_SPIN_US=N                (default 100; 0..100000)
//     Device::Wait (a copy job's event, as a request thread waits for it)
//     polls the event for up to N us, then sleeps until the GPU signals it
//     (events are made with cudaEventBlockingSync). Without it a wait spun
//     on a core for its whole length (the runtime's default scheduling with
//     one context and more cores), and a publish's 0.7-1.4 ms job waits, on
//     four request threads, were Manager CPU (issue 18's <= 0.1 s/GB). The
//     spin keeps short waits (one block's copy: tens of us) free of the
//     wake-up's latency. Waits the caller knows to be long do not spin
//     (Device::WaitLong: a Publish job with more of its call's jobs behind
//     it, a copy of gpu::kLongWaitBytes or more, an io_uring run's GPU check).
//   ORBITKV_GPU_COPY_FIRST_BATCH=N            (default 32; 0..128)
//     ops going to the copy engines as they are (engines; staged ops of the
//     direct size) are enqueued in cudaMemcpyBatchAsync calls of at most 128;
//     the first call takes N ops and each next one twice the last, so the
//     first bytes move while the rest are enqueued. 0: 128 per call. One
//     block of a split 8B layout (64 slots of 32 KiB): 32 + 32. Measured on
//     the H100 (issue 18, docs/bench/history.md, session 22): the one-block
//     probes' p50 through the Manager 125-127 us with 0 against 102-117 with
//     32 (Qwen3-8B 123-140 against 89-92), the copy's wait after its enqueue
//     43-59 us against 31-37; large restores unchanged.
//
// Pure parsing, no CUDA: built and tested everywhere.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "orbitkv/status.h"

namespace orbitkv::gpu {

enum class HostCopyMode { kStaged, kEngines, kKernel };

std::string_view HostCopyModeName(HostCopyMode mode);

struct GpuCopyOptions {
  HostCopyMode mode = HostCopyMode::kStaged;
  uint64_t staging_bytes = 8u << 20;
  uint64_t direct_bytes = 32u << 10;  // ORBITKV_GPU_COPY_DIRECT
  uint32_t wait_spin_us = 100;        // ORBITKV_GPU_WAIT_SPIN_US
  uint32_t engine_first_batch = 32;   // ORBITKV_GPU_COPY_FIRST_BATCH
  // Device memory the staged mover holds per device once used.
  uint64_t StagingBudget() const { return mode == HostCopyMode::kStaged ? 4 * staging_bytes : 0; }
  std::string Describe() const;  // "staged (4 x 8 MiB device staging)"
};

inline constexpr const char* kGpuCopyEnv = "ORBITKV_GPU_COPY";
inline constexpr const char* kGpuCopyStagingEnv = "ORBITKV_GPU_COPY_STAGING";
inline constexpr const char* kGpuCopyDirectEnv = "ORBITKV_GPU_COPY_DIRECT";
inline constexpr const char* kGpuWaitSpinEnv = "ORBITKV_GPU_WAIT_SPIN_US";
inline constexpr const char* kGpuFirstBatchEnv = "ORBITKV_GPU_COPY_FIRST_BATCH";

// From the values (null: unset). InvalidArgument naming the variable and the
// accepted values.
Result<GpuCopyOptions> ParseGpuCopyOptions(const char* mode, const char* staging,
                                           const char* direct = nullptr,
                                           const char* wait_spin_us = nullptr,
                                           const char* first_batch = nullptr);
// ParseGpuCopyOptions of the five variables.
Result<GpuCopyOptions> GpuCopyOptionsFromEnvironment();

}  // namespace orbitkv::gpu
