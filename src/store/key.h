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
  // Four word compares, inlined (the directories compare keys on every hit).
  friend bool operator==(const Key& a, const Key& b) {
    uint64_t x[4], y[4];
    std::memcpy(x, a.bytes.data(), sizeof x);
    std::memcpy(y, b.bytes.data(), sizeof y);
    return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
  }
  friend auto operator<=>(const Key&, const Key&) = default;
  // First 8 bytes as hex, for logs.
  std::string ShortHex() const;
  static Key FromU64(uint64_t v) {  // tests and demos
    Key k;
    std::memcpy(k.bytes.data(), &v, sizeof v);
    return k;
  }
};

// The Key of an engine's block key (BlockKey, orbitkv/cache_api.h: the same
// 32 bytes).
inline Key ToKey(const std::array<uint8_t, 32>& k) {
  Key out;
  out.bytes = k;
  return out;
}

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
