// Shared by the cross-process integration test (manager_process_test.cc) and
// its engine program (engine_client.cc): block keys, the byte pattern a key's
// pages carry, and instance layouts (split or page-first, all slots or a
// subset for one writer of a multi-writer group). Test-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/layout.h"
#include "testing/host_pages.h"

namespace orbitkv::integration {

// Key `v` of a chain. Byte 31 marks the integration suite.
inline BlockKey KeyOf(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[30] = 0x17;
  k[31] = 0xa5;
  return k;
}

// The Fill/Holds seed of key `k` under base seed `seed`.
inline uint64_t SeedOf(uint64_t seed, uint64_t k) { return seed * 1000003u + k; }

struct LayoutSpec {
  bool page_first = false;
  std::vector<uint64_t> slot_bytes{1000, 333, 4096, 70};
  uint64_t pages = 64;
  std::vector<uint32_t> hold;  // slot ids this instance holds; empty: all of them
};

// The instance layout of `spec`: group 0 with every slot of slot_bytes in the
// namespace's shape, of which this instance holds `hold`.
inline InstanceLayout BuildLayout(const LayoutSpec& spec) {
  InstanceLayout full = spec.page_first ? testing::PageFirstLayout(spec.pages, spec.slot_bytes)
                                        : testing::SplitLayout(spec.pages, spec.slot_bytes);
  if (spec.hold.empty()) return full;
  InstanceLayout l = full;
  GroupLayout& g = l.groups[0];
  g.slots.clear();
  if (!spec.page_first) l.region_bytes.clear();
  for (uint32_t id : spec.hold) {
    if (id >= spec.slot_bytes.size()) throw std::invalid_argument("held slot out of range");
    SlotLayout s = full.groups[0].slots[id];
    if (!spec.page_first) {
      s.region = static_cast<uint32_t>(l.region_bytes.size());
      l.region_bytes.push_back(full.region_bytes[id]);
    }
    g.slots.push_back(s);
  }
  return l;
}

inline std::vector<uint64_t> ParseU64List(const std::string& s) {
  std::vector<uint64_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    out.push_back(std::stoull(s.substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

}  // namespace orbitkv::integration
