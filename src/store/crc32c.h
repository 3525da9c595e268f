// CRC32C of byte ranges on the CPU (the object format's checksum: header and
// every segment). Computed by ISA-L (crc32_iscsi: SSE4.2 / PCLMUL / AVX-512,
// memory speed); gpu/crc32c_kernel.cu computes the same values on the GPU.
//
// Crc32c(data, crc) continues `crc`, the CRC32C of the bytes before `data`
// (0 for none), like zlib's crc32: Crc32c(B, Crc32c(A)) == Crc32c(A || B).
// Crc32c("123456789") == 0xE3069283. Pure and thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include "store/crc32c_math.h"

namespace orbitkv {

uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc = 0);

// The CRC32C of A || B from Crc32c(A), Crc32c(B) and |B| (no data needed).
inline uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return crc32c::Combine(crc_a, crc_b, len_b);
}

}  // namespace orbitkv
