// StoreKey: key XOR a 256-bit mask derived from (ns, group). Lane 0 of the mask
// is a bijection of ns and lane 1 a bijection of group, so distinct (ns, group)
// always give distinct masks, and for one (ns, group) StoreKey is a bijection of
// the key. Two objects can still map to one store key when their engine keys
// differ by exactly the masks' XOR; engine keys are hashes, so this does not
// happen by chance, and a reader confirms the full ObjectId from the object
// header (CheckObjectMatches) anyway. Lanes are little-endian so the mapping
// is the same on every host: store keys are persisted.
#include "store/object_id.h"

#include <cstddef>
#include <cstdint>

namespace orbitkv {
namespace {

// splitmix64's finalizer: a bijection of uint64.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

constexpr uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

}  // namespace

Key StoreKey(const ObjectId& id) {
  const uint64_t a = SplitMix64(id.ns);
  const uint64_t b = SplitMix64(uint64_t{id.group} ^ 0xD1B54A32D192ED03ULL);
  const uint64_t mask[4] = {a, b, SplitMix64(a ^ Rotl(b, 32) ^ 0x8CB92BA72F3D8DD7ULL),
                            SplitMix64(a + b + 0xABC98388FB8FAC03ULL)};
  Key out;
  for (size_t lane = 0; lane < 4; ++lane) {
    for (size_t i = 0; i < 8; ++i) {
      out.bytes[lane * 8 + i] =
          id.key.bytes[lane * 8 + i] ^ static_cast<uint8_t>(mask[lane] >> (8 * i));
    }
  }
  return out;
}

}  // namespace orbitkv
