// Hybrid: the engine side of a model description (orbitkv/model_description.h),
// shared by the programs that drive a hybrid instance (orbitkv-bench,
// orbitkv-demo, the integration test's orbitkv-hybrid-engine): the instance
// layout of its storage groups, the pieces of a key chain an engine publishes,
// the pieces a prefix of P tokens needs (what a recovery plan must list), the
// page a piece lives in, and the key a piece's deterministic content is made
// from. An engine publishes each piece under the plain chain key that names
// the prefix ending where the piece ends (the Manager masks it per group), and
// keeps piece (group g, chain key i) in page i of layout group g. Pure
// functions; every description argument must be validated
// (recovery::ValidateModelDescription).
#pragma once

#include <cstdint>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/layout.h"
#include "orbitkv/model_description.h"

namespace orbitkv::demo {

// Layout group i is description group i (group_id = its storage_group), with
// slot_bytes[i] as its slots (summing to the group's bytes), `pages` pages
// each; split: one region per slot, page-first: one region per group.
InstanceLayout HybridLayout(const ModelDescription& d,
                            const std::vector<std::vector<uint64_t>>& slot_bytes, uint64_t pages,
                            bool page_first = false);

struct ChainPiece {
  uint32_t group = 0;      // index into the description's groups (and the layout's)
  uint64_t index = 0;      // block index; recurrent: the checkpoint's position in tokens
  uint64_t key_index = 0;  // the chain key that names it, and its page in its group
  friend bool operator==(const ChainPiece&, const ChainPiece&) = default;
};

// Every piece whose prefix ends in (begin_tokens, end_tokens]: each
// attention group's blocks and each recurrent group's scheduled checkpoints,
// by group, then ascending index. What an engine that computed tokens
// [begin_tokens, end_tokens) of a chain publishes. REQUIRES: both on the key grid.
std::vector<ChainPiece> ChainPieces(const ModelDescription& d, uint64_t begin_tokens,
                                    uint64_t end_tokens);

// The pieces that rebuild a prefix of exactly p tokens, by group, then
// ascending index: every full-attention block of [0, p), the window blocks
// covering [p - W, p), the checkpoint at p (none for p = 0). The reference a
// recovery plan (QueryResult::pieces) is checked against.
std::vector<ChainPiece> RequiredPieces(const ModelDescription& d, uint64_t p);

// The chain key index that names piece (group, index) of d.
uint64_t PieceKeyIndex(const ModelDescription& d, uint32_t group, uint64_t index);

// The key a piece's bytes are derived from (FillBlockSlot): the chain key with
// the group mixed in, so a piece restored into another group's page, or
// another group's piece of the same boundary, fails the check.
BlockKey PieceContentKey(const BlockKey& chain_key, uint32_t group);

}  // namespace orbitkv::demo
