#include "gpu/host_memory_hooks.h"

namespace orbitkv {

HostMemoryHooks GetHostMemoryHooks() {
  HostMemoryHooks h;
  h.description = "built without CUDA: pool not registered";
  return h;
}

}  // namespace orbitkv
