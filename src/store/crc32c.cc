#include "store/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace orbitkv {

uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc) {
  // crc32_iscsi works on the raw register (no final inversion) and takes an
  // int length.
  uint32_t reg = ~crc;
  const uint8_t* p = data.data();
  size_t left = data.size();
  constexpr size_t kMaxChunk = size_t{1} << 30;
  while (left > 0) {
    const size_t n = std::min(left, kMaxChunk);
    reg = crc32_iscsi(const_cast<uint8_t*>(p), static_cast<int>(n), reg);
    p += n;
    left -= n;
  }
  return ~reg;
}

}  // namespace orbitkv
