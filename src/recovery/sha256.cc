#include "recovery/sha256.h"

#include <nettle/sha2.h>

namespace orbitkv::recovery {

std::array<uint8_t, 32> Sha256(std::span<const uint8_t> bytes) {
  static_assert(SHA256_DIGEST_SIZE == 32);
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, bytes.size(), bytes.data());
  std::array<uint8_t, 32> out;
  sha256_digest(&ctx, out.size(), out.data());
  return out;
}

}  // namespace orbitkv::recovery
