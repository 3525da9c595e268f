// Model: the model shapes orbitkv-bench stores, as presets. A preset says what
// one stored block holds on one rank: per attention layer a K and a V slot of
// block_tokens tokens, and for hybrid models the Gated DeltaNet conv and
// recurrent states checkpointed with every block (one slot per layer each).
// Every block is one object, so its bytes are KV bytes per token x block tokens
// plus the checkpoint. Pure data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace orbitkv::bench {

struct ModelPreset {
  std::string name;
  std::string description;  // one line: layers, heads, dims, dtype, parallelism
  uint32_t default_block_tokens = 16;
  // Attention (full) layers held by this rank.
  uint32_t attention_layers = 0;
  uint32_t kv_heads = 0;  // per rank
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 2;
  // Linear-attention (Gated DeltaNet) layers, checkpointed with every block.
  uint32_t gdn_layers = 0;
  uint64_t conv_state_bytes = 0;       // per layer
  uint64_t recurrent_state_bytes = 0;  // per layer

  // K + V bytes of one token over all attention layers of the rank.
  uint64_t KvBytesPerToken() const {
    return uint64_t{attention_layers} * 2 * kv_heads * head_dim * dtype_bytes;
  }
  // Recurrent-state bytes stored with each block (0 for pure attention models).
  uint64_t CheckpointBytes() const {
    return uint64_t{gdn_layers} * (conv_state_bytes + recurrent_state_bytes);
  }
  // Slot sizes of one block, in slot order: K0, V0, K1, V1, ..., then per GDN
  // layer its conv state and its recurrent state.
  std::vector<uint64_t> SlotBytes(uint32_t block_tokens) const;
  uint64_t BlockBytes(uint32_t block_tokens) const {
    return KvBytesPerToken() * block_tokens + CheckpointBytes();
  }
};

// Every preset, in --list-models order.
const std::vector<ModelPreset>& ModelPresets();
// The preset named `name`, or null.
const ModelPreset* FindModel(std::string_view name);

}  // namespace orbitkv::bench
