#include "recovery/model_description.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

namespace orbitkv::recovery {
namespace {

Status Invalid(std::string_view field, std::string_view what) {
  return Status::InvalidArgument(fmt::format("{}: {}", field, what));
}

bool KnownKind(GroupKind k) {
  return k == GroupKind::kFullAttention || k == GroupKind::kSlidingWindow ||
         k == GroupKind::kRecurrent;
}

// Printable for an error message: at most 64 bytes, other bytes as \xNN.
std::string Printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

Status ValidateName(std::string_view name, const std::string& field) {
  if (name.empty()) return Invalid(field, "empty (every group needs a name)");
  if (name.size() > kMaxGroupNameBytes) {
    return Invalid(
        field, fmt::format("{} bytes, longer than the limit {}", name.size(), kMaxGroupNameBytes));
  }
  for (char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f) {
      return Invalid(field,
                     fmt::format("\"{}\": only printable ASCII without spaces", Printable(name)));
    }
  }
  return Status::OK();
}

Status ValidateRecurrent(const GroupDescription& g, const std::string& f) {
  const bool interval = g.checkpoint_interval_tokens != 0;
  const bool positions = !g.checkpoint_positions.empty();
  if (interval == positions) {
    return Invalid(f + ".checkpoint_interval_tokens",
                   interval ? "set together with checkpoint_positions (give exactly one)"
                            : "neither it nor checkpoint_positions is set (a recurrent group "
                              "needs its checkpoint schedule)");
  }
  if (interval) {
    if (g.checkpoint_interval_tokens > kMaxSequenceTokens) {
      return Invalid(f + ".checkpoint_interval_tokens",
                     fmt::format("{} is larger than the limit {}", g.checkpoint_interval_tokens,
                                 kMaxSequenceTokens));
    }
    if (g.checkpoint_interval_tokens % g.block_tokens != 0) {
      return Invalid(f + ".checkpoint_interval_tokens",
                     fmt::format("{} is off the block grid (not a multiple of block_tokens {})",
                                 g.checkpoint_interval_tokens, g.block_tokens));
    }
    return Status::OK();
  }
  if (g.checkpoint_positions.size() > kMaxCheckpointPositions) {
    return Invalid(f + ".checkpoint_positions",
                   fmt::format("{} positions, more than the limit {}",
                               g.checkpoint_positions.size(), kMaxCheckpointPositions));
  }
  uint64_t prev = 0;
  for (size_t i = 0; i < g.checkpoint_positions.size(); ++i) {
    const uint64_t p = g.checkpoint_positions[i];
    const std::string fi = fmt::format("{}.checkpoint_positions[{}]", f, i);
    if (p == 0 || p > kMaxSequenceTokens) {
      return Invalid(fi, fmt::format("{} is outside (0, {}]", p, kMaxSequenceTokens));
    }
    if (p % g.block_tokens != 0) {
      return Invalid(fi, fmt::format("{} is off the block grid (not a multiple of block_tokens {})",
                                     p, g.block_tokens));
    }
    if (p <= prev) {
      return Invalid(fi, fmt::format("{} does not ascend (the one before is {})", p, prev));
    }
    prev = p;
  }
  return Status::OK();
}

Status ValidateGroup(const ModelDescription& d, const GroupDescription& g, const std::string& f) {
  ORBITKV_RETURN_IF_ERROR(ValidateName(g.name, f + ".name"));
  if (!KnownKind(g.kind)) {
    return Invalid(f + ".kind", fmt::format("unknown kind {}", static_cast<unsigned>(g.kind)));
  }
  if (g.storage_group >= kMaxGroups) {
    return Invalid(f + ".storage_group",
                   fmt::format("{} is not below the limit {}", g.storage_group, kMaxGroups));
  }
  if (g.block_tokens == 0 || g.block_tokens > kMaxBlockTokens) {
    return Invalid(f + ".block_tokens",
                   fmt::format("{} is outside [1, {}]", g.block_tokens, kMaxBlockTokens));
  }
  if (g.block_tokens % d.key_block_tokens != 0) {
    return Invalid(f + ".block_tokens", fmt::format("{} is not a multiple of key_block_tokens {}",
                                                    g.block_tokens, d.key_block_tokens));
  }
  if (g.bytes == 0 || g.bytes > kMaxPieceBytes) {
    return Invalid(f + ".bytes", fmt::format("{} is outside [1, {}]", g.bytes, kMaxPieceBytes));
  }
  if (g.kind == GroupKind::kSlidingWindow) {
    if (g.window_tokens == 0) return Invalid(f + ".window_tokens", "0 (a window needs tokens)");
    if (g.window_tokens > kMaxSequenceTokens) {
      return Invalid(f + ".window_tokens", fmt::format("{} is larger than the limit {}",
                                                       g.window_tokens, kMaxSequenceTokens));
    }
  } else if (g.window_tokens != 0) {
    return Invalid(f + ".window_tokens",
                   fmt::format("set on a {} group (only sliding-window groups have one)",
                               GroupKindName(g.kind)));
  }
  if (g.kind == GroupKind::kRecurrent) return ValidateRecurrent(g, f);
  if (g.checkpoint_interval_tokens != 0) {
    return Invalid(f + ".checkpoint_interval_tokens",
                   fmt::format("set on a {} group (only recurrent groups have checkpoints)",
                               GroupKindName(g.kind)));
  }
  if (!g.checkpoint_positions.empty()) {
    return Invalid(f + ".checkpoint_positions",
                   fmt::format("set on a {} group (only recurrent groups have checkpoints)",
                               GroupKindName(g.kind)));
  }
  return Status::OK();
}

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void Bytes(std::string_view s) { out_.insert(out_.end(), s.begin(), s.end()); }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

}  // namespace

