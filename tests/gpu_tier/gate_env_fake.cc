// GateEnv over FakePlatform: engine pages are host memory exported as IPC
// handles; cuFile is pread/pwrite on the shard files.
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "gpu/fake_platform.h"
#include "gpu_tier/gate_env.h"

namespace orbitkv::testing {
namespace {

class FakeGateEnv : public GateEnv {
 public:
  std::string Unavailable() override { return {}; }
  gpu::Platform* inner() override { return &platform_; }
  Pages Allocate(uint64_t bytes) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    std::memset(p, 0xEE, bytes);
    Pages out;
    out.base = reinterpret_cast<gpu::DevPtr>(p);
    out.bytes = bytes;
    out.handle = platform_.Export(p, bytes, 0);
    return out;
  }
  void Free(const Pages& pages) override { std::free(reinterpret_cast<void*>(pages.base)); }
  void Write(gpu::DevPtr dst, const void* src, uint64_t n) override {
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
  }
  void Read(void* dst, gpu::DevPtr src, uint64_t n) override {
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
  }
  std::string Leaks() override {
    gpu::FakePlatformCounters c = platform_.counters();
    // Files stay registered while the platform lives only if the Manager leaked them.
    if (c == gpu::FakePlatformCounters{}) return {};
    std::ostringstream os;
    os << c;
    return os.str();
  }

 private:
  gpu::FakePlatform platform_;
};

}  // namespace

std::unique_ptr<GateEnv> CreateGateEnv() { return std::make_unique<FakeGateEnv>(); }

}  // namespace orbitkv::testing
