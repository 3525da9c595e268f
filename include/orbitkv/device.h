// Device names: where an instance's pages live. "host" (memfd page memory) or
// "cuda:N" (CUDA device N). One parser for the wire decoder, the Manager and
// the tools, so every entry point accepts exactly the same spellings.
#pragma once

#include <cstdint>
#include <string_view>

#include "orbitkv/status.h"

namespace orbitkv {

inline constexpr uint32_t kMaxCudaDeviceOrdinal = 1023;

struct DeviceSpec {
  bool cuda = false;     // false: "host"
  uint32_t ordinal = 0;  // N of "cuda:N"; 0 for host
};

// Parses "host" or "cuda:N", N a decimal in [0, kMaxCudaDeviceOrdinal] written
// without sign, spaces or leading zeros ("cuda:0", "cuda:17"; not "cuda:",
// "cuda:01", "cuda:-1", "cuda:1x"). Anything else is InvalidArgument naming
// `field`, with the bad value echoed printable and bounded.
Result<DeviceSpec> ParseDevice(std::string_view device, std::string_view field = "device");

}  // namespace orbitkv
