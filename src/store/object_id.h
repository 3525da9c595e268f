// ObjectId: what a stored object is cached under: the namespace (interned to a
// number by the Manager), the storage group and the engine's block key.
// Keys never match across namespaces or groups.
#pragma once

#include <cstdint>
#include <functional>

#include "store/key.h"

namespace orbitkv {

struct ObjectId {
  uint64_t ns = 0;
  uint32_t group = 0;
  Key key;
  friend bool operator==(const ObjectId&, const ObjectId&) = default;
};

struct ObjectIdHash {
  size_t operator()(const ObjectId& id) const noexcept {
    return KeyHash{}(id.key) ^ (id.ns * 0x9E3779B97F4A7C15ULL) ^ (uint64_t{id.group} << 48);
  }
};

// The SSD directory is keyed by Key; the store key folds ns and group in, so
// the SSD tier keeps the same isolation.
Key StoreKey(const ObjectId& id);

}  // namespace orbitkv