std::string_view GroupKindName(GroupKind k) {
  switch (k) {
    case GroupKind::kFullAttention:
      return "full attention";
    case GroupKind::kSlidingWindow:
      return "sliding window";
    case GroupKind::kRecurrent:
      return "recurrent";
  }
  return "unknown";
}

Status ValidateModelDescription(const ModelDescription& d, std::string_view field) {
  const std::string f(field);
  if (d.key_block_tokens == 0 || d.key_block_tokens > kMaxBlockTokens) {
    return Invalid(f + ".key_block_tokens",
                   fmt::format("{} is outside [1, {}]", d.key_block_tokens, kMaxBlockTokens));
  }
  if (d.groups.empty()) return Invalid(f + ".groups", "no groups (a model stores something)");
  if (d.groups.size() > kMaxModelGroups) {
    return Invalid(f + ".groups", fmt::format("{} groups, more than the limit {}", d.groups.size(),
                                              kMaxModelGroups));
  }
  std::set<std::string_view> names;
  std::set<uint32_t> storage;
  for (size_t i = 0; i < d.groups.size(); ++i) {
    const GroupDescription& g = d.groups[i];
    const std::string gf = fmt::format("{}.groups[{}]", f, i);
    ORBITKV_RETURN_IF_ERROR(ValidateGroup(d, g, gf));
    if (!names.insert(g.name).second) {
      return Invalid(gf + ".name", fmt::format("\"{}\" names two groups", g.name));
    }
    if (!storage.insert(g.storage_group).second) {
      return Invalid(gf + ".storage_group",
                     fmt::format("{} is the storage group of two groups", g.storage_group));
    }
  }
  return Status::OK();
}

std::vector<uint8_t> CanonicalBytes(const ModelDescription& d) {
  std::vector<const GroupDescription*> sorted;
  for (const GroupDescription& g : d.groups) sorted.push_back(&g);
  std::sort(sorted.begin(), sorted.end(),
            [](const GroupDescription* a, const GroupDescription* b) { return a->name < b->name; });
  Writer w;
  w.Bytes("OKVMODEL");
  w.U16(1);
  w.U64(d.key_block_tokens);
  w.U32(static_cast<uint32_t>(sorted.size()));
  for (const GroupDescription* g : sorted) {
    w.U32(static_cast<uint32_t>(g->name.size()));
    w.Bytes(g->name);
    w.U8(static_cast<uint8_t>(g->kind));
    w.U32(g->storage_group);
    w.U64(g->block_tokens);
    w.U64(g->bytes);
    w.U64(g->window_tokens);
    w.U64(g->checkpoint_interval_tokens);
    w.U32(static_cast<uint32_t>(g->checkpoint_positions.size()));
    for (uint64_t p : g->checkpoint_positions) w.U64(p);
  }
  return w.Take();
}

Status CheckLayoutAgreement(const ModelDescription& d, const InstanceLayout& layout) {
  for (const GroupLayout& lg : layout.groups) {
    auto it = std::find_if(d.groups.begin(), d.groups.end(), [&](const GroupDescription& g) {
      return g.storage_group == lg.group_id;
    });
    if (it == d.groups.end()) {
      return Status::InvalidArgument(fmt::format(
          "layout group {}: no group of the model description stores into it", lg.group_id));
    }
    const uint64_t bytes = std::accumulate(lg.slot_bytes.begin(), lg.slot_bytes.end(), uint64_t{0});
    if (bytes != it->bytes) {
      return Status::InvalidArgument(fmt::format(
          "layout group {}: its slots hold {} bytes per object, model group \"{}\" says {}",
          lg.group_id, bytes, it->name, it->bytes));
    }
  }
  return Status::OK();
}

}  // namespace orbitkv::recovery
