#include "gpu/copy_options.h"

#include <cctype>
#include <cerrno>
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
    out += " (4 x " + FormatByteSize(staging_bytes) + " device staging per device, ops of " +
           FormatByteSize(direct_bytes) + " or more to the copy engines)";
  }
  out += engine_first_batch > 0
             ? ", copy-engine batches of " + std::to_string(engine_first_batch) + " ops doubling"
             : ", copy-engine batches of 128 ops";
  out += ", waits spin " + std::to_string(wait_spin_us) + " us then sleep";
  return out;
}

namespace {

// A size variable's value within [min, max] (named in the error), into *out;
// unset (null or empty) leaves *out as it is.
Status ParseSizeVariable(const char* name, const char* value, uint64_t min, uint64_t max,
                         std::string_view range, uint64_t* out) {
  if (value == nullptr || *value == '\0') return Status::OK();
  Result<uint64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) {
    return Status::InvalidArgument(std::string(name) + ": " +
                                   std::string(bytes.status().message()));
  }
  if (*bytes < min || *bytes > max) {
    return Status::InvalidArgument(std::string(name) + "='" + value + "': must be within " +
                                   std::string(range));
  }
  *out = *bytes;
  return Status::OK();
}

// An unsigned decimal variable within [0, max], into *out; unset leaves *out.
Status ParseCountVariable(const char* name, const char* value, uint64_t max, std::string_view what,
                          uint32_t* out) {
  if (value == nullptr || *value == '\0') return Status::OK();
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(value, &end, 10);
  if (errno != 0 || *end != '\0' || !std::isdigit(static_cast<unsigned char>(*value)) || v > max) {
    return Status::InvalidArgument(std::string(name) + "='" + value + "': expected " +
                                   std::string(what) + ", 0.." + std::to_string(max));
  }
  *out = static_cast<uint32_t>(v);
  return Status::OK();
}

}  // namespace

Result<GpuCopyOptions> ParseGpuCopyOptions(const char* mode, const char* staging,
                                           const char* direct, const char* wait_spin_us,
                                           const char* first_batch) {
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
  ORBITKV_RETURN_IF_ERROR(ParseSizeVariable(kGpuCopyStagingEnv, staging, 1u << 20, 256u << 20,
                                            "1mib..256mib", &o.staging_bytes));
  ORBITKV_RETURN_IF_ERROR(ParseSizeVariable(kGpuCopyDirectEnv, direct, 4u << 10, 256u << 20,
                                            "4kib..256mib", &o.direct_bytes));
  ORBITKV_RETURN_IF_ERROR(
      ParseCountVariable(kGpuWaitSpinEnv, wait_spin_us, 100000, "microseconds", &o.wait_spin_us));
  ORBITKV_RETURN_IF_ERROR(
      ParseCountVariable(kGpuFirstBatchEnv, first_batch, 128, "ops", &o.engine_first_batch));
  return o;
}

Result<GpuCopyOptions> GpuCopyOptionsFromEnvironment() {
  return ParseGpuCopyOptions(std::getenv(kGpuCopyEnv), std::getenv(kGpuCopyStagingEnv),
                             std::getenv(kGpuCopyDirectEnv), std::getenv(kGpuWaitSpinEnv),
                             std::getenv(kGpuFirstBatchEnv));
}

}  // namespace orbitkv::gpu
