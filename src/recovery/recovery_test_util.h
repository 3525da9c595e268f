// Test helpers: descriptions built in one line, and a presence oracle backed
// by a map that counts how often each piece was asked.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "orbitkv/model_description.h"
#include "recovery/recovery_plan.h"

namespace orbitkv::recovery::testing {

inline GroupDescription Full(std::string name, uint32_t storage, uint64_t bt, uint64_t bytes) {
  GroupDescription g;
  g.name = std::move(name);
  g.kind = GroupKind::kFullAttention;
  g.storage_group = storage;
  g.block_tokens = bt;
  g.bytes = bytes;
  return g;
}

inline GroupDescription Window(std::string name, uint32_t storage, uint64_t bt, uint64_t bytes,
                               uint64_t window) {
  GroupDescription g = Full(std::move(name), storage, bt, bytes);
  g.kind = GroupKind::kSlidingWindow;
  g.window_tokens = window;
  return g;
}

inline GroupDescription Recurrent(std::string name, uint32_t storage, uint64_t bt, uint64_t bytes,
                                  uint64_t interval, std::vector<uint64_t> positions = {}) {
  GroupDescription g = Full(std::move(name), storage, bt, bytes);
  g.kind = GroupKind::kRecurrent;
  g.checkpoint_interval_tokens = interval;
  g.checkpoint_positions = std::move(positions);
  return g;
}

inline ModelDescription Describe(uint64_t key_block_tokens, std::vector<GroupDescription> groups) {
  ModelDescription d;
  d.key_block_tokens = key_block_tokens;
  d.groups = std::move(groups);
  return d;
}

// Pieces are (group, block) or (group, position); absent unless set.
class MapOracle : public PresenceOracle {
 public:
  void SetBlock(uint32_t g, uint64_t b, Tier t) { pieces_[{g, false, b}] = t; }
  void SetCheckpoint(uint32_t g, uint64_t p, Tier t) { pieces_[{g, true, p}] = t; }
  Tier Get(uint32_t g, bool checkpoint, uint64_t i) const {
    auto it = pieces_.find({g, checkpoint, i});
    return it == pieces_.end() ? Tier::kNone : it->second;
  }
  Tier Block(uint32_t g, uint64_t b) override { return Ask(g, false, b); }
  Tier Checkpoint(uint32_t g, uint64_t p) override { return Ask(g, true, p); }
  void ClearAsks() { asks_.clear(); }
  // The most times any one piece was asked since ClearAsks.
  int MaxAsks() const {
    int m = 0;
    for (const auto& [k, n] : asks_) m = std::max(m, n);
    return m;
  }

 private:
  using PieceId = std::tuple<uint32_t, bool, uint64_t>;
  Tier Ask(uint32_t g, bool c, uint64_t i) {
    ++asks_[{g, c, i}];
    return Get(g, c, i);
  }
  std::map<PieceId, Tier> pieces_;
  std::map<PieceId, int> asks_;
};

}  // namespace orbitkv::recovery::testing
