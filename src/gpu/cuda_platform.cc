#include "gpu/cuda_platform.h"

#include <cuda.h>  // CUresult, CUdeviceptr: the driver entry point's types only
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "gpu/address_ranges.h"
#include "gpu/copy_kernels.h"
#include "gpu/copy_options.h"
#include "gpu/crc32c_kernel.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_device.h"
#include "gpu/cufile_loader.h"
#include "gpu/gather_kernel.h"
#include "gpu/slot_spans.h"
#include "gpu/staged_copy_plan.h"
#include "gpu/staged_mover.h"
#include "orbitkv/logging.h"
#include "orbitkv/units.h"

namespace orbitkv::gpu {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == std::tuple_size_v<IpcHandle>,
              "IpcHandle must hold a cudaIpcMemHandle_t");
static_assert(sizeof(DevPtr) >= sizeof(void*));

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

std::string VersionText(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

CuFileInitPolicy ToCuFilePolicy(StoragePolicy policy) {
  return policy == StoragePolicy::kAutoNativeOnly ? CuFileInitPolicy::kAutoNativeOnly
                                                  : CuFileInitPolicy::kExplicit;
}

// Makes sure the calling thread has a current context (its current device's
// primary context) without changing which device is current: cuFile calls
// made outside a Device method find one.
Status EnsureCurrentContext() {
  int current = 0;
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  return ORBITKV_CUDA_STATUS(cudaSetDevice(current));
}

// The driver's cuMemGetAddressRange, resolved once; null when unavailable.
using GetAddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);

struct AddressRangeEntry {
  GetAddressRangeFn fn = nullptr;
  std::string error;  // why fn is null
};

const AddressRangeEntry& DriverAddressRange() {
  static const AddressRangeEntry entry = [] {
    AddressRangeEntry e;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    // 12000: the cuMemGetAddressRange of CUDA 12.0 (its _v2 ABI).
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                             cudaEnableDefault, &found);
#else
    const cudaError_t err =
        cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      e.error = "resolving the driver's cuMemGetAddressRange: " +
                (err != cudaSuccess ? CudaErrorText(err)
                                    : "query result " + std::to_string(static_cast<int>(found)));
      (void)cudaGetLastError();
      return e;
    }
    e.fn = reinterpret_cast<GetAddressRangeFn>(fn);
    return e;
  }();
  return entry;
}

class CudaPlatform;

class CudaStream final : public Stream {
 public:
  CudaStream(const CudaPlatform* owner, int ordinal, cudaStream_t stream)
      : owner_(owner), ordinal_(ordinal), stream_(stream) {}
  ~CudaStream() override {
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
    if (const CuFileLibrary* lib = cufile_.exchange(nullptr)) {
      Status st =
          CuFileErrorStatus("cuFileStreamDeregister", lib->api().stream_deregister(stream_));
      if (!st.ok()) OKV_LOG_WARN("destroying a registered stream: {}", st.ToString());
    }
    ORBITKV_CUDA_STATUS(ReleaseCrcScratch(&crc_scratch_, stream_))
        .IgnoreError("logged by the check");
    ORBITKV_CUDA_STATUS(cudaStreamDestroy(stream_)).IgnoreError("logged by the check");
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  const CudaPlatform* owner() const { return owner_; }
  int ordinal() const { return ordinal_; }
  cudaStream_t get() const { return stream_; }
  // The library this stream is registered with (cuFileStreamRegister), if any.
  std::atomic<const CuFileLibrary*>& cufile() { return cufile_; }
  // The CRC32C launches' scratch of this stream (crc32c_kernel.h), under
  // crc_mu(): a Crc32cAsync call holds it while it enqueues.
  std::mutex& crc_mu() { return crc_mu_; }
  CrcScratch* crc_scratch() { return &crc_scratch_; }

 private:
  const CudaPlatform* const owner_;
  const int ordinal_;
  const cudaStream_t stream_;
  std::atomic<const CuFileLibrary*> cufile_{nullptr};
  std::mutex crc_mu_;
  CrcScratch crc_scratch_;  // guarded by crc_mu_
};

class CudaEvent final : public Event {
 public:
  CudaEvent(const CudaPlatform* owner, int ordinal, cudaEvent_t event)
      : owner_(owner), ordinal_(ordinal), event_(event) {}
  ~CudaEvent() override {
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
    ORBITKV_CUDA_STATUS(cudaEventDestroy(event_)).IgnoreError("logged by the check");
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  const CudaPlatform* owner() const { return owner_; }
  int ordinal() const { return ordinal_; }
  cudaEvent_t get() const { return event_; }

 private:
  const CudaPlatform* const owner_;
  const int ordinal_;
  const cudaEvent_t event_;
};

class CudaStorageFile final : public StorageFile {
 public:
  CudaStorageFile(const CudaPlatform* owner, FileRegistration registration)
      : owner_(owner), registration_(std::move(registration)) {}
  int fd() const override { return registration_.fd(); }
  const CudaPlatform* owner() const { return owner_; }
  cufile::CUfileHandle_t handle() const { return registration_.handle(); }

 private:
  const CudaPlatform* const owner_;
  FileRegistration registration_;  // deregisters in its destructor
};

// A SlotTable of a CudaDevice: the checked slots in device memory.
class CudaSlotTable final : public SlotTable {
 public:
  CudaSlotTable(const Device* owner, int ordinal, GatherSlotDesc* table, size_t slots,
                uint64_t pages, uint64_t first_offset, uint64_t object_bytes)
      : owner_(owner),
        ordinal_(ordinal),
        table_(table),
        slots_(slots),
        pages_(pages),
        first_offset_(first_offset),
        object_bytes_(object_bytes) {}
  ~CudaSlotTable() override {
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
    ScopedRelaxedCaptureMode relaxed;
    ORBITKV_CUDA_STATUS(cudaFree(table_)).IgnoreError("logged by the check");
  }
  CudaSlotTable(const CudaSlotTable&) = delete;
  CudaSlotTable& operator=(const CudaSlotTable&) = delete;

