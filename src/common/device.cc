#include "orbitkv/device.h"

#include <fmt/format.h>

#include "common/printable.h"

namespace orbitkv {

std::string Printable(std::string_view s) {
  constexpr size_t kMaxEcho = 64;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxEcho; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > kMaxEcho) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

Result<DeviceSpec> ParseDevice(std::string_view device, std::string_view field) {
  if (device == "host") return DeviceSpec{};
  constexpr std::string_view kCuda = "cuda:";
  if (device.starts_with(kCuda)) {
    const std::string_view n = device.substr(kCuda.size());
    // 1..4 digits, no leading zero (one spelling per device), at most 1023.
    bool digits = !n.empty() && n.size() <= 4 && (n.size() == 1 || n[0] != '0');
    uint32_t ordinal = 0;
    for (char c : n) {
      if (!digits || c < '0' || c > '9') {
        digits = false;
        break;
      }
      ordinal = ordinal * 10 + static_cast<uint32_t>(c - '0');
    }
    if (digits && ordinal <= kMaxCudaDeviceOrdinal) return DeviceSpec{true, ordinal};
  }
  return Status::InvalidArgument(
      fmt::format("{}: \"{}\" is not \"host\" or \"cuda:N\" (N a decimal 0..{} without sign or "
                  "leading zeros)",
                  field, Printable(device), kMaxCudaDeviceOrdinal));
}

}  // namespace orbitkv
