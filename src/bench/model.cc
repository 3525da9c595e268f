#include "bench/model.h"

namespace orbitkv::bench {

std::vector<std::vector<uint64_t>> ModelPreset::GroupSlotBytes(uint32_t block_tokens) const {
  std::vector<std::vector<uint64_t>> out;
  const uint64_t kv = uint64_t{block_tokens} * kv_heads * head_dim * dtype_bytes;
  auto kv_group = [&](uint32_t layers) {
    std::vector<uint64_t> g;
    for (uint32_t l = 0; l < layers; ++l) g.insert(g.end(), {kv, kv});
    return g;
  };
  if (attention_layers) out.push_back(kv_group(attention_layers));
  if (window_layers) out.push_back(kv_group(window_layers));
  if (gdn_layers) {
    std::vector<uint64_t> g;
    for (uint32_t l = 0; l < gdn_layers; ++l)
      g.insert(g.end(), {conv_state_bytes, recurrent_state_bytes});
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<uint64_t> ModelPreset::SlotBytes(uint32_t block_tokens) const {
  std::vector<uint64_t> out;
  for (const std::vector<uint64_t>& g : GroupSlotBytes(block_tokens))
    out.insert(out.end(), g.begin(), g.end());
  return out;
}

ModelDescription ModelPreset::Description(uint32_t block_tokens) const {
  ModelDescription d;
  d.key_block_tokens = block_tokens;
  const std::vector<std::vector<uint64_t>> slots = GroupSlotBytes(block_tokens);
  auto add = [&](const char* name, GroupKind kind) {
    GroupDescription g;
    g.name = name;
    g.kind = kind;
    g.storage_group = static_cast<uint32_t>(d.groups.size());
    g.block_tokens = block_tokens;
    for (uint64_t b : slots[d.groups.size()]) g.bytes += b;
    if (kind == GroupKind::kSlidingWindow) g.window_tokens = window_tokens;
    if (kind == GroupKind::kRecurrent) g.checkpoint_interval_tokens = block_tokens;
    d.groups.push_back(std::move(g));
  };
  if (attention_layers) add("attn", GroupKind::kFullAttention);
  if (window_layers) add("swa", GroupKind::kSlidingWindow);
  if (gdn_layers) add("gdn", GroupKind::kRecurrent);
  return d;
}

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> presets = [] {
    std::vector<ModelPreset> p;
    ModelPreset m;
    m = {};
    m.name = "llama-3.1-8b";
    m.description = "32 layers x K/V x 8 KV heads x 128 dim, bf16 (GQA), one rank";
    m.attention_layers = 32, m.kv_heads = 8, m.head_dim = 128;
    p.push_back(m);
    m = {};
    m.name = "qwen3-8b";
    m.description = "36 layers x K/V x 8 KV heads x 128 dim, bf16 (GQA), one rank";
    m.attention_layers = 36, m.kv_heads = 8, m.head_dim = 128;
    p.push_back(m);
    m = {};
    m.name = "llama-3.1-70b-tp8";
    m.description =
        "80 layers x K/V x 1 KV head x 128 dim, bf16: one rank of TP=8 (8 KV heads / 8)";
    m.attention_layers = 80, m.kv_heads = 1, m.head_dim = 128;
    p.push_back(m);
    m = {};
    m.name = "qwen3-next-hybrid";
    // Qwen3-Next-80B-A3B-like: 48 layers, 3 of 4 Gated DeltaNet. GDN: 16 key
    // heads and 32 value heads of 128 dims, conv kernel 4 (3 past columns of
    // 2x16x128 + 32x128 = 8192 channels), recurrent state 32 x 128 x 128.
    m.description =
        "12 full-attention layers x K/V x 2 KV heads x 256 dim + 36 Gated DeltaNet layers "
        "(conv 8192 ch x 3, recurrent 32 x 128 x 128), bf16; a state checkpoint with every "
        "block; no sliding window";
    m.default_block_tokens = 256;
    m.attention_layers = 12, m.kv_heads = 2, m.head_dim = 256;
    m.gdn_layers = 36;
    m.conv_state_bytes = 8192ull * 3 * 2;
    m.recurrent_state_bytes = 32ull * 128 * 128 * 2;
    p.push_back(m);
    m = {};
    m.name = "tiny";
    m.description = "2 layers x K/V x 8 KV heads x 64 dim, bf16 (the demo's shape; for tests)";
    m.attention_layers = 2, m.kv_heads = 8, m.head_dim = 64;
    p.push_back(m);
    m = {};
    m.name = "tiny-hybrid";
    // Every group kind in a few KiB: the hybrid path in tests.
    m.description =
        "2 full-attention + 2 sliding-window (64 tokens) layers x K/V x 8 KV heads x 64 dim + 2 "
        "Gated DeltaNet layers (conv 512 ch x 3, recurrent 4 x 64 x 64), bf16 (for tests)";
    m.attention_layers = 2, m.window_layers = 2, m.window_tokens = 64;
    m.kv_heads = 8, m.head_dim = 64;
    m.gdn_layers = 2;
    m.conv_state_bytes = 512ull * 3 * 2;
    m.recurrent_state_bytes = 4ull * 64 * 64 * 2;
    p.push_back(m);
    return p;
  }();
  return presets;
}

const ModelPreset* FindModel(std::string_view name) {
  for (const ModelPreset& m : ModelPresets())
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace orbitkv::bench
