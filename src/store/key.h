// Key: the opaque 32-byte block key an engine chooses (vLLM block hash, SGLang
// page hash). A key names a whole prefix within a namespace.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace orbitkv {

struct Key {
  std::array<uint8_t, 32> bytes{};
  friend bool operator==(const Key&, const Key&) = default;
  friend auto operator<=>(const Key&, const Key&) = default;
  // First 8 bytes as hex, for logs.
  std::string ShortHex() const;
  static Key FromU64(uint64_t v) {  // tests and demos
    Key k;
    std::memcpy(k.bytes.data(), &v, sizeof v);
    return k;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h;
    std::memcpy(&h, k.bytes.data() + 8, sizeof h);
    uint64_t l;
    std::memcpy(&l, k.bytes.data(), sizeof l);
    return static_cast<size_t>((h ^ (l * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL);
  }
};

}  // namespace orbitkv
