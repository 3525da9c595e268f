// CUDA pages for orbitkv-bench: each region of the layout (a slot's, or a
// page-first group's) is one cudaMalloc allocation on the device, registered with the Manager by
// IPC handle. Fill and Check stage through a pinned host buffer (cudaMemcpy), so the engine side
// never goes through the Manager's copies. Copy ceilings are pinned cudaMemcpyAsync H2D and D2H and
// device-to-device, timed with CUDA events on one stream, `block_bytes` per copy, over about
// `seconds` each.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "bench/cuda_pages.h"
#include "orbitkv/device.h"
#include "orbitkv/units.h"
#include "workload/workload.h"

namespace orbitkv::bench {
namespace {

Status Cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Unavailable(what + ": " + cudaGetErrorString(e));
}

Result<int> Ordinal(const std::string& device) {
  ORBITKV_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDevice(device, "--device"));
  const int n = static_cast<int>(spec.ordinal);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || n >= count) {
    return Status::Unavailable("--device " + device + ": no such CUDA device (" +
                               std::to_string(count) + " present)");
  }
  return n;
}

class CudaPageTarget : public PageTarget {
 public:
  ~CudaPageTarget() override {
    cudaSetDevice(ordinal_);
    if (stream_) cudaStreamDestroy(stream_);
    for (void* p : regions_) cudaFree(p);
    if (staging_) cudaFreeHost(staging_);
  }
  static Result<std::unique_ptr<PageTarget>> Create(const std::string& device,
                                                    const InstanceLayout& layout) {
    auto t = std::unique_ptr<CudaPageTarget>(new CudaPageTarget());
    ORBITKV_ASSIGN_OR_RETURN(t->ordinal_, Ordinal(device));
    t->device_ = device;
    t->layout_ = layout;
    ORBITKV_RETURN_IF_ERROR(Cuda(cudaSetDevice(t->ordinal_), "cudaSetDevice"));
    uint64_t max_slot = 0;
    for (const GroupLayout& g : layout.groups)
      for (const SlotLayout& s : g.slots) max_slot = std::max(max_slot, s.bytes_per_page);
    for (uint64_t i = 0; i < t->layout_.region_bytes.size(); ++i) {
      void* p = nullptr;
      ORBITKV_RETURN_IF_ERROR(Cuda(cudaMalloc(&p, t->layout_.region_bytes[i]), "cudaMalloc"));
      t->regions_.push_back(p);
      cudaIpcMemHandle_t h;
      ORBITKV_RETURN_IF_ERROR(Cuda(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle"));
      std::array<uint8_t, 64> raw{};
      std::memcpy(raw.data(), &h, sizeof h);
      t->handles_.push_back(raw);
    }
    ORBITKV_RETURN_IF_ERROR(
        Cuda(cudaMallocHost(reinterpret_cast<void**>(&t->staging_), max_slot), "cudaMallocHost"));
    ORBITKV_RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&t->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    return std::unique_ptr<PageTarget>(std::move(t));
  }

  const InstanceLayout& layout() const override { return layout_; }
  void Describe(RegisterRequest* r, std::vector<int>*) const override {
    r->device = device_;
    r->layout = layout_;
    r->ipc_handles = handles_;
  }
  void Poison(uint32_t group, uint64_t page) override {
    cudaSetDevice(ordinal_);
    for (const SlotLayout& s : layout_.groups[group].slots) {
      cudaMemset(Slot(s, page), 0xA5, s.bytes_per_page);
    }
    // cudaMemset of device memory is asynchronous to the host: without this
    // wait the poison could land after the Manager's restore into the page.
    cudaDeviceSynchronize();
  }
  void Fill(uint32_t group, const BlockKey& key, uint64_t page) override {
    cudaSetDevice(ordinal_);
    for (const SlotLayout& s : layout_.groups[group].slots) {
      demo::FillBlockSlot(key, s.slot_id, staging_, s.bytes_per_page);
      cudaMemcpy(Slot(s, page), staging_, s.bytes_per_page, cudaMemcpyHostToDevice);
    }
  }
  bool Check(uint32_t group, const BlockKey& key, uint64_t page) override {
    cudaSetDevice(ordinal_);
    for (const SlotLayout& s : layout_.groups[group].slots) {
      if (cudaMemcpy(staging_, Slot(s, page), s.bytes_per_page, cudaMemcpyDeviceToHost) !=
              cudaSuccess ||
          !demo::CheckBlockSlot(key, s.slot_id, staging_, s.bytes_per_page)) {
        return false;
      }
    }
    return true;
  }
  // The naive route on GPU pages, as simple offloaders do it (vLLM's swap
  // path): one cudaMemcpyAsync per slot between a pinned buffer and the page,
  // then one synchronisation of the stream per block.
  void Gather(uint32_t group, uint64_t page, uint8_t* dst) override {
    cudaSetDevice(ordinal_);
    for (const SlotLayout& s : layout_.groups[group].slots) {
      cudaMemcpyAsync(dst, Slot(s, page), s.bytes_per_page, cudaMemcpyDeviceToHost, stream_);
      dst += s.bytes_per_page;
    }
    cudaStreamSynchronize(stream_);
  }
  void Scatter(uint32_t group, const uint8_t* src, uint64_t page) override {
    cudaSetDevice(ordinal_);
    for (const SlotLayout& s : layout_.groups[group].slots) {
      cudaMemcpyAsync(Slot(s, page), src, s.bytes_per_page, cudaMemcpyHostToDevice, stream_);
      src += s.bytes_per_page;
    }
    cudaStreamSynchronize(stream_);
  }
  Result<uint8_t*> AllocateBuffer(uint64_t bytes) override {
    cudaSetDevice(ordinal_);
    void* p = nullptr;
    ORBITKV_RETURN_IF_ERROR(Cuda(cudaMallocHost(&p, AlignUp(bytes, 4096)), "cudaMallocHost"));
    return static_cast<uint8_t*>(p);  // page-aligned: fit for O_DIRECT
  }
  void FreeBuffer(uint8_t* buffer) override {
    cudaSetDevice(ordinal_);
    cudaFreeHost(buffer);
  }

 private:
  CudaPageTarget() = default;
  uint8_t* Slot(const SlotLayout& s, uint64_t page) {
    return static_cast<uint8_t*>(regions_[s.region]) + SlotPageOffset(s, page);
  }
  std::string device_;
  int ordinal_ = 0;
  InstanceLayout layout_;
  std::vector<void*> regions_;
  std::vector<std::array<uint8_t, 64>> handles_;
  uint8_t* staging_ = nullptr;     // pinned, one slot
  cudaStream_t stream_ = nullptr;  // the naive route's copies
};

// Bytes/s of repeated cudaMemcpyAsync(dst, src, n) on one stream for ~seconds.
Result<double> Rate(void* dst, const void* src, uint64_t n, double seconds) {
  cudaStream_t st;
  ORBITKV_RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream"));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  // Calibrate: 8 copies, then enough for ~seconds.
  uint64_t reps = 8;
  double rate = 0;
  for (int round = 0; round < 2; ++round) {
    cudaEventRecord(a, st);
    for (uint64_t i = 0; i < reps; ++i) cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, st);
    cudaEventRecord(b, st);
    Status s = Cuda(cudaEventSynchronize(b), "cudaMemcpyAsync ceiling");
    if (!s.ok()) {
      cudaStreamDestroy(st);
      return s;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    rate = double(n) * double(reps) / (std::max(ms, 0.001f) / 1000.0);
    reps = std::max<uint64_t>(8, static_cast<uint64_t>(rate * seconds / double(n)));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(st);
  return rate;
}

}  // namespace

bool CudaPagesBuilt() { return true; }

Status CheckCudaPagesDevice(const std::string& device) { return Ordinal(device).status(); }

Result<std::unique_ptr<PageTarget>> CreateCudaPageTarget(const std::string& device,
                                                         const InstanceLayout& layout) {
  return CudaPageTarget::Create(device, layout);
}

Result<CudaCopyCeilings> MeasureCudaCopyCeilings(const std::string& device, uint64_t block_bytes,
                                                 double seconds) {
  ORBITKV_ASSIGN_OR_RETURN(int ordinal, Ordinal(device));
  ORBITKV_RETURN_IF_ERROR(Cuda(cudaSetDevice(ordinal), "cudaSetDevice"));
  // Copies of block_bytes cycling through 256 MiB, so caches do not flatter them.
  const uint64_t span = std::max<uint64_t>(block_bytes, 256u << 20);
  void *host = nullptr, *d0 = nullptr, *d1 = nullptr;
  ORBITKV_RETURN_IF_ERROR(Cuda(cudaMallocHost(&host, span), "cudaMallocHost"));
  Status st = Cuda(cudaMalloc(&d0, span), "cudaMalloc");
  if (st.ok()) st = Cuda(cudaMalloc(&d1, span), "cudaMalloc");
  CudaCopyCeilings out;
  if (st.ok()) {
    // One large copy per measurement: block_bytes * k up to the span keeps
    // each call's size the block size while the stream stays busy.
    Result<double> h2d = Rate(d0, host, block_bytes, seconds);
    Result<double> d2h = Rate(host, d0, block_bytes, seconds);
    Result<double> d2d = Rate(d1, d0, block_bytes, seconds);
    if (!h2d.ok())
      st = h2d.status();
    else if (!d2h.ok())
      st = d2h.status();
    else if (!d2d.ok())
      st = d2d.status();
    else
      out = {*h2d, *d2h, *d2d};
  }
  if (d1) cudaFree(d1);
  if (d0) cudaFree(d0);
  cudaFreeHost(host);
  if (!st.ok()) return st;
  return out;
}

}  // namespace orbitkv::bench
