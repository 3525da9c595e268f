#include <string>

#include "gpu/platform_default.h"

namespace orbitkv::gpu {

std::unique_ptr<Platform> CreateDefaultPlatform(std::string* why) {
  *why = "this build has no CUDA";
  return nullptr;
}

}  // namespace orbitkv::gpu