  size_t slots() const override { return slots_; }
  uint64_t pages() const override { return pages_; }
  uint64_t object_bytes() const override { return object_bytes_; }
  const Device* owner() const { return owner_; }
  const GatherSlotDesc* table() const { return table_; }
  // Where the first slot starts in an object: what a gather writes is
  // [first_offset, object_bytes).
  uint64_t first_offset() const { return first_offset_; }

 private:
  const Device* const owner_;
  const int ordinal_;
  GatherSlotDesc* const table_;  // device memory, slots_ entries
  const size_t slots_;
  const uint64_t pages_;
  const uint64_t first_offset_;
  const uint64_t object_bytes_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(CudaPlatform* platform, int ordinal, const GpuCopyOptions& copy)
      : platform_(platform),
        ordinal_(ordinal),
        copy_(copy),
        shape_(StagingShapeOf(copy)),
        to_device_(CopyDirection::kToDevice, shape_),
        to_host_(CopyDirection::kToHost, shape_) {
    int v = 0;
    host_pointers_ok_ = cudaDeviceGetAttribute(&v, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                               ordinal) == cudaSuccess &&
                        v != 0;
    (void)cudaGetLastError();
  }
  ~CudaDevice() override {
    if (cudaSetDevice(ordinal_) != cudaSuccess) (void)cudaGetLastError();
  }

  int ordinal() const override { return ordinal_; }

  Result<IpcMapping> OpenIpc(const IpcHandle& handle) override;
  Status CloseIpc(DevPtr base) override;
  Result<DevPtr> Allocate(uint64_t bytes) override;
  Status Free(DevPtr ptr) override;
  Result<std::unique_ptr<Stream>> CreateStream() override;
  Result<std::unique_ptr<Event>> CreateEvent() override;
  Status Record(Event& event, Stream& stream) override;
  Result<bool> Poll(Event& event) override;
  Status Wait(Event& event) override;
  Status WaitLong(Event& event) override;
  Status Synchronize(Stream& stream) override;
  Status CopyAsync(std::span<const CopyOp> ops, Stream& stream) override;
  Status MemsetAsync(DevPtr dst, uint8_t value, uint64_t bytes, Stream& stream) override;
  Result<uint8_t*> AllocateHost(uint64_t bytes) override;
  // The known ranges hold the registered host ranges exactly when kernels
  // may use host pointers (KnownRanges).
  bool KernelsReadHost(const uint8_t* p, uint64_t bytes) const override {
    if (bytes == 0) return false;
    const std::shared_ptr<const AddressRangeTable> known = KnownRanges();
    const size_t i = known->Find(reinterpret_cast<uint64_t>(p), bytes);
    return i != AddressRangeTable::npos && (*known)[i].kind == Memory::kMappedHost;
  }
  Status FreeHost(uint8_t* ptr) override;
  Status Crc32cAsync(std::span<const CrcOp> ops, uint32_t* out, Stream& stream) override;
  Status HostFuncAsync(std::function<void()> fn, Stream& stream) override;
  Result<std::unique_ptr<SlotTable>> CreateSlotTable(std::span<const SlotSpan> slots,
                                                     uint64_t pages) override;
  Status GatherObjectsAsync(const SlotTable& table, std::span<const ObjectGather> objects,
                            uint32_t* crcs, Stream& stream) override;
  Status RegisterBuffer(DevPtr ptr, uint64_t bytes) override;
  Status DeregisterBuffer(DevPtr ptr) override;
  Status RegisterStream(Stream& stream) override;
  Status DeregisterStream(Stream& stream) override;
  Status ReadAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) override;
  Status WriteAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) override;
  Result<std::unique_ptr<FrameDecoder>> CreateFrameDecoder(uint32_t max_frames) override;
  Result<std::unique_ptr<FrameEncoder>> CreateFrameEncoder(uint32_t max_segments) override;

 private:
  // kMappedHost: pinned host memory the device reads and writes at the same
  // address (UVA, cudaDevAttrCanUseHostPointerForRegisteredMem).
  using Memory = MemoryKind;
  Status MakeCurrent() const { return ORBITKV_CUDA_STATUS(cudaSetDevice(ordinal_)); }
  Result<CudaStream*> Own(Stream& stream) const;
  Result<CudaEvent*> Own(Event& event) const;
  Result<CudaStorageFile*> Own(StorageFile& file) const;
  // The open cuFile library, or FailedPrecondition naming `call`.
  Result<const CuFileLibrary*> Storage(const char* call) const;
  Memory Classify(uint64_t address) const;
  // Classify, answered from `ranges` (the known table, then allocations an
  // earlier op of the call fell in) when [address, +bytes) lies wholly inside
  // one; otherwise asked of the driver and its allocation kept in `ranges`.
  Memory Classify(uint64_t address, uint64_t bytes, RangeLookup* ranges) const;
  Status AsyncIoCall(bool write, StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream);
  // Whether a kernel of this device may write [address, +bytes): wholly in
  // this device's memory or mapped host memory of `ranges`' table, or, for
  // memory only the driver knows, its first and last byte are of those kinds.
  bool KernelWritable(uint64_t address, uint64_t bytes, RangeLookup* ranges) const;

  static StagingShape StagingShapeOf(const GpuCopyOptions& copy) {
    StagingShape shape;
    shape.chunk_bytes = copy.staging_bytes;
    shape.direct_min_bytes = std::min<uint64_t>(copy.direct_bytes, copy.staging_bytes / 2);
    return shape;
  }
  // Logs the staged mover's device memory once it is first allocated.
  void NoteStaging();
  // Device memory this device handed out (Allocate) or mapped (OpenIpc) and
  // has not yet freed or closed: classified without asking the driver.
  void Remember(uint64_t base, uint64_t bytes) EXCLUDES(known_mu_);
  void Forget(uint64_t base) EXCLUDES(known_mu_);
  // What a copy call classifies without the driver: the remembered device
  // memory (kThisDevice) and, where kernels may use host pointers, the
  // process's registered host ranges (kMappedHost). Built when first needed
  // after either changed (Remember / Forget drop it; a registered host range
  // added or removed changes RegisteredHostGeneration), then shared by calls.
  std::shared_ptr<const AddressRangeTable> KnownRanges() const EXCLUDES(known_mu_);
  CudaPlatform* const platform_;
  const int ordinal_;
  const GpuCopyOptions copy_;
  const StagingShape shape_;
  StagedMover to_device_;  // staged H2D (ORBITKV_GPU_COPY=staged)
  StagedMover to_host_;    // staged D2H
  std::atomic<bool> staging_noted_{false};
  bool host_pointers_ok_ = false;  // constant after construction
  mutable Mutex known_mu_;
  std::map<uint64_t, uint64_t> known_ GUARDED_BY(known_mu_);  // base -> bytes
  // KnownRanges' table (null: rebuilt at the next call) and the registered
  // host ranges' generation it was built from.
  mutable std::shared_ptr<const AddressRangeTable> known_table_ GUARDED_BY(known_mu_);
  mutable uint64_t known_table_host_generation_ GUARDED_BY(known_mu_) = 0;
};

