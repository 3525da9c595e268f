// CudaPages: the hooks through which the GPU storage tier gives orbitkv-bench
// CUDA pages and GPU copy ceilings. Built from cuda_pages_none.cc (every hook
// says Unavailable) unless the GPU tier adds a CUDA implementation and picks it
// in src/bench/CMakeLists.txt, the way src/gpu chooses host_memory_hooks_*.cc.
// No CUDA type appears here, so the drivers compile without the toolkit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/page_target.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

// True when this build has CUDA pages (a CUDA implementation of these hooks).
bool CudaPagesBuilt();

// OK when `device` ("cuda:N") can hold pages here: a CUDA build and device N
// present. Unavailable naming the device otherwise (checked before any work).
Status CheckCudaPagesDevice(const std::string& device);

// REQUIRES: ParseDevice(device) is a CUDA device. A target whose regions
// (those of `layout`: split, page-first, a hybrid model's groups) are
// cudaMalloc allocations on the device, registered by IPC handle.
Result<std::unique_ptr<PageTarget>> CreateCudaPageTarget(const std::string& device,
                                                         const InstanceLayout& layout);

// Copy ceilings on a CUDA device for `block_bytes` copies over `seconds`:
// pinned host -> device, device -> pinned host, device -> device, in bytes/s.
struct CudaCopyCeilings {
  double h2d = 0, d2h = 0, d2d = 0;
};
Result<CudaCopyCeilings> MeasureCudaCopyCeilings(const std::string& device, uint64_t block_bytes,
                                                 double seconds);

}  // namespace orbitkv::bench
