// CreateCudaFrameEncoder: the CUDA platform's gpu::FrameEncoder
// (gpu/platform.h), CudaEncoder (codec/codec_cuda.h) behind the seam: the
// frames the CPU encoder gives. Pass it to gpu::CreateCudaPlatform. Each call
// makes the encoder's device current on the calling thread; streams must be
// the CUDA platform's own (others are InvalidArgument). Not thread-safe, like
// CudaEncoder.
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::codec {

// An encoder on device `ordinal` for batches of up to max_segments segments.
// InvalidArgument for max_segments 0; CUDA errors as they come.
Result<std::unique_ptr<gpu::FrameEncoder>> CreateCudaFrameEncoder(int ordinal,
                                                                  uint32_t max_segments);

}  // namespace orbitkv::codec
