// CudaDecoder: decodes codec frames (codec/codec.h) that are already in GPU
// memory straight into GPU pages, giving the CPU decoder's bytes. For each
// frame it first checks the prefix against what the caller expects (codec,
// frame size, decoded size, dtype, param), its CRC32C and, where given, the
// stored bytes' CRC32C (an object header's segment CRC) on the GPU; a frame
// that fails there is not written at all, nor is any frame of its group (an
// object's segments decode all or none). A frame whose codec header or streams are
// malformed past that point fails with Corruption and its output bytes are
// unspecified: callers fail the block (the engine recomputes it).
// One decoder per stream at a time: DecodeAsync then Finish; not thread-safe.
// CudaEncoder writes ans, fp8 and TurboQuant frames on the GPU that are byte
// for byte the CPU encoder's; likewise one EncodeAsync then Finish at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "codec/codec.h"
#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::codec {

// One frame in device memory and its destination. Both 16-byte aligned.
struct DeviceFrame {
  const uint8_t* frame = nullptr;  // input, device
  uint64_t frame_size = 0;         // input: the encoded segment size (object format)
  uint8_t* out = nullptr;          // output, device
  uint64_t out_size = 0;           // input: the decoded segment size
  // The further checks of gpu::DecodeOp (gpu/platform.h), same meanings.
  std::optional<uint32_t> segment_crc;
  uint8_t dtype = 0;
  std::optional<uint32_t> param;
  bool check_only = false;
  uint32_t group = gpu::DecodeOp::kOwnGroup;
};

class CudaDecoder {
 public:
  // Device scratch for up to max_frames frames per call, on the current
  // device. Unavailable without a usable GPU.
  static Result<std::unique_ptr<CudaDecoder>> Create(uint32_t max_frames);
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // Enqueues the check and decode of `frames`, all of codec `codec` (and, for
  // TurboQuant, of head vectors of `head_dim`) on `stream`. The frames and
  // outputs must stay valid until Finish returns. InvalidArgument for
  // misaligned pointers, a group out of range, a check-only frame without
  // segment_crc, more than max_frames frames or kNone.
  Status DecodeAsync(CodecId codec, std::span<const DeviceFrame> frames, uint32_t head_dim,
                     cudaStream_t stream);

  // Waits for the stream and returns one result per frame of the last
  // DecodeAsync (Corruption naming the cause); a CUDA failure as the Status.
  Result<std::vector<gpu::DecodeResult>> Finish(cudaStream_t stream);

  // The device memory its scratch holds (frame table, statuses, CRCs, tables).
  uint64_t device_scratch_bytes() const;

 private:
  struct Buffers;
  explicit CudaDecoder(std::unique_ptr<Buffers> b);
  std::unique_ptr<Buffers> b_;
};

// One raw segment in device memory and its frame buffer. Both 16-byte aligned.
struct DeviceSegment {
  const uint8_t* raw = nullptr;  // input, device: elements of info.dtype (bf16/fp16; ans
                                 // also fp8)
  uint64_t raw_size = 0;         // input
  uint8_t* frame = nullptr;      // output, device: MaxEncodedSize(codec, info, raw_size) bytes
                                 // (fp8, TurboQuant: exactly the frame's size; ans: the frame
                                 // is data-dependent, its size comes from Finish)
  uint64_t frame_capacity = 0;   // input
};

class CudaEncoder {
 public:
  // Scratch for up to max_segments segments per call; Unavailable without a GPU.
  static Result<std::unique_ptr<CudaEncoder>> Create(uint32_t max_segments);
  ~CudaEncoder();
  CudaEncoder(const CudaEncoder&) = delete;
  CudaEncoder& operator=(const CudaEncoder&) = delete;

  // Enqueues the encoding of `segments` (all of `info`) on `stream`: the
  // frames the CPU's Encode(codec, info, raw, ..., options) gives.
  // InvalidArgument for shapes Encode refuses, small or misaligned buffers,
  // more than max_segments; Unavailable for none (no frame). Buffers stay
  // valid until Finish returns. ans grows device scratch (about 4 bytes per
  // chunk and plane, 5 KiB per segment) when a call needs more than any before.
  Status EncodeAsync(CodecId codec, const SegmentInfo& info,
                     std::span<const DeviceSegment> segments, cudaStream_t stream,
                     const EncodeOptions& options = {});
  // Waits for the stream; the frames are complete when it returns, with their
  // sizes (one per segment of the last EncodeAsync).
  Result<std::vector<uint64_t>> Finish(cudaStream_t stream);

 private:
  struct Buffers;
  explicit CudaEncoder(std::unique_ptr<Buffers> b);
  Status EncodeAnsAsync(const SegmentInfo& info, std::span<const DeviceSegment> segments,
                        cudaStream_t stream, const EncodeOptions& options);
  std::unique_ptr<Buffers> b_;
};

}  // namespace orbitkv::codec