class CudaPlatform final : public Platform {
 public:
  CudaPlatform(int device_count, int runtime_version, int driver_version,
               const GpuCopyOptions& copy, FrameDecoderFactory decoders,
               FrameEncoderFactory encoders)
      : device_count_(device_count),
        runtime_version_(runtime_version),
        driver_version_(driver_version),
        copy_(copy),
        decoders_(std::move(decoders)),
        encoders_(std::move(encoders)),
        devices_(device_count) {}
  const FrameDecoderFactory& decoders() const { return decoders_; }
  const FrameEncoderFactory& encoders() const { return encoders_; }
  ~CudaPlatform() override = default;

  std::string Describe() const override {
    return "CUDA " + VersionText(runtime_version_) + " (driver " + VersionText(driver_version_) +
           "), " + std::to_string(device_count_) + (device_count_ == 1 ? " device" : " devices") +
           "; host copies " + copy_.Describe();
  }
  int device_count() const override { return device_count_; }

  Result<Device*> device(int ordinal) override {
    if (ordinal < 0 || ordinal >= device_count_) {
      return Status::InvalidArgument("CUDA device " + std::to_string(ordinal) +
                                     " does not exist (" + std::to_string(device_count_) +
                                     " visible)");
    }
    std::lock_guard<std::mutex> lock(devices_mu_);
    std::unique_ptr<CudaDevice>& slot = devices_[ordinal];
    if (slot == nullptr) {
      ORBITKV_RETURN_IF_ERROR(CheckDevice(ordinal));
      slot = std::make_unique<CudaDevice>(this, ordinal, copy_);
    }
    return static_cast<Device*>(slot.get());
  }

  Result<std::string> OpenStorage(StoragePolicy policy) override {
    std::lock_guard<std::mutex> lock(storage_mu_);
    if (opened_policy_.has_value()) {
      if (*opened_policy_ == policy) return storage_description_;
      return Status::FailedPrecondition("the cuFile driver is already open under another policy (" +
                                        storage_description_ + ")");
    }
    if (library_ == nullptr) {
      ORBITKV_ASSIGN_OR_RETURN(library_, CuFileLibrary::Load());
    }
    ORBITKV_RETURN_IF_ERROR(EnsureCurrentContext());
    ORBITKV_ASSIGN_OR_RETURN(const CuFileDriverInfo info,
                             library_->OpenDriver(ToCuFilePolicy(policy)));
    storage_description_ = "cuFile " + library_->VersionString() + " from " + library_->path() +
                           ": " + info.ToString();
    opened_policy_ = policy;
    storage_.store(library_.get(), std::memory_order_release);
    return storage_description_;
  }

  Result<std::unique_ptr<StorageFile>> RegisterFile(int fd) override {
    const CuFileLibrary* lib = storage();
    if (lib == nullptr) {
      return Status::FailedPrecondition("RegisterFile before a successful OpenStorage");
    }
    ORBITKV_RETURN_IF_ERROR(EnsureCurrentContext());
    ORBITKV_ASSIGN_OR_RETURN(FileRegistration reg, lib->RegisterFile(fd));
    return std::unique_ptr<StorageFile>(new CudaStorageFile(this, std::move(reg)));
  }

  // The library once OpenStorage succeeded, else null.
  const CuFileLibrary* storage() const { return storage_.load(std::memory_order_acquire); }

 private:
  // Constant after construction.
  const int device_count_;
  const int runtime_version_;
  const int driver_version_;
  const GpuCopyOptions copy_;
  const FrameDecoderFactory decoders_;
  const FrameEncoderFactory encoders_;

  std::mutex devices_mu_;
  std::vector<std::unique_ptr<CudaDevice>> devices_;  // guarded by devices_mu_

  std::mutex storage_mu_;
  std::unique_ptr<CuFileLibrary> library_;              // guarded by storage_mu_
  std::optional<StoragePolicy> opened_policy_;          // guarded by storage_mu_
  std::string storage_description_;                     // guarded by storage_mu_
  std::atomic<const CuFileLibrary*> storage_{nullptr};  // set once, after a successful open
};

// ---- CudaDevice ------------------------------------------------------------

Result<std::unique_ptr<FrameDecoder>> CudaDevice::CreateFrameDecoder(uint32_t max_frames) {
  if (!platform_->decoders()) {
    return Status::Unavailable("this CUDA platform was created without a frame decoder");
  }
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return platform_->decoders()(ordinal_, max_frames);
}

Result<std::unique_ptr<FrameEncoder>> CudaDevice::CreateFrameEncoder(uint32_t max_segments) {
  if (!platform_->encoders()) {
    return Status::Unavailable("this CUDA platform was created without a frame encoder");
  }
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return platform_->encoders()(ordinal_, max_segments);
}

Result<CudaStream*> CudaDevice::Own(Stream& stream) const {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  if (s == nullptr || s->owner() != platform_) {
    return Status::InvalidArgument("a stream of another platform");
  }
  if (s->ordinal() != ordinal_) {
    return Status::InvalidArgument("a stream of CUDA device " + std::to_string(s->ordinal()) +
                                   " used with device " + std::to_string(ordinal_));
  }
  return s;
}

Result<CudaEvent*> CudaDevice::Own(Event& event) const {
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr || e->owner() != platform_) {
    return Status::InvalidArgument("an event of another platform");
  }
  if (e->ordinal() != ordinal_) {
    return Status::InvalidArgument("an event of CUDA device " + std::to_string(e->ordinal()) +
                                   " used with device " + std::to_string(ordinal_));
  }
  return e;
}

