#include "gpu/copy_options.h"

#include <cstdlib>

#include "orbitkv/units.h"

namespace orbitkv::gpu {

std::string_view HostCopyModeName(HostCopyMode mode) {
  switch (mode) {
    case HostCopyMode::kStaged:
      return "staged";
    case HostCopyMode::kEngines:
      return "engines";
    case HostCopyMode::kKernel:
      return "kernel";
  }
  return "?";
}

std::string GpuCopyOptions::Describe() const {
  std::string out(HostCopyModeName(mode));
  if (mode == HostCopyMode::kStaged) {
    out += " (4 x " + FormatByteSize(staging_bytes) + " device staging per device)";
  }
  return out;
}

Result<GpuCopyOptions> ParseGpuCopyOptions(const char* mode, const char* staging) {
  GpuCopyOptions o;
  if (mode != nullptr && *mode != '\0') {
    const std::string_view m(mode);
    if (m == "staged") {
      o.mode = HostCopyMode::kStaged;
    } else if (m == "engines") {
      o.mode = HostCopyMode::kEngines;
    } else if (m == "kernel") {
      o.mode = HostCopyMode::kKernel;
    } else {
      return Status::InvalidArgument(std::string(kGpuCopyEnv) + "='" + std::string(m) +
                                     "': expected staged, engines or kernel");
    }
  }
  if (staging != nullptr && *staging != '\0') {
    Result<uint64_t> bytes = ParseByteSize(staging);
    if (!bytes.ok()) {
      return Status::InvalidArgument(std::string(kGpuCopyStagingEnv) + ": " +
                                     std::string(bytes.status().message()));
    }
    if (*bytes < (1u << 20) || *bytes > (256u << 20)) {
      return Status::InvalidArgument(std::string(kGpuCopyStagingEnv) + "='" + staging +
                                     "': must be within 1mib..256mib");
    }
    o.staging_bytes = *bytes;
  }
  return o;
}

Result<GpuCopyOptions> GpuCopyOptionsFromEnvironment() {
  return ParseGpuCopyOptions(std::getenv(kGpuCopyEnv), std::getenv(kGpuCopyStagingEnv));
}

}  // namespace orbitkv::gpu
