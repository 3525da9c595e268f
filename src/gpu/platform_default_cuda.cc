#include <string>
#include <utility>

#include "codec/cuda_frame_decoder.h"
#include "codec/cuda_frame_encoder.h"
#include "gpu/cuda_platform.h"
#include "gpu/platform_default.h"

namespace orbitkv::gpu {

std::unique_ptr<Platform> CreateDefaultPlatform(std::string* why) {
  Result<std::unique_ptr<Platform>> platform =
      CreateCudaPlatform(codec::CreateCudaFrameDecoder, codec::CreateCudaFrameEncoder);
  if (!platform.ok()) {
    // A bad ORBITKV_GPU_COPY* value is the user's to fix, not a missing device.
    *why = platform.status().code() == StatusCode::kInvalidArgument
               ? std::string(platform.status().message())
               : "no CUDA device: " + std::string(platform.status().message());
    return nullptr;
  }
  return std::move(platform).value();
}

}  // namespace orbitkv::gpu