Result<CudaStorageFile*> CudaDevice::Own(StorageFile& file) const {
  auto* f = dynamic_cast<CudaStorageFile*>(&file);
  if (f == nullptr || f->owner() != platform_) {
    return Status::InvalidArgument("a storage file of another platform");
  }
  return f;
}

Result<const CuFileLibrary*> CudaDevice::Storage(const char* call) const {
  const CuFileLibrary* lib = platform_->storage();
  if (lib == nullptr) {
    return Status::FailedPrecondition(std::string(call) + " before a successful OpenStorage");
  }
  return lib;
}

Result<IpcMapping> CudaDevice::OpenIpc(const IpcHandle& handle) {
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    Status st = ORBITKV_CUDA_STATUS(err);
    if (IsStickyCudaError(err)) return st;
    return Status::InvalidArgument("IPC handle does not open on CUDA device " +
                                   std::to_string(ordinal_) + ": " + std::string(st.message()));
  }
  const auto close = [&] {
    ORBITKV_CUDA_STATUS(cudaIpcCloseMemHandle(ptr))
        .IgnoreError("undoing a mapping whose size is unknown; logged by the check");
  };
  const AddressRangeEntry& range = DriverAddressRange();
  if (range.fn == nullptr) {
    close();
    return Status::Unavailable("cannot size IPC mappings: " + range.error);
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult res = range.fn(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  const auto mapped = reinterpret_cast<uint64_t>(ptr);
  if (res != CUDA_SUCCESS || mapped < base || mapped >= base + size) {
    close();
    return Status::Internal("cuMemGetAddressRange(" + Hex(mapped) + ") failed: CUresult " +
                            std::to_string(static_cast<int>(res)));
  }
  IpcMapping mapping;
  mapping.base = mapped;
  mapping.bytes = static_cast<uint64_t>(base + size - mapped);
  // Remembered only as what the driver says it is: this device's memory
  // (another device's allocation keeps being classified per call).
  if (Classify(mapping.base) == Memory::kThisDevice) Remember(mapping.base, mapping.bytes);
  return mapping;
}

Status CudaDevice::CloseIpc(DevPtr base) {
  if (base == 0) return Status::InvalidArgument("CloseIpc(0)");
  Forget(base);
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return ORBITKV_CUDA_STATUS(cudaIpcCloseMemHandle(reinterpret_cast<void*>(base)));
}

Result<DevPtr> CudaDevice::Allocate(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("Allocate of 0 bytes");
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  void* ptr = nullptr;
  Status st;
  {
    ScopedRelaxedCaptureMode relaxed;
    st = ORBITKV_CUDA_STATUS(cudaMalloc(&ptr, bytes));
  }
  if (!st.ok()) {
    return st.WithContext("allocating " + std::to_string(bytes) + " bytes on CUDA device " +
                          std::to_string(ordinal_));
  }
  Remember(reinterpret_cast<uint64_t>(ptr), bytes);
  return reinterpret_cast<DevPtr>(ptr);
}

Status CudaDevice::Free(DevPtr ptr) {
  if (ptr == 0) return Status::OK();
  Forget(ptr);
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  ScopedRelaxedCaptureMode relaxed;
  return ORBITKV_CUDA_STATUS(cudaFree(reinterpret_cast<void*>(ptr)));
}

Result<std::unique_ptr<Stream>> CudaDevice::CreateStream() {
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  cudaStream_t s = nullptr;
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::unique_ptr<Stream>(new CudaStream(platform_, ordinal_, s));
}

Result<std::unique_ptr<Event>> CudaDevice::CreateEvent() {
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  cudaEvent_t e = nullptr;
  // Blocking sync: a Wait past its spin sleeps instead of spinning a core.
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
  return std::unique_ptr<Event>(new CudaEvent(platform_, ordinal_, e));
}

Status CudaDevice::Record(Event& event, Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaEvent * e, Own(event));
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return ORBITKV_CUDA_STATUS(cudaEventRecord(e->get(), s->get()));
}

Result<bool> CudaDevice::Poll(Event& event) {
  ORBITKV_ASSIGN_OR_RETURN(CudaEvent * e, Own(event));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  const cudaError_t err = cudaEventQuery(e->get());
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return ORBITKV_CUDA_STATUS(err);
}

Status CudaDevice::Wait(Event& event) {
  ORBITKV_ASSIGN_OR_RETURN(CudaEvent * e, Own(event));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  // Poll for up to ORBITKV_GPU_WAIT_SPIN_US, then sleep in the blocking
  // synchronize (gpu/copy_options.h).
  if (copy_.wait_spin_us > 0) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::microseconds(copy_.wait_spin_us);
    do {
      const cudaError_t q = cudaEventQuery(e->get());
      if (q == cudaSuccess) return Status::OK();
      if (q != cudaErrorNotReady) return ORBITKV_CUDA_STATUS(q);
    } while (std::chrono::steady_clock::now() < until);
  }
  return ORBITKV_CUDA_STATUS(cudaEventSynchronize(e->get()));
}

Status CudaDevice::WaitLong(Event& event) {
  ORBITKV_ASSIGN_OR_RETURN(CudaEvent * e, Own(event));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  // A blocking-sync event: the thread sleeps until the GPU signals it.
  return ORBITKV_CUDA_STATUS(cudaEventSynchronize(e->get()));
}

Status CudaDevice::Synchronize(Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return ORBITKV_CUDA_STATUS(cudaStreamSynchronize(s->get()));
}

CudaDevice::Memory CudaDevice::Classify(uint64_t address) const {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(address)) != cudaSuccess) {
    (void)cudaGetLastError();  // an address CUDA does not know: not an error to keep
    return Memory::kUnknown;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      return attr.device == ordinal_ ? Memory::kThisDevice : Memory::kElsewhere;
    case cudaMemoryTypeManaged:
      return Memory::kThisDevice;  // kernels reach managed memory from any device
    case cudaMemoryTypeHost:
      // Pinned host memory: the copy engines, or the gather kernel when the
      // device can use the host address as is.
      return attr.devicePointer == reinterpret_cast<void*>(address) ? Memory::kMappedHost
                                                                    : Memory::kElsewhere;
    default:
      return Memory::kUnknown;  // cudaMemoryTypeUnregistered: pageable
  }
}

