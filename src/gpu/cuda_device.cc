#include "gpu/cuda_device.h"

#include <atomic>
#include <map>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cuda_check.h"
#include "orbitkv/logging.h"

// The lowest CUDA architecture the build emits code for (90 for sm_90),
// from CMAKE_CUDA_ARCHITECTURES; 0 disables the compute capability check.
#ifndef ORBITKV_GPU_MIN_CUDA_ARCH
#define ORBITKV_GPU_MIN_CUDA_ARCH 0
#endif

namespace orbitkv::gpu {

Result<int> DeviceCount() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess) return count;
  (void)cudaGetLastError();
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:  // no libcuda.so.1, or one older than the runtime
    case cudaErrorStubLibrary:         // the toolkit's link stub was loaded instead of a driver
      OKV_LOG_DEBUG("no usable CUDA device: {}", CudaErrorText(err));
      return 0;
    default:
      return Status::Unavailable("cudaGetDeviceCount: " + CudaErrorText(err));
  }
}

Status CheckDevice(int device) {
  ORBITKV_ASSIGN_OR_RETURN(const int count, DeviceCount());
  if (count == 0) return Status::Unavailable("no CUDA device (or no driver) on this host");
  if (device < 0 || device >= count) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                                   std::to_string(count) + " visible)");
  }
  int major = 0;
  int minor = 0;
  int mode = 0;
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device));
  if (mode == cudaComputeModeProhibited) {
    return Status::FailedPrecondition("CUDA device " + std::to_string(device) +
                                      " is in prohibited compute mode");
  }
  const int arch = major * 10 + minor;
  if (ORBITKV_GPU_MIN_CUDA_ARCH > 0 && arch < ORBITKV_GPU_MIN_CUDA_ARCH) {
    return Status::FailedPrecondition(
        "CUDA device " + std::to_string(device) + " has compute capability " +
        std::to_string(major) + "." + std::to_string(minor) + "; this build targets sm_" +
        std::to_string(ORBITKV_GPU_MIN_CUDA_ARCH) + " and newer (CMAKE_CUDA_ARCHITECTURES)");
  }
  return Status::OK();
}

ScopedRelaxedCaptureMode::ScopedRelaxedCaptureMode() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  Status st = ORBITKV_CUDA_STATUS(cudaThreadExchangeStreamCaptureMode(&mode));
  if (st.ok()) {
    previous_ = mode;
    active_ = true;
  }
}

ScopedRelaxedCaptureMode::~ScopedRelaxedCaptureMode() {
  if (!active_) return;
  cudaStreamCaptureMode mode = previous_;
  ORBITKV_CUDA_STATUS(cudaThreadExchangeStreamCaptureMode(&mode))
      .IgnoreError("logged; restoring a capture mode has no caller to report to");
}

Result<PinnedAllocation> PinnedAllocation::Allocate(size_t bytes, unsigned int flags) {
  if (bytes == 0) return Status::InvalidArgument("PinnedAllocation of 0 bytes");
  void* ptr = nullptr;
  Status st;
  {
    ScopedRelaxedCaptureMode relaxed;
    st = ORBITKV_CUDA_STATUS(cudaHostAlloc(&ptr, bytes, flags));
  }
  if (!st.ok()) return st.WithContext("pinning " + std::to_string(bytes) + " host bytes");
  return PinnedAllocation(ptr, bytes);
}

PinnedAllocation::~PinnedAllocation() {
  Free().IgnoreError("logged by the check; a destructor has no caller to report to");
}

PinnedAllocation::PinnedAllocation(PinnedAllocation&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedAllocation& PinnedAllocation::operator=(PinnedAllocation&& other) noexcept {
  if (this != &other) {
    Free().IgnoreError("logged by the check; replaced by a move");
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Status PinnedAllocation::Free() {
  if (ptr_ == nullptr) return Status::OK();
  void* ptr = std::exchange(ptr_, nullptr);
  size_ = 0;
  ScopedRelaxedCaptureMode relaxed;
  return ORBITKV_CUDA_STATUS(cudaFreeHost(ptr));
}

namespace {

// Ranges registered by RegisterHostMemory: base -> bytes.
struct HostRanges {
  std::shared_mutex mu;
  std::map<uint64_t, uint64_t> ranges;  // guarded by mu
  // Written under mu (unique); read without it by RegisteredHostGeneration.
  std::atomic<uint64_t> generation{0};
};

HostRanges& Registered() {
  static HostRanges* r = new HostRanges();  // never destroyed: used until exit
  return *r;
}

}  // namespace

Status RegisterHostMemory(void* base, size_t size) {
  if (base == nullptr || size == 0) {
    return Status::InvalidArgument("RegisterHostMemory needs a non-empty range");
  }
  ScopedRelaxedCaptureMode relaxed;
  Status st = ORBITKV_CUDA_STATUS(cudaHostRegister(base, size, cudaHostRegisterPortable));
  if (!st.ok()) return st.WithContext("registering " + std::to_string(size) + " host bytes");
  HostRanges& r = Registered();
  std::unique_lock<std::shared_mutex> lock(r.mu);
  r.ranges[reinterpret_cast<uint64_t>(base)] = size;
  r.generation.fetch_add(1);
  return st;
}

Status UnregisterHostMemory(void* base) {
  if (base == nullptr) return Status::InvalidArgument("UnregisterHostMemory(nullptr)");
  {
    // Forgotten first (a new generation): a copy classified from here on asks
    // the driver.
    HostRanges& r = Registered();
    std::unique_lock<std::shared_mutex> lock(r.mu);
    if (r.ranges.erase(reinterpret_cast<uint64_t>(base)) > 0) r.generation.fetch_add(1);
  }
  ScopedRelaxedCaptureMode relaxed;
  return ORBITKV_CUDA_STATUS(cudaHostUnregister(base));
}

uint64_t RegisteredHostGeneration() { return Registered().generation.load(); }

std::vector<std::pair<uint64_t, uint64_t>> RegisteredHostRanges(uint64_t* generation) {
  HostRanges& r = Registered();
  std::shared_lock<std::shared_mutex> lock(r.mu);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.reserve(r.ranges.size());
  for (const auto& [base, bytes] : r.ranges) out.emplace_back(base, base + bytes);
  if (generation) *generation = r.generation.load();
  return out;
}

}  // namespace orbitkv::gpu
