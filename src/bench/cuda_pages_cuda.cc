// CUDA pages for orbitkv-bench: each region of the layout (a slot's, or a
// page-first group's) is one cudaMalloc allocation on the device, registered with the Manager by
// IPC handle. Fill and Check run a kernel over the page's slots (cuda_fill.h: the bytes of
// FillBlockSlot, made and compared on the GPU), so the engine side never goes through the Manager's
// copies and makes and checks pages at HBM speed; a layout whose slots are not whole 8-byte words
// stages them through a pinned host buffer (cudaMemcpy) instead. Copy ceilings are pinned
// cudaMemcpyAsync H2D and D2H and device-to-device, timed with CUDA events on one stream,
// `block_bytes` per copy, over about `seconds` each.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>

#include "bench/cuda_fill.h"
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
    if (fills_host_) cudaFreeHost(fills_host_);
    if (bad_host_) cudaFreeHost(bad_host_);
    if (fills_dev_) cudaFree(fills_dev_);
    if (bad_dev_) cudaFree(bad_dev_);
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
    ORBITKV_RETURN_IF_ERROR(t->SetUpKernels());
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
    const PageRef one{group, page};
    if (kernels_ && PoisonOnGpu({&one, 1}) == cudaSuccess) return;
    for (const SlotLayout& s : layout_.groups[group].slots) {
      cudaMemset(Slot(s, page), 0xA5, s.bytes_per_page);
    }
    // cudaMemset of device memory is asynchronous to the host: without this
    // wait the poison could land after the Manager's restore into the page.
    cudaDeviceSynchronize();
  }
  void Fill(uint32_t group, const BlockKey& key, uint64_t page) override {
    cudaSetDevice(ordinal_);
    if (kernels_ && FillOnGpu(group, {&key, 1}, {&page, 1}) == cudaSuccess) return;
    for (const SlotLayout& s : layout_.groups[group].slots) {
      demo::FillBlockSlot(key, s.slot_id, staging_, s.bytes_per_page);
      cudaMemcpy(Slot(s, page), staging_, s.bytes_per_page, cudaMemcpyHostToDevice);
    }
  }
  void FillMany(uint32_t group, std::span<const BlockKey> keys,
                std::span<const uint64_t> pages) override {
    cudaSetDevice(ordinal_);
    if (keys.empty() || (kernels_ && FillOnGpu(group, keys, pages) == cudaSuccess)) return;
    PageTarget::FillMany(group, keys, pages);
  }
  void PoisonMany(std::span<const PageRef> pages) override {
    cudaSetDevice(ordinal_);
    if (pages.empty() || (kernels_ && PoisonOnGpu(pages) == cudaSuccess)) return;
    PageTarget::PoisonMany(pages);
  }
  bool Check(uint32_t group, const BlockKey& key, uint64_t page) override {
    cudaSetDevice(ordinal_);
    if (kernels_) return CheckOnGpu(group, key, page);
    for (const SlotLayout& s : layout_.groups[group].slots) {
      if (cudaMemcpy(staging_, Slot(s, page), s.bytes_per_page, cudaMemcpyDeviceToHost) !=
              cudaSuccess ||
          !demo::CheckBlockSlot(key, s.slot_id, staging_, s.bytes_per_page)) {
        return false;
      }
    }
    return true;
  }
  std::vector<bool> CheckMany(std::span<const PageRef> pages,
                              std::span<const BlockKey> keys) override {
    cudaSetDevice(ordinal_);
    std::vector<bool> right(pages.size(), false);
    // On a CUDA error (no room for the batch's descriptors, say), page by
    // page, so that the error is not taken for wrong bytes.
    if (pages.empty() || (kernels_ && CheckOnGpu(pages, keys, &right) == cudaSuccess)) return right;
    return PageTarget::CheckMany(pages, keys);
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
  // The fill and check kernels, when every slot of every page is whole
  // 8-byte words at 8-byte aligned addresses; then a self-check: a page the
  // kernel filled holds FillBlockSlot's bytes, and the check kernel tells a
  // right page from one with a byte changed. Internal when it does not.
  Status SetUpKernels() {
    uint32_t most = 0;
    for (const GroupLayout& g : layout_.groups) {
      most = std::max<uint32_t>(most, static_cast<uint32_t>(g.slots.size()));
      for (const SlotLayout& s : g.slots) {
        if (s.bytes_per_page % 8 || SlotPageOffset(s, 0) % 8 || s.page_stride % 8)
          return Status::OK();
      }
    }
    if (most == 0 || layout_.num_pages == 0) return Status::OK();
    ORBITKV_RETURN_IF_ERROR(Reserve(most));
    kernels_ = true;
    BlockKey probe{};
    for (size_t i = 0; i < probe.size(); ++i) probe[i] = static_cast<uint8_t>(37 * i + 1);
    const uint64_t page0 = 0;
    ORBITKV_RETURN_IF_ERROR(
        Cuda(FillOnGpu(0, {&probe, 1}, {&page0, 1}), "the CUDA page fill kernel"));
    for (const SlotLayout& s : layout_.groups[0].slots) {
      ORBITKV_RETURN_IF_ERROR(
          Cuda(cudaMemcpy(staging_, Slot(s, 0), s.bytes_per_page, cudaMemcpyDeviceToHost),
               "cudaMemcpy"));
      if (!demo::CheckBlockSlot(probe, s.slot_id, staging_, s.bytes_per_page)) {
        return Status::Internal("the CUDA page fill kernel wrote other bytes than FillBlockSlot");
      }
    }
    if (!CheckOnGpu(0, probe, 0)) {
      return Status::Internal("the CUDA page check kernel refused a right page");
    }
    const SlotLayout& last = layout_.groups[0].slots.back();
    ORBITKV_RETURN_IF_ERROR(
        Cuda(cudaMemset(Slot(last, 0) + last.bytes_per_page - 1, 0x5A, 1), "cudaMemset"));
    ORBITKV_RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    if (CheckOnGpu(0, probe, 0)) {
      return Status::Internal("the CUDA page check kernel passed a page with a byte changed");
    }
    if (layout_.num_pages >= 2) {  // a batch's verdicts are per page
      const uint64_t page1 = 1;
      ORBITKV_RETURN_IF_ERROR(
          Cuda(FillOnGpu(0, {&probe, 1}, {&page1, 1}), "the CUDA page fill kernel"));
      const PageRef both[] = {{0, 0}, {0, 1}};
      const BlockKey keys[] = {probe, probe};
      std::vector<bool> right(2, false);
      ORBITKV_RETURN_IF_ERROR(Cuda(CheckOnGpu(both, keys, &right), "the CUDA page check kernel"));
      if (right[0] || !right[1])
        return Status::Internal("the CUDA page check kernel gave a batch of two pages " +
                                std::string(right[0] ? "right" : "wrong") + " and " +
                                (right[1] ? "right" : "wrong") + " verdicts, not wrong and right");
    }
    const PageRef page0_ref{0, 0};
    ORBITKV_RETURN_IF_ERROR(Cuda(PoisonOnGpu({&page0_ref, 1}), "the CUDA page poison kernel"));
    uint8_t poisoned = 0;
    ORBITKV_RETURN_IF_ERROR(Cuda(
        cudaMemcpy(&poisoned, Slot(last, 0) + last.bytes_per_page - 1, 1, cudaMemcpyDeviceToHost),
        "cudaMemcpy"));
    if (poisoned != 0xA5)
      return Status::Internal("the CUDA page poison kernel left a slot as it was");
    return Status::OK();
  }
  // The descriptors of `group`'s slots of `page` into at[0, slots); raises
  // *max_words to the largest slot's words.
  void DescribeInto(uint32_t group, const BlockKey& key, uint64_t page, SlotFill* at,
                    uint32_t* max_words) {
    const std::vector<SlotLayout>& slots = layout_.groups[group].slots;
    for (size_t k = 0; k < slots.size(); ++k) {
      const SlotLayout& s = slots[k];
      at[k] = {reinterpret_cast<uint64_t*>(Slot(s, page)), s.bytes_per_page / 8,
               demo::BlockSlotSeed(key, s.slot_id)};
      *max_words = std::max<uint32_t>(*max_words, static_cast<uint32_t>(s.bytes_per_page / 8));
    }
  }
  // The descriptors of the slots of every page of `pages` (keys[i]'s content
  // for pages[i]; key unused when `keys` is empty) into fills_dev_, on
  // stream_: *count of them, the largest *max_words words.
  cudaError_t Describe(std::span<const PageRef> pages, std::span<const BlockKey> keys,
                       uint32_t* count, uint32_t* max_words) {
    size_t n = 0;
    for (const PageRef& p : pages) n += layout_.groups[p.group].slots.size();
    if (!Reserve(n).ok()) return cudaErrorMemoryAllocation;
    *count = static_cast<uint32_t>(n);
    *max_words = 0;
    SlotFill* at = fills_host_;
    for (size_t i = 0; i < pages.size(); ++i) {
      DescribeInto(pages[i].group, keys.empty() ? BlockKey{} : keys[i], pages[i].page, at,
                   max_words);
      at += layout_.groups[pages[i].group].slots.size();
    }
    return cudaMemcpyAsync(fills_dev_, fills_host_, sizeof(SlotFill) * n, cudaMemcpyHostToDevice,
                           stream_);
  }
  // Room for `entries` fill descriptors and check verdicts (host and device),
  // grown as needed. REQUIRES: nothing on stream_ still uses the old ones
  // (every use syncs).
  Status Reserve(size_t entries) {
    if (entries <= fills_cap_) return Status::OK();
    SlotFill* host = nullptr;
    SlotFill* dev = nullptr;
    uint32_t* bad_host = nullptr;
    uint32_t* bad_dev = nullptr;
    Status st = Cuda(cudaMallocHost(reinterpret_cast<void**>(&host), sizeof(SlotFill) * entries),
                     "cudaMallocHost");
    if (st.ok())
      st = Cuda(cudaMalloc(reinterpret_cast<void**>(&dev), sizeof(SlotFill) * entries),
                "cudaMalloc");
    if (st.ok())
      st = Cuda(cudaMallocHost(reinterpret_cast<void**>(&bad_host), sizeof(uint32_t) * entries),
                "cudaMallocHost");
    if (st.ok())
      st = Cuda(cudaMalloc(reinterpret_cast<void**>(&bad_dev), sizeof(uint32_t) * entries),
                "cudaMalloc");
    if (!st.ok()) {
      cudaFreeHost(host);
      cudaFree(dev);
      cudaFreeHost(bad_host);
      cudaFree(bad_dev);
      return st;
    }
    cudaFreeHost(fills_host_);
    cudaFree(fills_dev_);
    cudaFreeHost(bad_host_);
    cudaFree(bad_dev_);
    fills_host_ = host;
    fills_dev_ = dev;
    bad_host_ = bad_host;
    bad_dev_ = bad_dev;
    fills_cap_ = entries;
    return Status::OK();
  }
  // Fill(keys[i]) into pages[i] for every i: one descriptor upload, one
  // kernel launch and one synchronisation for them all.
  cudaError_t FillOnGpu(uint32_t group, std::span<const BlockKey> keys,
                        std::span<const uint64_t> pages) {
    const size_t per = layout_.groups[group].slots.size();
    if (!Reserve(keys.size() * per).ok()) return cudaErrorMemoryAllocation;
    uint32_t max_words = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      DescribeInto(group, keys[i], pages[i], fills_host_ + i * per, &max_words);
    }
    const auto count = static_cast<uint32_t>(keys.size() * per);
    cudaError_t e = cudaMemcpyAsync(fills_dev_, fills_host_, sizeof(SlotFill) * count,
                                    cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess) e = LaunchSlotFill(fills_dev_, count, max_words, stream_);
    const cudaError_t synced = cudaStreamSynchronize(stream_);  // fills_host_ is free again
    return e != cudaSuccess ? e : synced;
  }
  // 0xA5 bytes over the slots of every page of `pages`: one launch, on
  // stream_, synchronised (the Manager's restore into them must come after).
  cudaError_t PoisonOnGpu(std::span<const PageRef> pages) {
    uint32_t count = 0, max_words = 0;
    cudaError_t e = Describe(pages, {}, &count, &max_words);
    if (e == cudaSuccess)
      e = LaunchSlotSet(fills_dev_, count, max_words, 0xA5A5A5A5A5A5A5A5ull, stream_);
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    return e != cudaSuccess ? e : synced;
  }
  bool CheckOnGpu(uint32_t group, const BlockKey& key, uint64_t page) {
    const PageRef one{group, page};
    std::vector<bool> right(1, false);
    return CheckOnGpu({&one, 1}, {&key, 1}, &right) == cudaSuccess && right[0];
  }
  // (*right)[i] = whether pages[i] holds keys[i]'s content: one launch and one
  // synchronisation for them all. A CUDA error is returned, *right left as it was.
  cudaError_t CheckOnGpu(std::span<const PageRef> pages, std::span<const BlockKey> keys,
                         std::vector<bool>* right) {
    uint32_t count = 0, max_words = 0;
    cudaError_t e = Describe(pages, keys, &count, &max_words);
    if (e == cudaSuccess) e = cudaMemsetAsync(bad_dev_, 0, sizeof(uint32_t) * count, stream_);
    if (e == cudaSuccess) e = LaunchSlotCheck(fills_dev_, count, max_words, bad_dev_, stream_);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(bad_host_, bad_dev_, sizeof(uint32_t) * count, cudaMemcpyDeviceToHost,
                          stream_);
    }
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess || synced != cudaSuccess) return e != cudaSuccess ? e : synced;
    const uint32_t* bad = bad_host_;
    for (size_t i = 0; i < pages.size(); ++i) {
      const size_t slots = layout_.groups[pages[i].group].slots.size();
      (*right)[i] = std::all_of(bad, bad + slots, [](uint32_t b) { return b == 0; });
      bad += slots;
    }
    return cudaSuccess;
  }
  std::string device_;
  int ordinal_ = 0;
  InstanceLayout layout_;
  std::vector<void*> regions_;
  std::vector<std::array<uint8_t, 64>> handles_;
  uint8_t* staging_ = nullptr;      // pinned, one slot
  cudaStream_t stream_ = nullptr;   // the naive route's copies; the fill and check kernels
  bool kernels_ = false;            // Fill and Check on the GPU (SetUpKernels)
  SlotFill* fills_host_ = nullptr;  // pinned: slot descriptors (fills_cap_ of them)
  SlotFill* fills_dev_ = nullptr;
  size_t fills_cap_ = 0;
  uint32_t* bad_host_ = nullptr;  // pinned: the check kernel's verdicts
  uint32_t* bad_dev_ = nullptr;
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
