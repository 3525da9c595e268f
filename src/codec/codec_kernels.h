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
  // LaunchCheckAndDecode only (the encoders leave them zero):
  uint32_t segment_crc = 0;  // CRC32C of the stored frame bytes (kFrameCheckSegmentCrc)
  uint32_t verdict = 0;      // index into verdicts[]: frames sharing one decode all or none
  uint32_t param = 0;        // the prefix param it must have (kFrameCheckParam)
  uint8_t dtype = 0;         // the element dtype it must name; 0: any
  uint8_t flags = 0;         // kFrameCheck*
};

inline constexpr uint8_t kFrameCheckSegmentCrc = 1;  // compare segment_crc
inline constexpr uint8_t kFrameCheckParam = 2;       // compare param
inline constexpr uint8_t kFrameCheckOnly = 4;        // segment CRC only, never decoded (out unused)

// Stored in status[]: 0 is success. Larger is worse (atomicMax).
enum KernelError : int32_t {
  kKernelOk = 0,
  kKernelBadStream = 1,   // a chunk stream that does not decode
  kKernelBadHeader = 2,   // codec header fields out of range
  kKernelCrc = 3,         // CRC32C mismatch (nothing written)
  kKernelBadPrefix = 4,   // magic, codec, version, sizes (nothing written)
  kKernelSegmentCrc = 5,  // the stored bytes' CRC32C is not segment_crc (nothing written)
};
// Codes of the check pass: a frame with one (or whose verdict has one) is not decoded.
inline constexpr int32_t kKernelFirstCheckError = kKernelCrc;

// Checks every frame (prefix fields against `codec`, its format `version`,
// the caller's sizes, dtype and param, its own CRC32C and, where flagged,
// the stored bytes' CRC32C; a kFrameCheckOnly frame only that) and writes
// status[i], folding it into verdicts[frame.verdict] (the largest code);
// then decodes the frames that are not check-only and whose verdict is
// still kKernelOk. crc_acc: count words of scratch, verdicts: count words
// (only indices the frames name are read); tables: device copy of
// MakeCrc32cTables(). max_frame_size and max_out_size size the grids;
// head_dim (TurboQuant only) picks the kernel, frames of another are
// kKernelBadHeader.
cudaError_t LaunchCheckAndDecode(uint8_t codec, uint8_t version, const KernelFrame* frames,
                                 uint32_t count, uint64_t max_frame_size, uint64_t max_out_size,
                                 uint32_t head_dim, const Crc32cTables* tables, uint32_t* crc_acc,
                                 int32_t* status, int32_t* verdicts, cudaStream_t stream);

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
