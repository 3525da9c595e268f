// Byte sizes as flags and configs spell them: "8gb", "512gb", "64kib", "4096".
// Units (case-insensitive): b; kb, mb, gb, tb (powers of 1000); kib, mib, gib,
// tib (powers of 1024). A fraction is allowed when it names whole bytes
// ("1.5kb" = 1500). Spaces, signs, a second '.', unknown units and values
// above 2^64-1 are errors whose message quotes the input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "orbitkv/status.h"

namespace orbitkv {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

Result<uint64_t> ParseByteSize(std::string_view text);

// "512 GB" style for logs: the largest decimal unit that keeps three digits,
// or binary units when the value is an exact multiple of 1 KiB but not of 1 KB.
std::string FormatByteSize(uint64_t bytes);

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline constexpr uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

}  // namespace orbitkv
