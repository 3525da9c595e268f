// CUDA kernels of the codec decoders (codec_kernels.cu), behind
// codec/codec_cuda.h: a CRC32C pass over whole frames, then one decode
// kernel per codec that checks the CRC before it writes a byte and gives the
// CPU decoder's bytes. Frames and outputs are device memory, 16-byte aligned.
// Each frame's outcome lands in status[i] (a KernelError; the largest wins).
// C++17-clean (nvcc); internal to src/codec.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "codec/crc32c_parallel.h"

namespace orbitkv::codec::internal {

struct KernelFrame {
  const uint8_t* frame;  // device
  uint64_t frame_size;   // bytes the caller read for it
  uint8_t* out;          // device
  uint64_t out_size;     // bytes the caller expects decoded
};

// Stored in status[]: 0 is success. Larger is worse (atomicMax).
enum KernelError : int32_t {
  kKernelOk = 0,
  kKernelBadStream = 1,  // a chunk stream that does not decode
  kKernelBadHeader = 2,  // codec header fields out of range
  kKernelCrc = 3,        // CRC32C mismatch (nothing written)
  kKernelBadPrefix = 4,  // magic, codec, version, sizes (nothing written)
};

// Checks every frame (prefix fields against `codec`, its format `version`
// and the caller's sizes,
// CRC32C) and writes status[i]; then decodes the frames whose status is
// still kKernelOk. crc_acc: count words of scratch; tables: device copy of
// MakeCrc32cTables(). max_frame_size and max_out_size size the grids;
// head_dim (TurboQuant only) picks the kernel, frames of another are
// kKernelBadHeader.
cudaError_t LaunchCheckAndDecode(uint8_t codec, uint8_t version, const KernelFrame* frames,
                                 uint32_t count, uint64_t max_frame_size, uint64_t max_out_size,
                                 uint32_t head_dim, const Crc32cTables* tables, uint32_t* crc_acc,
                                 int32_t* status, cudaStream_t stream);

}  // namespace orbitkv::codec::internal
