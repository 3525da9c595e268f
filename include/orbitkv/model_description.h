// Model description: what an engine's stored state is made of, so that the
// Manager can compile the recovery requirements of a hybrid model (full
// attention, sliding-window attention, recurrent conv/SSM state). An instance
// registers at most one; none means a dense model (one key chain, every block
// needed), as before the field existed. Plain values: validation, the
// fingerprint and the planner are in src/recovery (model_description.h,
// recovery_plan.h). The limits below are what ValidateModelDescription enforces.
//
// Tokens: the engine hashes its sequence into a key chain of
// key_block_tokens-token blocks; key i names the prefix [0, (i + 1) *
// key_block_tokens). A group's blocks are key_block_tokens or a multiple.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orbitkv/layout.h"

namespace orbitkv {

// On the wire and in the fingerprint: append only, never renumber.
enum class GroupKind : uint8_t {
  kFullAttention = 1,  // every block of the prefix [0, P)
  kSlidingWindow = 2,  // the blocks covering [P - window_tokens, P)
  kRecurrent = 3,      // one checkpoint of the state after exactly P tokens
};

inline constexpr uint32_t kMaxModelGroups = kMaxGroups;
inline constexpr uint32_t kMaxGroupNameBytes = 128;            // printable ASCII, no space
inline constexpr uint64_t kMaxBlockTokens = 1ull << 20;        // block_tokens, key_block_tokens
inline constexpr uint64_t kMaxSequenceTokens = 1ull << 32;     // windows, checkpoint positions
inline constexpr uint64_t kMaxPieceBytes = 1ull << 36;         // 64 GiB per block or checkpoint
inline constexpr uint32_t kMaxCheckpointPositions = 1u << 16;  // per recurrent group

struct GroupDescription {
  std::string name;  // unique in the description ("attn", "swa", "gdn")
  GroupKind kind = GroupKind::kFullAttention;
  // The layout group (GroupLayout::group_id) whose objects hold this group's
  // pieces: one object per block or checkpoint. Unique in the description.
  uint32_t storage_group = 0;
  // Tokens per block; for a recurrent group, the grid its checkpoints lie on.
  // A multiple of ModelDescription::key_block_tokens.
  uint64_t block_tokens = 0;
  uint64_t bytes = 0;  // logical bytes of one block (attention) or one checkpoint (recurrent)
  uint64_t window_tokens = 0;  // kSlidingWindow only: W > 0
  // kRecurrent only, exactly one of: a checkpoint every N tokens (N, 2N, ...),
  // or at these token positions (ascending, > 0). Both multiples of block_tokens.
  uint64_t checkpoint_interval_tokens = 0;
  std::vector<uint64_t> checkpoint_positions;
  friend bool operator==(const GroupDescription&, const GroupDescription&) = default;
};

struct ModelDescription {
  uint64_t key_block_tokens = 0;  // tokens per key of the chain
  std::vector<GroupDescription> groups;
  friend bool operator==(const ModelDescription&, const ModelDescription&) = default;
};

}  // namespace orbitkv
