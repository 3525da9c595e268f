#include "recovery/object_keys.h"

#include <string_view>

#include "recovery/sha256.h"

namespace orbitkv::recovery {

BlockKey GroupMask(const GroupDescription& g) {
  static constexpr std::string_view kDomain("orbitkv/recovery/group-mask/v1\0", 31);
  std::vector<uint8_t> in(kDomain.begin(), kDomain.end());
  in.push_back(static_cast<uint8_t>(g.kind));
  const auto n = static_cast<uint32_t>(g.name.size());
  for (int i = 0; i < 4; ++i) in.push_back(static_cast<uint8_t>(n >> (8 * i)));
  in.insert(in.end(), g.name.begin(), g.name.end());
  return Sha256(in);
}

std::vector<BlockKey> GroupMasks(const ModelDescription& d) {
  std::vector<BlockKey> out;
  out.reserve(d.groups.size());
  for (const GroupDescription& g : d.groups) out.push_back(GroupMask(g));
  return out;
}

}  // namespace orbitkv::recovery
