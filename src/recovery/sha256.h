// SHA-256 (Nettle's), for the model fingerprint and the group masks: computed
// at register time, never per query. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace orbitkv::recovery {

std::array<uint8_t, 32> Sha256(std::span<const uint8_t> bytes);

}  // namespace orbitkv::recovery
