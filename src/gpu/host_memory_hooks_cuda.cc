#include "gpu/cuda_device.h"
#include "gpu/host_memory_hooks.h"
#include "orbitkv/logging.h"

namespace orbitkv {

HostMemoryHooks GetHostMemoryHooks() {
  HostMemoryHooks h;
  Result<int> n = gpu::DeviceCount();
  if (!n.ok() || *n == 0) {
    h.description = "no CUDA device: pool not registered";
    return h;
  }
  h.description = "registered with CUDA (cudaHostRegister)";
  h.register_memory = [](void* base, uint64_t size) { return gpu::RegisterHostMemory(base, size); };
  h.unregister_memory = [](void* base) {
    gpu::UnregisterHostMemory(base).IgnoreError("unregistering at shutdown; logged by the check");
  };
  return h;
}

}  // namespace orbitkv
