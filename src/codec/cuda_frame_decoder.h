// CreateCudaFrameDecoder: the CUDA platform's gpu::FrameDecoder
// (gpu/platform.h), CudaDecoder (codec/codec_cuda.h) behind the seam. Pass it
// to gpu::CreateCudaPlatform. Each call makes the decoder's device current on
// the calling thread; streams must be the CUDA platform's own (others are
// InvalidArgument). Not thread-safe, like CudaDecoder.
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::codec {

// A decoder on device `ordinal` for batches of up to max_frames frames.
// InvalidArgument for max_frames outside [1, 65535]; CUDA errors as they come.
Result<std::unique_ptr<gpu::FrameDecoder>> CreateCudaFrameDecoder(int ordinal, uint32_t max_frames);

}  // namespace orbitkv::codec
