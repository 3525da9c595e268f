// CUDA kernels of the codec decoders (codec_kernels.cu), behind
// codec/codec_cuda.h: a CRC32C pass over whole frames, then one decode
// kernel per codec that checks the CRC before it writes a byte and gives the
// CPU decoder's bytes. Frames and outputs are device memory, 16-byte aligned.
// Each frame's outcome lands in status[i] (a KernelError; the largest wins).
// C++17-clean (nvcc); internal to src/codec.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "codec/ans_encode.h"
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

// One segment for the GPU encoders: raw (device, bf16/fp16) into frame
// (device), whose header (codec/codec_internal.h writers) is already there.
struct KernelSegment {
  const uint8_t* raw;
  uint64_t raw_size;
  uint8_t* frame;
  uint64_t frame_size;  // MaxEncodedSize: exact for fp8 and TurboQuant
};

// Writes the payload of every frame (fp8: scales and e4m3fn bytes;
// TurboQuant: norms and indices; `codebook` (device) its 2^bits centroids,
// `seed` the frame's) exactly as
// the CPU encoder does, then its CRC32C. head_dim: the fp8 group, the
// TurboQuant vector size. frames_for_crc: the same frames as KernelFrames
// (frame, frame_size). max_raw_size sizes the grid.
cudaError_t LaunchEncode(uint8_t codec, bool bf16, uint32_t head_dim, uint64_t seed,
                         const float* codebook, const KernelSegment* segments,
                         const KernelFrame* frames_for_crc, uint32_t count, uint64_t max_raw_size,
                         uint64_t max_frame_size, const Crc32cTables* tables, uint32_t* crc_acc,
                         cudaStream_t stream);

// One segment for the GPU ans encoder. Inputs from the host: raw, raw_size,
// frame, dtype and the shape (planes, chunk, chunks: AnsChunkElements and
// AnsChunkCount of the CPU encoder), and device scratch: counts (planes x 256,
// zeroed), tables (planes), words (planes x chunks). layout: written by the
// encoder.
struct AnsEncodeJob {
  const uint8_t* raw;
  uint64_t raw_size;
  uint8_t* frame;
  uint32_t planes, chunk, chunks;
  uint8_t dtype;
  uint32_t* counts;
  AnsEncTable* tables;
  uint32_t* words;
  AnsFrameLayout layout;
};

// Encodes every job's frame exactly as the CPU's AnsEncode does, then its
// CRC32C (format `version`). frames_for_crc: (frame, size 0) per job, the
// sizes filled in on the device; sizes[i] (device): frame i's size.
// max_raw_size and max_items (planes x chunks) size the grids.
cudaError_t LaunchAnsEncode(uint8_t version, AnsEncodeJob* jobs, KernelFrame* frames_for_crc,
                            uint64_t* sizes, uint32_t count, uint64_t max_raw_size,
                            uint64_t max_items, const Crc32cTables* tables, uint32_t* crc_acc,
                            cudaStream_t stream);

}  // namespace orbitkv::codec::internal
