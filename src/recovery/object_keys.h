// Object keys of a hybrid model's pieces. The engine sends one key chain (key
// i names the token prefix [0, (i + 1) * key_block_tokens)); every group's
// block and every recurrent checkpoint is stored as an object of its own,
// under a key derived from the chain key that names the prefix ending where
// the piece ends:
//
//   object key = chain[KeyIndex(piece)] XOR GroupMask(group)
//   GroupMask  = SHA-256("orbitkv/recovery/group-mask/v1\0" || u8 kind ||
//                        u32le len(name) || name)
//
// Pieces of one group have distinct chain indices (one kind per group), and
// groups have distinct names, hence distinct masks: block i of "attn" and the
// checkpoint at the same boundary of "gdn" share a chain key but not an
// object key. XOR is a bijection for one mask, so two pieces collide only if
// two engine keys differ by exactly the XOR of two masks, which hashed keys
// do not (the same argument as StoreKey; the object header still names the
// whole ObjectId). The mask is computed once per group at register; a query
// then pays 32 XORed bytes per piece, not a hash, on a path that walks up to
// thousands of pieces. python/orbitkv/hybrid.py derives the same keys.
// A dense instance (no description) keeps using the chain keys as they are.
// Target orbitkv_recovery_identity (Nettle's SHA-256).
#pragma once

#include <cstdint>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/model_description.h"

namespace orbitkv::recovery {

BlockKey GroupMask(const GroupDescription& g);

inline BlockKey ObjectKey(const BlockKey& chain_key, const BlockKey& mask) {
  BlockKey out;
  for (size_t i = 0; i < out.size(); ++i) out[i] = chain_key[i] ^ mask[i];
  return out;
}

// The chain index whose key names block `block` of full-attention or
// sliding-window group `g`: the key of the prefix through the block's last
// token. REQUIRES: d and g validated, g one of d's groups.
inline uint64_t BlockKeyIndex(const ModelDescription& d, const GroupDescription& g,
                              uint64_t block) {
  return (block + 1) * (g.block_tokens / d.key_block_tokens) - 1;
}

// The chain index whose key names the recurrent checkpoint at token
// `position` (the state after tokens [0, position)). REQUIRES: position a
// positive multiple of d.key_block_tokens.
inline uint64_t CheckpointKeyIndex(const ModelDescription& d, uint64_t position) {
  return position / d.key_block_tokens - 1;
}

// GroupMask of every group of d, in group order: what an instance keeps.
std::vector<BlockKey> GroupMasks(const ModelDescription& d);

}  // namespace orbitkv::recovery
