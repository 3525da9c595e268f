// Device::Crc32cAsync on CUDA: CRC32C (store/crc32c_math.h, the object
// format's checksum; equal to ISA-L's crc32_iscsi with ~0 in and out) of
// byte ranges in device memory, computed by a kernel, so the cuFile read route
// checks payloads in GPU staging before a byte is scattered into engine pages.
//
// One thread block per range: each thread runs slice-by-4 tables (shared
// memory) over a contiguous chunk, and the chunks' CRCs are combined in order
// with the GF(2) shift operator. Descriptors travel by value as kernel
// parameters, kCrcOpsPerLaunch per launch; results are written to out[i]
// (device memory or mapped pinned host memory) when the kernel runs.
// Returns the first launch error; REQUIRES: the calling thread's current
// device is the stream's. Thread-safe. C++17 and CUDA runtime types only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace orbitkv::gpu {

struct CrcDesc {
  uint64_t data = 0;  // device address (0 only with bytes == 0)
  uint64_t bytes = 0;
};

inline constexpr size_t kCrcOpsPerLaunch = 128;

cudaError_t LaunchCrc32c(const CrcDesc* ops, size_t count, uint32_t* out, cudaStream_t stream);

}  // namespace orbitkv::gpu