void CudaDevice::Remember(uint64_t base, uint64_t bytes) {
  MutexLock lock(known_mu_);
  known_[base] = bytes;
  known_table_.reset();
}

void CudaDevice::Forget(uint64_t base) {
  MutexLock lock(known_mu_);
  known_.erase(base);
  known_table_.reset();
}

std::shared_ptr<const AddressRangeTable> CudaDevice::KnownRanges() const {
  const uint64_t host_generation = RegisteredHostGeneration();
  MutexLock lock(known_mu_);
  if (known_table_ && known_table_host_generation_ == host_generation) return known_table_;
  std::vector<AddressRange> ranges;
  for (const auto& [base, bytes] : known_)
    ranges.push_back({base, base + bytes, Memory::kThisDevice});
  uint64_t built_from = host_generation;
  if (host_pointers_ok_) {
    for (const auto& [begin, end] : RegisteredHostRanges(&built_from)) {
      ranges.push_back({begin, end, Memory::kMappedHost});
    }
  }
  known_table_ = std::make_shared<const AddressRangeTable>(std::move(ranges));
  known_table_host_generation_ = built_from;
  return known_table_;
}

CudaDevice::Memory CudaDevice::Classify(uint64_t address, uint64_t bytes,
                                        RangeLookup* ranges) const {
  // Memory this device mapped or this process registered, or an allocation an
  // earlier op of the call fell in: no lock, no driver call (a restore
  // classifies two addresses per slot of every block; with a locked map
  // lookup each, 2048 slots took a few hundred microseconds before the first
  // DMA of a 64 MiB restore was enqueued).
  Memory found = Memory::kUnknown;
  if (ranges->Find(address, bytes, &found)) return found;
  const Memory kind = Classify(address);
  const AddressRangeEntry& range = DriverAddressRange();
  if (kind == Memory::kUnknown || range.fn == nullptr) return kind;
  // The allocation's extent, where the driver knows it (device memory; pinned
  // host memory may not answer, and is then classified op by op).
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range.fn(&base, &size, static_cast<CUdeviceptr>(address)) != CUDA_SUCCESS || size == 0 ||
      address < base || address - base >= size) {
    return kind;
  }
  return ranges->Keep(static_cast<uint64_t>(base), static_cast<uint64_t>(base) + size, kind);
}

void CudaDevice::NoteStaging() {
  if (staging_noted_.exchange(true)) return;
  OKV_LOG_INFO(
      "cuda:{}: staged host copies hold {} of device staging (2 x {} per direction, outside "
      "--pool-size; {}); registered host memory is classified {}",
      ordinal_, FormatByteSize(copy_.StagingBudget()), FormatByteSize(copy_.staging_bytes),
      kGpuCopyStagingEnv,
      host_pointers_ok_ ? "from the device's address table"
                        : "per call by the driver (cudaDevAttrCanUseHostPointerForRegisteredMem "
                          "is 0)");
}

namespace {

// The per-call vectors of CudaDevice::CopyAsync, one set per thread, their
// capacity kept: a 70B TP=8 Publish's 16000 ops would otherwise allocate (and
// page-fault in) several 400 KB vectors per call.
struct CopyScratch {
  std::vector<CopyDesc> kernel_ops;
  std::vector<CopyDesc> engine_ops;
  std::vector<CopyOp> staged[2];  // [0] to the device, [1] to the host
  StagedCopyPlanner planner;
};

// Staged ops planned per window of about this share of a staging chunk, each
// window's final chunks enqueued before the next is planned.
constexpr uint64_t kPlanWindowsPerChunk = 4;

}  // namespace

