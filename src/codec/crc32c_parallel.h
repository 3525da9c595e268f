// CRC32C in independent pieces, for the CUDA decoder's CRC check (and its CPU
// test): the CRC register is linear over GF(2), so the CRC of a frame is
// ~(Shift(~0, n) ^ XOR_i Shift(Raw(piece_i), bytes after piece_i)), where Raw
// runs the register from 0 over a piece (the first piece may start it at ~0
// instead, which folds in the Shift(~0, n) term) and Shift(r, k) appends k zero bytes
// (a multiplication by x^(8k) modulo the polynomial, bit 31 = x^0).
// C++17-clean and usable on the device; pure functions.
#pragma once

#include <cstdint>

#include "codec/float_bits.h"

namespace orbitkv::codec {

inline constexpr uint32_t kCrc32cPoly = 0x82f63b78u;  // reflected Castagnoli

struct Crc32cTables {
  uint32_t slice[4][256];  // slicing-by-4; slice[0] moves one byte through the register
  uint32_t x8pow2k[64];    // x^(8 * 2^k) mod P
};

OKV_HD uint32_t Crc32cMulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCrc32cPoly : b >> 1;
  }
  return product;
}

// The register after `bytes` zero bytes.
OKV_HD uint32_t Crc32cShift(const Crc32cTables& t, uint32_t reg, uint64_t bytes) {
  for (int k = 0; bytes != 0; ++k, bytes >>= 1) {
    if (bytes & 1) reg = Crc32cMulModP(t.x8pow2k[k], reg);
  }
  return reg;
}

OKV_HD uint32_t Crc32cByte(const uint32_t (*slice)[256], uint32_t reg, uint8_t b) {
  return slice[0][(reg ^ b) & 0xffu] ^ (reg >> 8);
}

// Four bytes, w read little-endian.
OKV_HD uint32_t Crc32cWord(const uint32_t (*slice)[256], uint32_t reg, uint32_t w) {
  reg ^= w;
  return slice[3][reg & 0xffu] ^ slice[2][(reg >> 8) & 0xffu] ^ slice[1][(reg >> 16) & 0xffu] ^
         slice[0][reg >> 24];
}

// The CRC register of a `size`-byte frame from the register of the same bytes
// with the 4-byte word at `at` read as zero (`zeroed`): the frame's own CRC
// field is skipped that way, while an object header's segment CRC covers the
// stored bytes. `word` is the stored word there. REQUIRES: at + 4 <= size.
OKV_HD uint32_t Crc32cWithWord(const Crc32cTables& t, uint32_t zeroed, uint32_t word, uint64_t at,
                               uint64_t size) {
  return zeroed ^ Crc32cShift(t, Crc32cWord(t.slice, 0, word), size - at - 4);
}

inline Crc32cTables MakeCrc32cTables() {
  Crc32cTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t r = i;
    for (int k = 0; k < 8; ++k) r = (r & 1) ? (r >> 1) ^ kCrc32cPoly : r >> 1;
    t.slice[0][i] = r;
  }
  for (int k = 1; k < 4; ++k) {
    for (uint32_t i = 0; i < 256; ++i) {
      const uint32_t prev = t.slice[k - 1][i];
      t.slice[k][i] = (prev >> 8) ^ t.slice[0][prev & 0xffu];
    }
  }
  t.x8pow2k[0] = 1u << 23;  // x^8
  for (int k = 1; k < 64; ++k) t.x8pow2k[k] = Crc32cMulModP(t.x8pow2k[k - 1], t.x8pow2k[k - 1]);
  return t;
}

}  // namespace orbitkv::codec
