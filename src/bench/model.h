// Model: the model shapes orbitkv-bench stores, as presets. A preset says what
// one block of block_tokens tokens holds on one rank: per attention layer a K
// and a V slot. A dense model's block is one object. A hybrid model (sliding-
// window layers, or Gated DeltaNet layers whose conv and recurrent states are
// checkpointed with every block) registers its model description
// (Description): one storage group per kind, "attn" (full attention), "swa"
// (a window of window_tokens) and "gdn" (a checkpoint at every block
// boundary), each piece an object of its own; a restore reads only what the
// recovery plan needs. Pure data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "orbitkv/model_description.h"

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
  // Sliding-window attention layers (same heads and dims), each keeping the
  // last window_tokens tokens.
  uint32_t window_layers = 0;
  uint64_t window_tokens = 0;
  // Linear-attention (Gated DeltaNet) layers, checkpointed with every block.
  uint32_t gdn_layers = 0;
  uint64_t conv_state_bytes = 0;       // per layer
  uint64_t recurrent_state_bytes = 0;  // per layer

  // A hybrid model: one registered with a model description.
  bool hybrid() const { return window_layers > 0 || gdn_layers > 0; }
  // K + V bytes of one token over all attention layers (full and window) of the rank.
  uint64_t KvBytesPerToken() const {
    return uint64_t{attention_layers + window_layers} * 2 * kv_heads * head_dim * dtype_bytes;
  }
  // Recurrent-state bytes stored with each block (0 for pure attention models).
  uint64_t CheckpointBytes() const {
    return uint64_t{gdn_layers} * (conv_state_bytes + recurrent_state_bytes);
  }
  // Slot sizes of one block, in slot order: K0, V0, K1, V1, ... of the full
  // attention layers, then of the window layers, then per GDN layer its conv
  // state and its recurrent state (the groups' slots of GroupSlotBytes, back
  // to back).
  std::vector<uint64_t> SlotBytes(uint32_t block_tokens) const;
  // Every piece of one block position: KV of every layer plus one checkpoint.
  uint64_t BlockBytes(uint32_t block_tokens) const {
    return KvBytesPerToken() * block_tokens + CheckpointBytes();
  }
  // REQUIRES: hybrid(). The description for block_tokens-token keys and
  // blocks: groups "attn" (if attention_layers), "swa" (if window_layers) and
  // "gdn" (if gdn_layers, a checkpoint every block), in that order, storage
  // groups 0, 1, ...; validated.
  ModelDescription Description(uint32_t block_tokens) const;
  // Slot sizes of each group of Description(block_tokens), in its order.
  std::vector<std::vector<uint64_t>> GroupSlotBytes(uint32_t block_tokens) const;
};

// Every preset, in --list-models order.
const std::vector<ModelPreset>& ModelPresets();
// The preset named `name`, or null.
const ModelPreset* FindModel(std::string_view name);

}  // namespace orbitkv::bench
