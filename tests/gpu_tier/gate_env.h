// GateEnv: where the GPU storage tier's gate tests (gpu_tier_gate_test.cc)
// get engine pages and the platform under test. Two implementations, one per
// test executable: gate_env_fake.cc (FakePlatform, host memory; runs in CI)
// and gate_env_cuda.cc (the CUDA platform and cuFile; label gpu, skips
// without a device). The tests wrap inner() in a FaultInjectingPlatform.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gpu/platform.h"
#include "manager/manager.h"

namespace orbitkv::testing {

class GateEnv {
 public:
  virtual ~GateEnv() = default;
  // Empty when the tests can run; else why they are skipped.
  virtual std::string Unavailable() = 0;
  virtual gpu::Platform* inner() = 0;

  // Engine page memory on device 0, as an engine would export it.
  struct Pages {
    gpu::DevPtr base = 0;
    gpu::IpcHandle handle{};
    uint64_t bytes = 0;
  };
  virtual Pages Allocate(uint64_t bytes) = 0;
  virtual void Free(const Pages& pages) = 0;
  virtual void Write(gpu::DevPtr dst, const void* src, uint64_t n) = 0;
  virtual void Read(void* dst, gpu::DevPtr src, uint64_t n) = 0;
  // Adds what the platform needs to the Manager's configuration (CUDA: the
  // DRAM pool and staging registered as pinned memory, as the binary does).
  virtual void Configure(ManagerConfig* config) {}
  // After the Manager is gone: every platform resource was released.
  virtual std::string Leaks() { return {}; }
};

std::unique_ptr<GateEnv> CreateGateEnv();

}  // namespace orbitkv::testing