Status CudaDevice::CopyAsync(std::span<const CopyOp> ops, Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  if (ops.empty()) return Status::OK();
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  thread_local CopyScratch scratch;
  std::vector<CopyDesc>& kernel_ops = scratch.kernel_ops;
  std::vector<CopyDesc>& engine_ops = scratch.engine_ops;
  std::vector<CopyOp>(&staged)[2] = scratch.staged;
  kernel_ops.clear();
  engine_ops.clear();
  staged[0].clear();
  staged[1].clear();
  // Every op is checked and classified before anything is enqueued: a bad op
  // fails the call with nothing copied.
  const std::shared_ptr<const AddressRangeTable> known = KnownRanges();
  RangeLookup ranges(*known);
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.bytes == 0) continue;
    if (op.dst == 0 || op.src == 0 || op.dst + op.bytes < op.dst || op.src + op.bytes < op.src) {
      return Status::InvalidArgument("CopyAsync op " + std::to_string(i) + ": bad range " +
                                     Hex(op.src) + " -> " + Hex(op.dst) + ", " +
                                     std::to_string(op.bytes) + " bytes");
    }
    const Memory src = Classify(op.src, op.bytes, &ranges);
    const Memory dst = Classify(op.dst, op.bytes, &ranges);
    if (src == Memory::kUnknown || dst == Memory::kUnknown) {
      return Status::InvalidArgument(
          "CopyAsync op " + std::to_string(i) + ": " +
          Hex(src == Memory::kUnknown ? op.src : op.dst) +
          " is neither device memory nor pinned host memory (pageable host memory must be "
          "registered with CUDA first)");
    }
    const CopyDesc desc{op.dst, op.src, op.bytes};
    // Host <-> device: as ORBITKV_GPU_COPY says (gpu/copy_options.h).
    const bool to_device = src == Memory::kMappedHost && dst == Memory::kThisDevice;
    const bool to_host = src == Memory::kThisDevice && dst == Memory::kMappedHost;
    if ((to_device || to_host) && copy_.mode == HostCopyMode::kStaged && !shape_.Direct(op.bytes)) {
      staged[to_device ? 0 : 1].push_back(op);
    } else if ((to_device || to_host) && copy_.mode == HostCopyMode::kKernel) {
      kernel_ops.push_back(desc);
    } else if (src == Memory::kThisDevice && dst == Memory::kThisDevice) {
      kernel_ops.push_back(desc);
    } else {
      // Also a staged mover's op of its direct size (StagingShape::Direct,
      // the planner's own rule, so its plan().direct stays empty here): a
      // call of only such ops (a split layout's 32 KiB slots) needs neither
      // the plan nor the stream check below.
      engine_ops.push_back(desc);
    }
  }
  // Staged only from a caller stream with nothing pending: the movers'
  // streams are shared by the device's callers, and waiting there for a busy
  // stream (a cuFile worker's I/O, a held host function) would hold every
  // other stream's staged copies behind it. A busy stream's copies take the
  // copy engines on the stream itself.
  if ((!staged[0].empty() || !staged[1].empty()) && cudaStreamQuery(s->get()) != cudaSuccess) {
    for (std::vector<CopyOp>& v : staged) {
      for (const CopyOp& op : v) engine_ops.push_back({op.dst, op.src, op.bytes});
      v.clear();
    }
  }
  // The caller stream's own share, enqueued after the staged chunks (and
  // running while they run).
  const auto direct = [&]() -> cudaError_t {
    if (!kernel_ops.empty()) {
      const cudaError_t err = LaunchGatherScatter(kernel_ops.data(), kernel_ops.size(), s->get());
      if (err != cudaSuccess) return err;
    }
    if (!engine_ops.empty()) {
      return EnqueueEngineCopies(engine_ops.data(), engine_ops.size(), s->get(), nullptr,
                                 copy_.engine_first_batch);
    }
    return cudaSuccess;
  };
  if (staged[0].empty() && staged[1].empty()) {
    ORBITKV_CUDA_RETURN_IF_ERROR(direct());
    return Status::OK();
  }
  // Staged ops: planned one window at a time (StagedCopyPlanner), each
  // window's final chunks enqueued before the next window is planned, so a
  // large call's first chunks move while the rest is planned. (Ops of the
  // direct size are not among them: they joined the engine ops above.)
  StagedMover* movers[2] = {&to_device_, &to_host_};
  bool began[2] = {false, false};
  const uint64_t window = std::max<uint64_t>(shape_.chunk_bytes / kPlanWindowsPerChunk, 1);
  cudaError_t err = cudaSuccess;
  for (int d = 0; d < 2 && err == cudaSuccess; ++d) {
    const std::vector<CopyOp>& todo = staged[d];
    if (todo.empty()) continue;
    StagedCopyPlanner& planner = scratch.planner;
    planner.Reset(d == 0 ? CopyDirection::kToDevice : CopyDirection::kToHost, shape_);
    size_t enqueued = 0;  // chunks of the plan enqueued
    for (size_t begin = 0; begin < todo.size() && err == cudaSuccess;) {
      size_t end = begin;
      for (uint64_t bytes = 0; end < todo.size() && bytes < window; ++end) bytes += todo[end].bytes;
      planner.Add(std::span<const CopyOp>(todo).subspan(begin, end - begin));
      begin = end;
      if (begin == todo.size()) planner.Finish();
      const size_t ready = planner.final_chunks();
      if (ready == enqueued) continue;
      if (!began[d]) {
        NoteStaging();
        began[d] = true;
        if ((err = movers[d]->Begin(s->get())) != cudaSuccess) break;
      }
      err = movers[d]->Chunks(planner.plan(), enqueued, ready);
      enqueued = ready;
    }
  }
  if (err == cudaSuccess) err = direct();
  // The caller stream waits for whatever was enqueued, even after an error.
  for (int d = 0; d < 2; ++d) {
    if (!began[d]) continue;
    const cudaError_t end_err = movers[d]->End(s->get());
    if (err == cudaSuccess) err = end_err;
  }
  ORBITKV_CUDA_RETURN_IF_ERROR(err);
  return Status::OK();
}

Status CudaDevice::MemsetAsync(DevPtr dst, uint8_t value, uint64_t bytes, Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  if (bytes == 0) return Status::OK();
  if (dst == 0) return Status::InvalidArgument("MemsetAsync of address 0");
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return ORBITKV_CUDA_STATUS(
      cudaMemsetAsync(reinterpret_cast<void*>(dst), value, static_cast<size_t>(bytes), s->get()));
}

Result<uint8_t*> CudaDevice::AllocateHost(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("AllocateHost of 0 bytes");
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  void* ptr = nullptr;
  Status st;
  {
    ScopedRelaxedCaptureMode relaxed;
    st = ORBITKV_CUDA_STATUS(
        cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  }
  if (!st.ok()) {
    return Status::ResourceExhausted(
        st.WithContext("allocating " + std::to_string(bytes) + " bytes of pinned host memory")
            .ToString());
  }
  return static_cast<uint8_t*>(ptr);
}

Status CudaDevice::FreeHost(uint8_t* ptr) {
  if (ptr == nullptr) return Status::OK();
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  ScopedRelaxedCaptureMode relaxed;
  return ORBITKV_CUDA_STATUS(cudaFreeHost(ptr));
}

Status CudaDevice::Crc32cAsync(std::span<const CrcOp> ops, uint32_t* out, Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  if (ops.empty()) return Status::OK();
  if (out == nullptr) return Status::InvalidArgument("Crc32cAsync: null result address");
  std::vector<CrcDesc> descs;
  descs.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const CrcOp& op = ops[i];
    if (op.bytes > 0 && (op.data == 0 || op.data + op.bytes < op.data)) {
      return Status::InvalidArgument("Crc32cAsync op " + std::to_string(i) + ": bad range " +
                                     Hex(op.data) + ", " + std::to_string(op.bytes) + " bytes");
    }
    descs.push_back({op.data, op.bytes});
  }
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  std::lock_guard lock(s->crc_mu());
  ORBITKV_CUDA_RETURN_IF_ERROR(
      LaunchCrc32c(descs.data(), descs.size(), out, s->get(), s->crc_scratch()));
  return Status::OK();
}

bool CudaDevice::KernelWritable(uint64_t address, uint64_t bytes, RangeLookup* ranges) const {
  if (address == 0 || bytes == 0 || address + bytes < address) return false;
  const auto ok = [](Memory m) { return m == Memory::kThisDevice || m == Memory::kMappedHost; };
  Memory m = Memory::kUnknown;
  if (ranges->Find(address, bytes, &m)) return ok(m);
  return ok(Classify(address, 1, ranges)) && ok(Classify(address + bytes - 1, 1, ranges));
}

