// CreateDefaultPlatform: the GPU seam (gpu/platform.h) the Manager runs on.
// The CUDA platform (gpu/cuda_platform.h) when this build has CUDA and the
// host has a usable device; otherwise nullptr, with *why saying which ("this
// build has no CUDA", "no CUDA device: ..."), and the Manager runs without
// the GPU tier. Two sources, like the host memory hooks: one for CUDA builds,
// a stub for the rest, both in orbitkv_gpu_hooks. Loads no cuFile (that is
// Platform::OpenStorage's job). Thread-safe; the caller owns the result.
#pragma once

#include <memory>
#include <string>

#include "gpu/platform.h"

namespace orbitkv::gpu {

// REQUIRES: why != nullptr (set only when nullptr is returned).
std::unique_ptr<Platform> CreateDefaultPlatform(std::string* why);

}  // namespace orbitkv::gpu
