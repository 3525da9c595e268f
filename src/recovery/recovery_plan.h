// Compiled recovery requirements: for a validated model description, a key
// chain of `chain_length` keys and a presence oracle, the longest prefix P
// (tokens) whose state can be rebuilt and exactly the pieces that rebuild it:
//   - every block of every full-attention group in [0, P);
//   - per sliding-window group of W tokens, the blocks covering
//     [max(0, P - W), P), and none older;
//   - per recurrent group, the checkpoint at exactly P (P a scheduled position).
// P is on every attention group's block grid (a partial block is not stored),
// so P may be shorter than the full-attention hit, to land on a checkpoint or
// where a window is whole. P = 0 needs nothing. An optional byte budget caps
// the plan's bytes; then P is the longest prefix within it.
//
// Cost: each piece is asked of the oracle at most once, and only pieces at or
// below the full-attention hit: at most sum over groups of min(chain, hit)
// pieces, O(G * n) oracle calls and time, O(G * n) bytes of memory, plus
// O(log m) per step of a recurrent group with m explicit positions. A window
// is asked only for its own blocks (W / block_tokens of them, plus those a
// hole makes it skip), a recurrent group only for checkpoints from the hit
// down to the one it uses. recovery_plan_bench: 8192 keys of attention, a
// 4096-token window and checkpoints, all present: 8449 oracle calls, about
// 70 us on the 2-core development VM (the Manager's oracle adds its lookups).
// CompileRecoveryPlan is a pure function of its arguments and the oracle's
// answers; the oracle is called on the caller's thread only.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/model_description.h"
#include "orbitkv/status.h"

namespace orbitkv::recovery {

// Where the pieces are: the tier a piece would be read from (kDram preferred
// by the caller's oracle when it is in both), or Tier::kNone when absent. The
// Manager's oracle looks up ObjectKey(chain[key index], GroupMask(group))
// (object_keys.h) in its DRAM pool and SSD directory.
class PresenceOracle {
 public:
  virtual ~PresenceOracle() = default;
  // Block `block` (tokens [block * bt, (block + 1) * bt), bt = block_tokens)
  // of full-attention or sliding-window group `group` (index into groups).
  virtual Tier Block(uint32_t group, uint64_t block) = 0;
  // The checkpoint of recurrent group `group` after exactly `position` tokens.
  virtual Tier Checkpoint(uint32_t group, uint64_t position) = 0;
};

inline constexpr uint64_t kNoByteBudget = std::numeric_limits<uint64_t>::max();
// Longest chain a plan takes (the wire carries at most 65536 keys a message).
// Bounds the planner's memory and keeps every byte sum below 2^63.
inline constexpr uint64_t kMaxChainKeys = 1ull << 20;

struct PlanSource {
  uint32_t group = 0;      // index into ModelDescription::groups
  uint64_t index = 0;      // block index; for a recurrent group, the position in tokens
  uint64_t key_index = 0;  // the chain key that names it (BlockKeyIndex / CheckpointKeyIndex)
  Tier tier = Tier::kNone;
  uint64_t bytes = 0;
  friend bool operator==(const PlanSource&, const PlanSource&) = default;
};

// Pieces of [0, P) of one sliding-window or recurrent group that recovery
// does not read: blocks [0, blocks_end) before the window, or the scheduled
// checkpoints below P. Whether they are stored is not asked.
struct NotNeeded {
  uint32_t group = 0;
  uint64_t blocks_end = 0;  // sliding window: blocks [0, blocks_end); recurrent: 0
  uint64_t pieces = 0;      // blocks, or checkpoints
  uint64_t bytes = 0;
  friend bool operator==(const NotNeeded&, const NotNeeded&) = default;
};

struct RecoveryPlan {
  uint64_t prefix_tokens = 0;  // P
  uint64_t prefix_keys = 0;    // P / key_block_tokens: chain keys covered
  // The longest prefix on every full-attention group's grid whose blocks are
  // all present (the chain's tokens when there is no such group). P <= it.
  uint64_t attention_hit_tokens = 0;
  // A longer prefix was recoverable, but its bytes exceed the budget.
  bool budget_limited = false;
  std::vector<PlanSource> sources;    // by group, then ascending index
  uint64_t source_bytes = 0;          // what the query budget is charged
  std::vector<NotNeeded> not_needed;  // one per sliding-window and recurrent group, in order
  uint64_t not_needed_bytes = 0;
  uint64_t oracle_calls = 0;
};

// REQUIRES: ValidateModelDescription(d).ok(). InvalidArgument when the chain
// is longer than kMaxChainKeys or its tokens exceed kMaxSequenceTokens.
Result<RecoveryPlan> CompileRecoveryPlan(const ModelDescription& d, uint64_t chain_length,
                                         PresenceOracle& oracle,
                                         uint64_t max_bytes = kNoByteBudget);

}  // namespace orbitkv::recovery
