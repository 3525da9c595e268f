// HostMemoryHooks: how the Manager registers its pinned DRAM pool and read
// staging with the GPU runtime, so H2D/D2H copies (and cuFile's host bounce)
// run at pinned-memory speed. Always available: in a build without CUDA, or
// on a host without a GPU, the hooks are empty and nothing is registered.
// The one place the rest of the tree learns whether CUDA is there.
#pragma once

#include <cstdint>
#include <functional>

#include "orbitkv/status.h"

namespace orbitkv {

struct HostMemoryHooks {
  std::function<Status(void* base, uint64_t size)> register_memory;  // empty: none
  std::function<void(void* base)> unregister_memory;
  const char* description = "no CUDA";  // for the startup log
};

HostMemoryHooks GetHostMemoryHooks();

}  // namespace orbitkv
