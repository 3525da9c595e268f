#include <string>
#include <utility>

#include "gpu/cuda_platform.h"
#include "gpu/platform_default.h"

namespace orbitkv::gpu {

std::unique_ptr<Platform> CreateDefaultPlatform(std::string* why) {
  Result<std::unique_ptr<Platform>> platform = CreateCudaPlatform();
  if (!platform.ok()) {
    *why = "no CUDA device: " + std::string(platform.status().message());
    return nullptr;
  }
  return std::move(platform).value();
}

}  // namespace orbitkv::gpu
