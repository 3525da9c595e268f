// Device::Crc32cAsync on CUDA: CRC32C (store/crc32c_math.h, the object
// format's checksum; equal to ISA-L's crc32_iscsi with ~0 in and out) of
// byte ranges in device memory, computed by kernels, so the cuFile read route
// checks payloads in GPU staging before a byte is scattered into engine pages.
//
// Every range is cut into 16 KiB pieces spread over the whole grid, one
// thread block per piece, and a second small kernel combines each range's
// pieces (gpu/crc32c_grid.h describes the decomposition). Descriptors travel
// by value as kernel parameters, kCrcOpsPerLaunch per launch; results are
// written to out[i] (device memory or mapped pinned host memory) when the
// kernels run. The pieces' registers live in stream-ordered scratch from a
// per-device memory pool (4 bytes per 16 KiB): one allocation per call,
// allocated and freed on the stream, or, with a CrcScratch of the stream's,
// kept there and reused by the stream's next calls (grown when a call needs
// more), so a stream's steady calls allocate nothing. Ranges may start at any address and have any
// length, 0 included. Returns the first CUDA error; REQUIRES: the calling thread's current device
// is the stream's. Thread-safe. C++17 and CUDA runtime types only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/crc32c_grid.h"  // kCrcOpsPerLaunch

namespace orbitkv::gpu {

struct CrcDesc {
  uint64_t data = 0;  // device address (0 only with bytes == 0)
  uint64_t bytes = 0;
};

// Stream-ordered scratch owned by one stream: only calls on that stream use
// it (their kernels run in stream order, so reuse is safe), one at a time.
// Give it back with ReleaseCrcScratch before the stream is destroyed.
struct CrcScratch {
  uint32_t* data = nullptr;
  uint64_t entries = 0;
};

// `scratch`: the stream's CrcScratch, or null for a per-call allocation.
cudaError_t LaunchCrc32c(const CrcDesc* ops, size_t count, uint32_t* out, cudaStream_t stream,
                         CrcScratch* scratch = nullptr);
// Frees `scratch` on `stream` (stream-ordered) and empties it.
cudaError_t ReleaseCrcScratch(CrcScratch* scratch, cudaStream_t stream);

}  // namespace orbitkv::gpu
