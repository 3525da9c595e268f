// GateEnv over the CUDA platform and the dlopen()ed libcufile. Engine pages
// are cudaMalloc allocations of this process; CUDA cannot open an IPC handle
// in the process that exported it, so the tests' platform answers OpenIpc
// from a local table of those allocations and forwards everything else.
// cuFile runs as configured by the environment (compatibility mode on the
// CUDA test host: CUFILE_ALLOW_COMPAT_MODE / CUFILE_FORCE_COMPAT_MODE, TMPDIR
// on a mount where cuFile registers files).
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>

#include "codec/cuda_frame_decoder.h"
#include "codec/cuda_frame_encoder.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_platform.h"
#include "gpu/host_memory_hooks.h"
#include "gpu_tier/gate_env.h"

namespace orbitkv::testing {
namespace {

using gpu::DevPtr;

class LocalIpcDevice : public gpu::Device {
 public:
  LocalIpcDevice(gpu::Device* inner, std::map<gpu::IpcHandle, gpu::IpcMapping>* table,
                 std::mutex* mu)
      : d_(inner), table_(table), mu_(mu) {}
  int ordinal() const override { return d_->ordinal(); }
  Result<gpu::IpcMapping> OpenIpc(const gpu::IpcHandle& h) override {
    std::lock_guard<std::mutex> l(*mu_);
    auto it = table_->find(h);
    if (it == table_->end()) return Status::InvalidArgument("unknown test IPC handle");
    ++open_;
    return it->second;
  }
  Status CloseIpc(DevPtr) override {
    std::lock_guard<std::mutex> l(*mu_);
    --open_;
    return Status::OK();
  }
  Result<DevPtr> Allocate(uint64_t b) override { return d_->Allocate(b); }
  Status Free(DevPtr p) override { return d_->Free(p); }
  Result<uint8_t*> AllocateHost(uint64_t b) override { return d_->AllocateHost(b); }
  bool KernelsReadHost(const uint8_t* p, uint64_t b) const override {
    return d_->KernelsReadHost(p, b);
  }
  Status FreeHost(uint8_t* p) override { return d_->FreeHost(p); }
  Status Crc32cAsync(std::span<const gpu::CrcOp> ops, uint32_t* out, gpu::Stream& s) override {
    return d_->Crc32cAsync(ops, out, s);
  }
  Result<std::unique_ptr<gpu::SlotTable>> CreateSlotTable(std::span<const gpu::SlotSpan> slots,
                                                          uint64_t pages) override {
    return d_->CreateSlotTable(slots, pages);
  }
  Status GatherObjectsAsync(const gpu::SlotTable& t, std::span<const gpu::ObjectGather> objects,
                            uint32_t* crcs, gpu::Stream& s) override {
    return d_->GatherObjectsAsync(t, objects, crcs, s);
  }
  Result<std::unique_ptr<gpu::Stream>> CreateStream() override { return d_->CreateStream(); }
  Result<std::unique_ptr<gpu::Event>> CreateEvent() override { return d_->CreateEvent(); }
  Status Record(gpu::Event& e, gpu::Stream& s) override { return d_->Record(e, s); }
  Result<bool> Poll(gpu::Event& e) override { return d_->Poll(e); }
  Status Wait(gpu::Event& e) override { return d_->Wait(e); }
  Status Synchronize(gpu::Stream& s) override { return d_->Synchronize(s); }
  Status CopyAsync(std::span<const gpu::CopyOp> ops, gpu::Stream& s) override {
    return d_->CopyAsync(ops, s);
  }
  Status MemsetAsync(DevPtr p, uint8_t v, uint64_t n, gpu::Stream& s) override {
    return d_->MemsetAsync(p, v, n, s);
  }
  Status HostFuncAsync(std::function<void()> fn, gpu::Stream& s) override {
    return d_->HostFuncAsync(std::move(fn), s);
  }
  Status RegisterBuffer(DevPtr p, uint64_t n) override { return d_->RegisterBuffer(p, n); }
  Status DeregisterBuffer(DevPtr p) override { return d_->DeregisterBuffer(p); }
  Status RegisterStream(gpu::Stream& s) override { return d_->RegisterStream(s); }
  Status DeregisterStream(gpu::Stream& s) override { return d_->DeregisterStream(s); }
  Status ReadAsync(gpu::StorageFile& f, DevPtr b, gpu::AsyncIo* io, gpu::Stream& s) override {
    return d_->ReadAsync(f, b, io, s);
  }
  Status WriteAsync(gpu::StorageFile& f, DevPtr b, gpu::AsyncIo* io, gpu::Stream& s) override {
    return d_->WriteAsync(f, b, io, s);
  }
  Result<std::unique_ptr<gpu::FrameDecoder>> CreateFrameDecoder(uint32_t max_frames) override {
    return d_->CreateFrameDecoder(max_frames);
  }
  Result<std::unique_ptr<gpu::FrameEncoder>> CreateFrameEncoder(uint32_t max_segments) override {
    return d_->CreateFrameEncoder(max_segments);
  }
  int open() const {
    std::lock_guard<std::mutex> l(*mu_);
    return open_;
  }

