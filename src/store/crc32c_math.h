// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, ~0 in and out: the
// iSCSI / ext4 / RocksDB checksum) arithmetic shared by the CPU code
// (store/crc32c.h) and the GPU kernel (gpu/crc32c_kernel.cu): the byte table
// step and the GF(2) algebra that combines the CRCs of adjacent byte ranges.
//
// Every function is pure. C++17 and no library types, so nvcc compiles it as
// __host__ __device__ code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORBITKV_CRC_HD __host__ __device__
#else
#define ORBITKV_CRC_HD
#endif

namespace orbitkv::crc32c {

inline constexpr uint32_t kPoly = 0x82F63B78u;  // reflected 0x1EDC6F41

// a * b modulo the CRC polynomial, both in the reflected representation (bit
// 31 is x^0).
ORBITKV_CRC_HD inline constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t p = 0;
  while (m != 0) {
    if (a & m) p ^= b;
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * bytes) modulo the polynomial: the operator that moves a CRC register
// past `bytes` zero bytes.
ORBITKV_CRC_HD inline constexpr uint32_t ShiftOperator(uint64_t bytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 23;  // x^8: one byte
  while (bytes != 0) {
    if (bytes & 1) result = MultModP(square, result);
    square = MultModP(square, square);
    bytes >>= 1;
  }
  return result;
}

// The CRC32C of A || B from crc_a = CRC32C(A), crc_b = CRC32C(B) and |B|.
ORBITKV_CRC_HD inline constexpr uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultModP(ShiftOperator(len_b), crc_a) ^ crc_b;
}

// One byte through the raw (unconditioned) register, bitwise: for building
// tables; hot loops use a table made of it.
ORBITKV_CRC_HD inline constexpr uint32_t ByteStep(uint32_t reg, uint8_t byte) {
  reg ^= byte;
  for (int k = 0; k < 8; ++k) reg = (reg & 1) ? (reg >> 1) ^ kPoly : reg >> 1;
  return reg;
}

}  // namespace orbitkv::crc32c