Result<std::unique_ptr<SlotTable>> CudaDevice::CreateSlotTable(std::span<const SlotSpan> slots,
                                                               uint64_t pages) {
  if (!host_pointers_ok_) {
    return Status::Unavailable(
        "cuda:" + std::to_string(ordinal_) +
        ": kernels cannot use registered host pointers as they are "
        "(cudaDevAttrCanUseHostPointerForRegisteredMem is 0), so objects are not gathered");
  }
  std::vector<uint64_t> extents, zero_after;
  ORBITKV_ASSIGN_OR_RETURN(const uint64_t object_bytes,
                           CheckSlotSpans(slots, pages, &extents, &zero_after));
  uint64_t first_offset = object_bytes;
  const std::shared_ptr<const AddressRangeTable> known = KnownRanges();
  RangeLookup ranges(*known);
  std::vector<GatherSlotDesc> descs;
  descs.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotSpan& sl = slots[i];
    // From the device's table, else the allocation the driver names (kept in
    // `ranges` by Classify): every page's bytes inside it.
    Memory m = Memory::kUnknown;
    if (!ranges.Find(sl.base, extents[i], &m)) {
      Classify(sl.base, 1, &ranges);
      if (!ranges.Find(sl.base, extents[i], &m)) m = Memory::kUnknown;
    }
    if (m != Memory::kThisDevice) {
      return Status::InvalidArgument(
          "CreateSlotTable slot " + std::to_string(i) + ": [" + Hex(sl.base) + ", +" +
          std::to_string(extents[i]) +
          ") is not inside one allocation or IPC mapping of cuda:" + std::to_string(ordinal_));
    }
    descs.push_back({sl.base, sl.stride, sl.bytes, sl.offset, zero_after[i]});
    first_offset = std::min(first_offset, sl.offset);
  }
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  ScopedRelaxedCaptureMode relaxed;  // as Allocate: a thread may be capturing a graph
  GatherSlotDesc* table = nullptr;
  const size_t bytes = sizeof(GatherSlotDesc) * descs.size();
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&table), bytes));
  // On the device before the first gather can run: the gathers' kernels are
  // on non-blocking streams, not ordered after a plain cudaMemcpy's DMA.
  if (const cudaError_t e = CopyToDeviceAndWait(table, descs.data(), bytes); e != cudaSuccess) {
    cudaFree(table);
    ORBITKV_CUDA_RETURN_IF_ERROR(e);
  }
  return std::unique_ptr<SlotTable>(std::make_unique<CudaSlotTable>(
      this, ordinal_, table, descs.size(), pages, first_offset, object_bytes));
}

Status CudaDevice::GatherObjectsAsync(const SlotTable& table, std::span<const ObjectGather> objects,
                                      uint32_t* crcs, Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  const auto* t = dynamic_cast<const CudaSlotTable*>(&table);
  if (t == nullptr || t->owner() != this) {
    return Status::InvalidArgument("GatherObjectsAsync: the table is not one of cuda:" +
                                   std::to_string(ordinal_));
  }
  if (objects.empty()) return Status::OK();
  const std::shared_ptr<const AddressRangeTable> known = KnownRanges();
  RangeLookup ranges(*known);
  const uint64_t crc_bytes = sizeof(uint32_t) * t->slots() * objects.size();
  if (!KernelWritable(reinterpret_cast<uint64_t>(crcs), crc_bytes, &ranges)) {
    return Status::InvalidArgument("GatherObjectsAsync: the CRCs' " + std::to_string(crc_bytes) +
                                   " bytes at " + Hex(reinterpret_cast<uint64_t>(crcs)) +
                                   " are neither device memory nor registered host memory");
  }
  thread_local std::vector<GatherObjectDesc> descs;
  descs.clear();
  descs.reserve(objects.size());
  bool all_host = true;
  for (size_t i = 0; i < objects.size(); ++i) {
    const ObjectGather& o = objects[i];
    if (o.page >= t->pages()) {
      return Status::InvalidArgument("GatherObjectsAsync object " + std::to_string(i) + ": page " +
                                     std::to_string(o.page) + " of a table over " +
                                     std::to_string(t->pages()) + " pages");
    }
    if (!KernelWritable(o.object, t->object_bytes(), &ranges)) {
      return Status::InvalidArgument("GatherObjectsAsync object " + std::to_string(i) + ": [" +
                                     Hex(o.object) + ", +" + std::to_string(t->object_bytes()) +
                                     ") is neither device memory nor registered host memory");
    }
    Memory m = Memory::kUnknown;
    all_host = all_host && ranges.Find(o.object, t->object_bytes(), &m) && m == Memory::kMappedHost;
    descs.push_back({o.page, o.object});
  }
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  const auto slots = static_cast<uint32_t>(t->slots());
  // Objects in host memory: gathered into the staged mover's device staging
  // (a short kernel) and moved to the host by the copy engines,
  // double-buffered, as its other copies to the host are; under
  // ORBITKV_GPU_COPY=kernel (the zero-copy mover) the kernel writes them
  // straight to the host. A 70B TP=8 publish ran at 59% of D2H written
  // straight from the kernel and 68-72% staged (H100, session 19). The
  // staging is shared with the mover's other callers in FIFO order, so, as
  // CopyAsync does, only from a caller stream with nothing pending.
  const uint64_t first = t->first_offset();
  const uint64_t span = t->object_bytes() - first;
  const uint64_t stride = (span + 15) / 16 * 16;  // per object in staging
  if (!all_host || copy_.mode == HostCopyMode::kKernel || stride > shape_.chunk_bytes ||
      cudaStreamQuery(s->get()) != cudaSuccess) {
    ORBITKV_CUDA_RETURN_IF_ERROR(
        LaunchGatherObjects(t->table(), slots, descs.data(), descs.size(), crcs, s->get()));
    return Status::OK();
  }
  const size_t per_chunk = static_cast<size_t>(shape_.chunk_bytes / stride);
  NoteStaging();
  cudaError_t err = to_host_.Begin(s->get());
  if (err != cudaSuccess) {
    ORBITKV_CUDA_RETURN_IF_ERROR(err);
  }
  thread_local std::vector<GatherObjectDesc> staged;
  thread_local std::vector<CopyDesc> spans;
  for (size_t c = 0; c < descs.size() && err == cudaSuccess; c += per_chunk) {
    const size_t n = std::min(per_chunk, descs.size() - c);
    spans.clear();
    for (size_t i = 0; i < n; ++i) spans.push_back({descs[c + i].object + first, i * stride, span});
    err = to_host_.FilledChunk(
        [&](uint64_t buffer, cudaStream_t work) {
          staged.clear();
          // Object i's first slot at buffer + i * stride.
          for (size_t i = 0; i < n; ++i)
            staged.push_back({descs[c + i].page, buffer + i * stride - first});
          return LaunchGatherObjects(t->table(), slots, staged.data(), n, crcs + c * slots, work);
        },
        spans);
  }
  // The caller stream waits for whatever was enqueued, even after an error.
  const cudaError_t end_err = to_host_.End(s->get());
  if (err == cudaSuccess) err = end_err;
  ORBITKV_CUDA_RETURN_IF_ERROR(err);
  return Status::OK();
}