 private:
  gpu::Device* d_;
  std::map<gpu::IpcHandle, gpu::IpcMapping>* table_;
  std::mutex* mu_;
  int open_ = 0;
};

class LocalIpcPlatform : public gpu::Platform {
 public:
  explicit LocalIpcPlatform(std::unique_ptr<gpu::Platform> inner) : p_(std::move(inner)) {}
  std::string Describe() const override { return p_->Describe() + " (in-process IPC table)"; }
  int device_count() const override { return 1; }
  Result<gpu::Device*> device(int ordinal) override {
    if (ordinal != 0) return Status::InvalidArgument("gate tests use cuda:0");
    std::lock_guard<std::mutex> l(dev_mu_);
    if (!dev_) {
      gpu::Device* d = nullptr;
      ORBITKV_ASSIGN_OR_RETURN(d, p_->device(0));
      dev_ = std::make_unique<LocalIpcDevice>(d, &table, &mu);
    }
    return dev_.get();
  }
  Result<std::string> OpenStorage(gpu::StoragePolicy policy) override {
    // The driver opens once per process; later Managers reuse it.
    std::lock_guard<std::mutex> l(dev_mu_);
    if (!storage_) storage_ = p_->OpenStorage(policy);
    return *storage_;
  }
  Result<std::unique_ptr<gpu::StorageFile>> RegisterFile(int fd) override {
    return p_->RegisterFile(fd);
  }
  int open_mappings() { return dev_ ? dev_->open() : 0; }

  std::mutex mu;
  std::map<gpu::IpcHandle, gpu::IpcMapping> table;

 private:
  std::unique_ptr<gpu::Platform> p_;
  std::mutex dev_mu_;
  std::unique_ptr<LocalIpcDevice> dev_;
  std::optional<Result<std::string>> storage_;
};

class CudaGateEnv : public GateEnv {
 public:
  CudaGateEnv() {
    Result<int> n = gpu::DeviceCount();
    if (!n.ok() || *n == 0) {
      why_ = "no CUDA device";
      return;
    }
    auto p = gpu::CreateCudaPlatform(codec::CreateCudaFrameDecoder, codec::CreateCudaFrameEncoder);
    if (!p.ok()) {
      why_ = p.status().ToString();
      return;
    }
    platform_ = std::make_unique<LocalIpcPlatform>(std::move(p).value());
    Result<std::string> st = platform_->OpenStorage(gpu::StoragePolicy::kExplicit);
    if (!st.ok()) why_ = "cuFile: " + st.status().ToString();
    cudaSetDevice(0);
  }
  std::string Unavailable() override { return why_; }
  gpu::Platform* inner() override { return platform_.get(); }
  Pages Allocate(uint64_t bytes) override {
    void* p = nullptr;
    cudaSetDevice(0);
    if (cudaMalloc(&p, bytes) != cudaSuccess) std::abort();
    cudaMemset(p, 0xEE, bytes);
    cudaDeviceSynchronize();
    Pages out;
    out.base = reinterpret_cast<DevPtr>(p);
    out.bytes = bytes;
    std::lock_guard<std::mutex> l(platform_->mu);
    static uint64_t next = 1;
    uint64_t id = next++;
    std::memcpy(out.handle.data(), &id, sizeof id);
    platform_->table[out.handle] = {out.base, bytes};
    return out;
  }
  void Free(const Pages& pages) override {
    {
      std::lock_guard<std::mutex> l(platform_->mu);
      platform_->table.erase(pages.handle);
    }
    cudaFree(reinterpret_cast<void*>(pages.base));
  }
  void Write(DevPtr dst, const void* src, uint64_t n) override {
    cudaSetDevice(0);
    if (cudaMemcpy(reinterpret_cast<void*>(dst), src, n, cudaMemcpyHostToDevice) != cudaSuccess)
      std::abort();
  }
  void Read(void* dst, DevPtr src, uint64_t n) override {
    cudaSetDevice(0);
    if (cudaMemcpy(dst, reinterpret_cast<const void*>(src), n, cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      std::abort();
  }
  void Configure(ManagerConfig* c) override {
    HostMemoryHooks h = GetHostMemoryHooks();
    c->register_host_memory = h.register_memory;
    c->unregister_host_memory = h.unregister_memory;
  }
  std::string Leaks() override {
    int open = platform_ ? platform_->open_mappings() : 0;
    return open == 0 ? std::string() : std::to_string(open) + " IPC mappings left open";
  }

 private:
  std::string why_;
  std::unique_ptr<LocalIpcPlatform> platform_;
};

}  // namespace

std::unique_ptr<GateEnv> CreateGateEnv() {
  // One per process: cuFile's driver and CUDA's context outlive each test.
  static CudaGateEnv* env = new CudaGateEnv();
  struct NonOwning : GateEnv {
    explicit NonOwning(GateEnv* e) : e_(e) {}
    std::string Unavailable() override { return e_->Unavailable(); }
    gpu::Platform* inner() override { return e_->inner(); }
    Pages Allocate(uint64_t b) override { return e_->Allocate(b); }
    void Free(const Pages& p) override { e_->Free(p); }
    void Write(DevPtr d, const void* s, uint64_t n) override { e_->Write(d, s, n); }
    void Read(void* d, DevPtr s, uint64_t n) override { e_->Read(d, s, n); }
    void Configure(ManagerConfig* c) override { e_->Configure(c); }
    std::string Leaks() override { return e_->Leaks(); }
    GateEnv* e_;
  };
  return std::make_unique<NonOwning>(env);
}

}  // namespace orbitkv::testing
