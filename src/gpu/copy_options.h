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
  // Device memory the staged mover holds per device once used.
  uint64_t StagingBudget() const { return mode == HostCopyMode::kStaged ? 4 * staging_bytes : 0; }
  std::string Describe() const;  // "staged (4 x 8 MiB device staging)"
};

inline constexpr const char* kGpuCopyEnv = "ORBITKV_GPU_COPY";
inline constexpr const char* kGpuCopyStagingEnv = "ORBITKV_GPU_COPY_STAGING";

// From the two values (null: unset). InvalidArgument naming the variable and
// the accepted values.
Result<GpuCopyOptions> ParseGpuCopyOptions(const char* mode, const char* staging);
// ParseGpuCopyOptions(getenv(kGpuCopyEnv), getenv(kGpuCopyStagingEnv)).
Result<GpuCopyOptions> GpuCopyOptionsFromEnvironment();

}  // namespace orbitkv::gpu
