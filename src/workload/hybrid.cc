#include "workload/hybrid.h"

#include <algorithm>

namespace orbitkv::demo {

InstanceLayout HybridLayout(const ModelDescription& d,
                            const std::vector<std::vector<uint64_t>>& slot_bytes, uint64_t pages,
                            bool page_first) {
  InstanceLayout l;
  l.num_pages = pages;
  for (uint32_t g = 0; g < d.groups.size(); ++g) {
    const std::vector<uint64_t>& slots = slot_bytes.at(g);
    GroupLayout gl;
    gl.group_id = d.groups[g].storage_group;
    gl.num_slots = static_cast<uint32_t>(slots.size());
    gl.slot_bytes = slots;
    uint64_t page_bytes = 0;
    for (uint64_t b : slots) page_bytes += b;
    const uint32_t group_region = static_cast<uint32_t>(l.region_bytes.size());
    if (page_first) l.region_bytes.push_back(pages * page_bytes);
    uint64_t offset = 0;
    for (uint32_t s = 0; s < slots.size(); ++s) {
      if (page_first) {
        gl.slots.push_back({s, group_region, offset, page_bytes, slots[s]});
        offset += slots[s];
      } else {
        gl.slots.push_back(
            {s, static_cast<uint32_t>(l.region_bytes.size()), 0, slots[s], slots[s]});
        l.region_bytes.push_back(pages * slots[s]);
      }
    }
    l.groups.push_back(std::move(gl));
  }
  return l;
}

uint64_t PieceKeyIndex(const ModelDescription& d, uint32_t group, uint64_t index) {
  const GroupDescription& g = d.groups[group];
  const uint64_t end_tokens =
      g.kind == GroupKind::kRecurrent ? index : (index + 1) * g.block_tokens;
  return end_tokens / d.key_block_tokens - 1;
}

namespace {

// Scheduled checkpoints of recurrent group g in (begin, end].
std::vector<uint64_t> Checkpoints(const GroupDescription& g, uint64_t begin, uint64_t end) {
  std::vector<uint64_t> out;
  if (g.checkpoint_interval_tokens) {
    const uint64_t n = g.checkpoint_interval_tokens;
    for (uint64_t p = (begin / n + 1) * n; p <= end; p += n) out.push_back(p);
  } else {
    for (uint64_t p : g.checkpoint_positions)
      if (p > begin && p <= end) out.push_back(p);
  }
  return out;
}

}  // namespace

std::vector<ChainPiece> ChainPieces(const ModelDescription& d, uint64_t begin_tokens,
                                    uint64_t end_tokens) {
  std::vector<ChainPiece> out;
  for (uint32_t gi = 0; gi < d.groups.size(); ++gi) {
    const GroupDescription& g = d.groups[gi];
    if (g.kind == GroupKind::kRecurrent) {
      for (uint64_t p : Checkpoints(g, begin_tokens, end_tokens))
        out.push_back({gi, p, PieceKeyIndex(d, gi, p)});
      continue;
    }
    // Blocks ending in (begin, end]: the first is the one holding token `begin`.
    for (uint64_t b = begin_tokens / g.block_tokens; (b + 1) * g.block_tokens <= end_tokens; ++b)
      out.push_back({gi, b, PieceKeyIndex(d, gi, b)});
  }
  return out;
}

std::vector<ChainPiece> RequiredPieces(const ModelDescription& d, uint64_t p) {
  std::vector<ChainPiece> out;
  if (p == 0) return out;
  for (uint32_t gi = 0; gi < d.groups.size(); ++gi) {
    const GroupDescription& g = d.groups[gi];
    if (g.kind == GroupKind::kRecurrent) {
      out.push_back({gi, p, PieceKeyIndex(d, gi, p)});
      continue;
    }
    uint64_t first = 0;
    if (g.kind == GroupKind::kSlidingWindow && p > g.window_tokens)
      first = (p - g.window_tokens) / g.block_tokens;
    for (uint64_t b = first; b < p / g.block_tokens; ++b)
      out.push_back({gi, b, PieceKeyIndex(d, gi, b)});
  }
  return out;
}

BlockKey PieceContentKey(const BlockKey& chain_key, uint32_t group) {
  BlockKey k = chain_key;
  // Group 0 keeps the chain key, so a dense reading of one group matches.
  const uint64_t mix = uint64_t{group} * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < sizeof mix; ++i) k[i] ^= static_cast<uint8_t>(mix >> (8 * i));
  return k;
}

}  // namespace orbitkv::demo
