// CUDA devices and pinned host memory for the GPU tier.
// DeviceCount() is 0 on a host without a GPU or without a driver: that is a
// normal configuration, not an error. Pinned allocations and host
// registrations run with the calling thread's stream-capture mode relaxed and
// restore it afterwards, so pinning memory while an engine captures a CUDA
// graph does not invalidate that capture. The DRAM pool registers its arena
// through DramCacheOptions::on_arena with RegisterHostMemory.
// Thread-safe: every function; a PinnedAllocation object is thread-compatible.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "orbitkv/status.h"

namespace orbitkv::gpu {

// The number of CUDA devices this process can use; 0 when there is no GPU, no
// driver, or only the driver's stub library. Other runtime failures (driver
// mismatch, devices busy in exclusive mode) are kUnavailable. Never aborts.
Result<int> DeviceCount();

// OK when `device` exists, is not in prohibited compute mode and can run this
// build's kernels (compute capability at least the lowest CUDA architecture the
// build targets). InvalidArgument for an out-of-range index, FailedPrecondition
// for an unusable device, Unavailable without devices. Does not change the
// calling thread's current device or create a context.
Status CheckDevice(int device);

// Sets the calling thread's stream-capture interaction mode to relaxed for the
// object's lifetime and then restores the previous mode. In relaxed mode a
// potentially synchronizing call (cudaHostAlloc, cudaHostRegister, ...) made
// while another stream is being captured neither fails nor invalidates it.
class ScopedRelaxedCaptureMode {
 public:
  ScopedRelaxedCaptureMode();
  ~ScopedRelaxedCaptureMode();
  ScopedRelaxedCaptureMode(const ScopedRelaxedCaptureMode&) = delete;
  ScopedRelaxedCaptureMode& operator=(const ScopedRelaxedCaptureMode&) = delete;
  // Whether the mode was exchanged (false only if the runtime refused).
  bool active() const { return active_; }

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeGlobal;
  bool active_ = false;
};

// Page-locked host memory from cudaHostAlloc, freed with cudaFreeHost; both
// under relaxed capture mode. Move-only. Default flags make it portable (every
// device's context sees it as pinned).
class PinnedAllocation {
 public:
  // REQUIRES: bytes > 0. ResourceExhausted when the allocation fails.
  static Result<PinnedAllocation> Allocate(size_t bytes,
                                           unsigned int flags = cudaHostAllocPortable);

  PinnedAllocation() = default;
  ~PinnedAllocation();
  PinnedAllocation(PinnedAllocation&& other) noexcept;
  PinnedAllocation& operator=(PinnedAllocation&& other) noexcept;
  PinnedAllocation(const PinnedAllocation&) = delete;
  PinnedAllocation& operator=(const PinnedAllocation&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  explicit operator bool() const { return ptr_ != nullptr; }

  // Frees now and reports the result (the destructor logs and ignores it).
  Status Free();

 private:
  PinnedAllocation(void* ptr, size_t size) : ptr_(ptr), size_(size) {}
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// cudaHostRegister(base, size, portable) under relaxed capture mode: pins an
// existing host range (the DRAM pool's mmap arena) for DMA by every device.
// AlreadyExists when the range is already registered.
// REQUIRES: base != nullptr, size > 0; base page aligned for best results.
Status RegisterHostMemory(void* base, size_t size);

// cudaHostUnregister(base) under relaxed capture mode. FailedPrecondition when
// `base` was not registered.
Status UnregisterHostMemory(void* base);

// Changes (by one or more) whenever a RegisterHostMemory or
// UnregisterHostMemory call changed the registered ranges.
uint64_t RegisteredHostGeneration();

// The registered ranges [first, second), and (when not null) the generation
// they are of, read together.
std::vector<std::pair<uint64_t, uint64_t>> RegisteredHostRanges(uint64_t* generation = nullptr);

}  // namespace orbitkv::gpu
