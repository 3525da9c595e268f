// The work decomposition of the GPU CRC32C (gpu/crc32c_kernel.cu), as pure
// __host__ __device__ functions: the kernels are thin shells around them, and
// a CPU test (crc32c_grid_test) runs the same functions over an emulated grid.
//
// A range of n bytes is cut into ceil(n / kCrcPieceBytes) pieces aligned to
// the range's END, so only piece 0 may be short (at its front; think of it as
// padded with leading zero bytes, which leave a register started at 0 as it
// is). One block per piece, one thread per kCrcLeafBytes leaf of it. A leaf's
// register starts at 0, or at ~0 on the range's first byte (which folds in
// the CRC's initial value), and runs over the leaf's bytes (slice-by-4); it is
// then moved to the piece's end (a multiplication by x^(8 * bytes after it),
// store/crc32c_math.h), and the block XORs its leaves: the piece's register
// at its end. A second kernel moves each piece's register to the range's end
// the same way and XORs them per range: the register after the whole range,
// whose complement is the CRC (0 for an empty range). XOR is order-free, so
// the reductions need no ordering. C++17; pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "store/crc32c_math.h"

namespace orbitkv::gpu {

inline constexpr uint32_t kCrcLeafBytes = 128;  // per thread
inline constexpr uint32_t kCrcThreads = 128;    // leaves per piece
inline constexpr uint64_t kCrcPieceBytes = uint64_t{kCrcLeafBytes} * kCrcThreads;  // 16 KiB
// Ranges per launch: 20 KiB of kernel parameters (CUDA 12.1's 32 KiB limit),
// so a publish batch's CRCs are one or two launches, not one per 128 ranges.
inline constexpr size_t kCrcOpsPerLaunch = 1024;
inline constexpr int kCrcPiecePowers = 50;  // 2^50 pieces: beyond any u64 range

// Slice-by-4 tables: t[k][b] is the register after byte b then k zero bytes.
struct CrcSliceTables {
  uint32_t t[4][256];
};

// Entry b of every slice (entries are independent: a block fills them in
// parallel, one thread per b).
ORBITKV_CRC_HD inline void FillCrcSliceEntry(CrcSliceTables* tables, uint32_t b) {
  uint32_t c = crc32c::ByteStep(0, static_cast<uint8_t>(b));
  tables->t[0][b] = c;
  for (int k = 1; k < 4; ++k) {
    c = crc32c::ByteStep(c, 0);
    tables->t[k][b] = c;
  }
}

// x^(8 * bytes) for the fixed distances of the decomposition.
struct CrcShiftTables {
  uint32_t leaf[kCrcThreads];           // leaf[k]: k leaves
  uint32_t piece_pow[kCrcPiecePowers];  // piece_pow[b]: 2^b pieces
};

ORBITKV_CRC_HD inline constexpr CrcShiftTables MakeCrcShiftTables() {
  CrcShiftTables s{};
  const uint32_t one_leaf = crc32c::ShiftOperator(kCrcLeafBytes);
  s.leaf[0] = 1u << 31;  // x^0
  for (uint32_t k = 1; k < kCrcThreads; ++k) s.leaf[k] = crc32c::MultModP(s.leaf[k - 1], one_leaf);
  s.piece_pow[0] = crc32c::ShiftOperator(kCrcPieceBytes);
  for (int b = 1; b < kCrcPiecePowers; ++b) {
    s.piece_pow[b] = crc32c::MultModP(s.piece_pow[b - 1], s.piece_pow[b - 1]);
  }
  return s;
}

// One launch: up to kCrcOpsPerLaunch ranges, passed by value as the kernels'
// parameters. first_piece[i] is the grid index of range i's piece 0;
// first_piece[count] the number of pieces (the first kernel's grid).
struct CrcLaunch {
  uint64_t data[kCrcOpsPerLaunch];   // device addresses
  uint64_t bytes[kCrcOpsPerLaunch];  // range sizes
  uint32_t first_piece[kCrcOpsPerLaunch + 1];
  uint32_t count;
};

ORBITKV_CRC_HD inline uint64_t CrcPieces(uint64_t n) {
  return (n + kCrcPieceBytes - 1) / kCrcPieceBytes;
}

// Fills `launch` with ops[0, count) (count <= kCrcOpsPerLaunch); false when
// the pieces do not fit a grid (more than 2^31 - 1: over 32 TiB).
inline bool PlanCrcLaunch(const uint64_t* data, const uint64_t* bytes, size_t count,
                          CrcLaunch* launch) {
  uint64_t pieces = 0;
  launch->count = static_cast<uint32_t>(count);
  for (size_t i = 0; i < count; ++i) {
    launch->data[i] = data[i];
    launch->bytes[i] = bytes[i];
    launch->first_piece[i] = static_cast<uint32_t>(pieces);
    pieces += CrcPieces(bytes[i]);
    if (pieces > 0x7fffffffu) return false;
  }
  launch->first_piece[count] = static_cast<uint32_t>(pieces);
  return true;
}

// The range that grid piece g belongs to: the last range whose first piece
// is <= g (empty ranges share their successor's first piece, so the last one
// is never empty). REQUIRES: g < first_piece[count].
ORBITKV_CRC_HD inline uint32_t CrcRangeOfPiece(const CrcLaunch& l, uint32_t g) {
  uint32_t lo = 0, hi = l.count;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (l.first_piece[mid] <= g) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Unaligned-safe loads: the device reads aligned words (the callers align).
ORBITKV_CRC_HD inline uint32_t CrcLoadWord(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(reinterpret_cast<const uint32_t*>(p));
#else
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
#endif
}

ORBITKV_CRC_HD inline void CrcLoadQuad(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
#else
  std::memcpy(w, p, 16);
#endif
}

ORBITKV_CRC_HD inline uint32_t CrcByte(const CrcSliceTables& s, uint32_t reg, uint8_t b) {
  return s.t[0][(reg ^ b) & 0xffu] ^ (reg >> 8);
}

// Four bytes, w read little-endian.
ORBITKV_CRC_HD inline uint32_t CrcWord(const CrcSliceTables& s, uint32_t reg, uint32_t w) {
  reg ^= w;
  return s.t[3][reg & 0xffu] ^ s.t[2][(reg >> 8) & 0xffu] ^ s.t[1][(reg >> 16) & 0xffu] ^
         s.t[0][reg >> 24];
}

// The raw register after p[0, len) from `reg`: bytes up to a 4-byte boundary,
// words up to a 16-byte one, 16-byte loads, then the tail.
ORBITKV_CRC_HD inline uint32_t CrcRun(const CrcSliceTables& s, uint32_t reg, const uint8_t* p,
                                      uint64_t len) {
  for (; len > 0 && (reinterpret_cast<uintptr_t>(p) & 3) != 0; --len) reg = CrcByte(s, reg, *p++);
  for (; len >= 4 && (reinterpret_cast<uintptr_t>(p) & 15) != 0; len -= 4, p += 4) {
    reg = CrcWord(s, reg, CrcLoadWord(p));
  }
  for (; len >= 16; len -= 16, p += 16) {
    uint32_t w[4];
    CrcLoadQuad(p, w);
    for (int k = 0; k < 4; ++k) reg = CrcWord(s, reg, w[k]);
  }
  for (; len >= 4; len -= 4, p += 4) reg = CrcWord(s, reg, CrcLoadWord(p));
  for (; len > 0; --len) reg = CrcByte(s, reg, *p++);
  return reg;
}

// What thread `leaf` of grid block g contributes to its piece's register at
// the piece's end (the first kernel XORs these over the block).
ORBITKV_CRC_HD inline uint32_t CrcLeafContribution(const CrcSliceTables& s,
                                                   const CrcShiftTables& shifts, const CrcLaunch& l,
                                                   uint32_t g, uint32_t leaf) {
  const uint32_t r = CrcRangeOfPiece(l, g);
  const uint64_t n = l.bytes[r];
  const uint64_t pad = CrcPieces(n) * kCrcPieceBytes - n;  // the leading zeros of piece 0
  const uint64_t piece = g - l.first_piece[r];
  const uint64_t vend = piece * kCrcPieceBytes + uint64_t{leaf + 1} * kCrcLeafBytes;
  if (vend <= pad) return 0;  // all padding
  const uint64_t vbegin = vend - kCrcLeafBytes;
  const uint64_t begin = vbegin < pad ? 0 : vbegin - pad;
  const uint64_t end = vend - pad;
  const auto* data = reinterpret_cast<const uint8_t*>(l.data[r]);
  const uint32_t reg = CrcRun(s, begin == 0 ? 0xFFFFFFFFu : 0u, data + begin, end - begin);
  return crc32c::MultModP(shifts.leaf[kCrcThreads - 1 - leaf], reg);
}

// What thread `leaf` contributes to the register at the end of a range of
// 1..kCrcPieceBytes bytes at `data`: such a range is one piece, so the XOR of
// every leaf's contribution is the range's register and its complement the
// CRC (the object gather kernel, gpu/gather_kernel.cu, one block per slot).
ORBITKV_CRC_HD inline uint32_t CrcLeafOfShortRange(const CrcSliceTables& s,
                                                   const CrcShiftTables& shifts,
                                                   const uint8_t* data, uint64_t n, uint32_t leaf) {
  const uint64_t pad = kCrcPieceBytes - n;  // n <= kCrcPieceBytes
  const uint64_t vend = uint64_t{leaf + 1} * kCrcLeafBytes;
  if (vend <= pad) return 0;  // all padding
  const uint64_t vbegin = vend - kCrcLeafBytes;
  const uint64_t begin = vbegin < pad ? 0 : vbegin - pad;
  const uint32_t reg = CrcRun(s, begin == 0 ? 0xFFFFFFFFu : 0u, data + begin, vend - pad - begin);
  return crc32c::MultModP(shifts.leaf[kCrcThreads - 1 - leaf], reg);
}

// Piece q of range r (register `piece_reg` at the piece's end) moved to the
// range's end (the second kernel XORs these over the range's pieces).
ORBITKV_CRC_HD inline uint32_t CrcPieceContribution(const CrcShiftTables& shifts,
                                                    const CrcLaunch& l, uint32_t r, uint64_t q,
                                                    uint32_t piece_reg) {
  uint64_t after = CrcPieces(l.bytes[r]) - 1 - q;  // pieces after q
  for (int b = 0; after != 0; ++b, after >>= 1) {
    if (after & 1) piece_reg = crc32c::MultModP(shifts.piece_pow[b], piece_reg);
  }
  return piece_reg;
}

// The CRC32C of range r from the XOR of its pieces' contributions.
ORBITKV_CRC_HD inline uint32_t CrcFinish(const CrcLaunch& l, uint32_t r, uint32_t reg) {
  return l.bytes[r] == 0 ? 0u : ~reg;
}

}  // namespace orbitkv::gpu