namespace {

void CUDART_CB RunHostFunc(void* arg) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(arg));
  try {
    (*fn)();
  } catch (const std::exception& e) {
    OKV_LOG_ERROR("a stream host function threw: {}", e.what());
  } catch (...) {
    OKV_LOG_ERROR("a stream host function threw a non-standard exception");
  }
}

}  // namespace

Status CudaDevice::HostFuncAsync(std::function<void()> fn, Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  if (!fn) return Status::InvalidArgument("HostFuncAsync of an empty function");
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  auto heap = std::make_unique<std::function<void()>>(std::move(fn));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(s->get(), &RunHostFunc, heap.get()));
  heap.release();  // RunHostFunc owns it now
  return Status::OK();
}

Status CudaDevice::RegisterBuffer(DevPtr ptr, uint64_t bytes) {
  ORBITKV_ASSIGN_OR_RETURN(const CuFileLibrary* lib, Storage("RegisterBuffer"));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return lib->RegisterBuffer(reinterpret_cast<void*>(ptr), static_cast<size_t>(bytes));
}

Status CudaDevice::DeregisterBuffer(DevPtr ptr) {
  ORBITKV_ASSIGN_OR_RETURN(const CuFileLibrary* lib, Storage("DeregisterBuffer"));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  return lib->DeregisterBuffer(reinterpret_cast<void*>(ptr));
}

Status CudaDevice::RegisterStream(Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(const CuFileLibrary* lib, Storage("RegisterStream"));
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  // Flags 0: no promise about sizes or offsets; cuFile reads them when the
  // operation runs, as AsyncIo documents.
  ORBITKV_RETURN_IF_ERROR(CuFileErrorStatus("cuFileStreamRegister",
                                            lib->api().stream_register(s->get(), 0),
                                            "CUDA device " + std::to_string(ordinal_)));
  s->cufile().store(lib);
  return Status::OK();
}

Status CudaDevice::DeregisterStream(Stream& stream) {
  ORBITKV_ASSIGN_OR_RETURN(const CuFileLibrary* lib, Storage("DeregisterStream"));
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  ORBITKV_RETURN_IF_ERROR(CuFileErrorStatus("cuFileStreamDeregister",
                                            lib->api().stream_deregister(s->get()),
                                            "CUDA device " + std::to_string(ordinal_)));
  s->cufile().store(nullptr);
  return Status::OK();
}

Status CudaDevice::AsyncIoCall(bool write, StorageFile& file, DevPtr buffer, AsyncIo* io,
                               Stream& stream) {
  const char* call = write ? "cuFileWriteAsync" : "cuFileReadAsync";
  ORBITKV_ASSIGN_OR_RETURN(const CuFileLibrary* lib, Storage(call));
  ORBITKV_ASSIGN_OR_RETURN(CudaStorageFile * f, Own(file));
  ORBITKV_ASSIGN_OR_RETURN(CudaStream * s, Own(stream));
  if (io == nullptr || buffer == 0) {
    return Status::InvalidArgument(std::string(call) + " needs an AsyncIo and a buffer");
  }
  ORBITKV_RETURN_IF_ERROR(MakeCurrent());
  const CuFileApi& api = lib->api();
  auto* base = reinterpret_cast<void*>(buffer);
  const cufile::CUfileError_t err =
      write ? api.write_async(f->handle(), base, &io->size, &io->file_offset, &io->buf_offset,
                              &io->bytes_done, s->get())
            : api.read_async(f->handle(), base, &io->size, &io->file_offset, &io->buf_offset,
                             &io->bytes_done, s->get());
  if (err.err == cufile::CU_FILE_SUCCESS) return Status::OK();
  return CuFileErrorStatus(call, err,
                           "fd " + std::to_string(f->fd()) + " [" +
                               std::to_string(io->file_offset) + ", +" + std::to_string(io->size) +
                               ") buffer " + Hex(buffer) + "+" + std::to_string(io->buf_offset));
}

Status CudaDevice::ReadAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) {
  return AsyncIoCall(false, file, buffer, io, stream);
}

Status CudaDevice::WriteAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) {
  return AsyncIoCall(true, file, buffer, io, stream);
}

}  // namespace

void* CudaStreamHandle(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  return s ? static_cast<void*>(s->get()) : nullptr;
}

Result<std::unique_ptr<Platform>> CreateCudaPlatform(FrameDecoderFactory decoders,
                                                     FrameEncoderFactory encoders) {
  ORBITKV_ASSIGN_OR_RETURN(const int count, DeviceCount());
  if (count == 0) return Status::Unavailable("no CUDA device (or no driver) on this host");
  int runtime = 0;
  int driver = 0;
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
  ORBITKV_ASSIGN_OR_RETURN(const GpuCopyOptions copy, GpuCopyOptionsFromEnvironment());
  return std::unique_ptr<Platform>(
      new CudaPlatform(count, runtime, driver, copy, std::move(decoders), std::move(encoders)));
}

}  // namespace orbitkv::gpu
