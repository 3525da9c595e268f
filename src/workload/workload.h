// Workload: the demo's conversation model. A shared system prompt and, per
// user, one deterministic token stream; round r of a user asks with
//   prompt = system prompt + the user's history + a new question
// and the model answers; the history then grows by that question and answer.
// Tokens are grouped into blocks of block_tokens; only full blocks are keyed.
// Block keys form a hash chain over token ids (key i = H(key i-1, tokens of
// block i)), so a key names the whole prefix up to its block, and engines that
// share the system prompt share its keys. A block's KV bytes are a
// deterministic function of its key (BlockContent), so whoever restores a
// block can check every byte no matter which engine produced it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv::demo {

struct WorkloadConfig {
  uint32_t engines = 2;
  uint32_t users = 8;  // per engine
  uint32_t rounds = 4;
  uint32_t system_prompt_tokens = 1000;
  uint32_t history_tokens = 2000;  // each user's history before round 0
  uint32_t question_tokens = 100;
  uint32_t answer_tokens = 100;
  uint32_t block_tokens = 16;
  uint64_t bytes_per_token = 4096;  // KV bytes of one token, all layers
  uint32_t slots = 4;               // slots per block (one per layer and K/V)
  uint64_t seed = 1;

  uint64_t block_bytes() const { return block_tokens * bytes_per_token; }
  // Slot sizes of one block: block_bytes split evenly, the last takes the rest.
  std::vector<uint64_t> SlotBytes() const;
  uint64_t total_requests() const { return uint64_t{engines} * users * rounds; }
  // Blocks of the longest request (last round, prompt + answer).
  uint64_t MaxBlocksPerRequest() const;
  // Distinct blocks the whole run publishes (an estimate: a block that spans
  // the system prompt's end is per user).
  uint64_t WorkingSetBlocks() const;
  // Namespace shared by all engines: model shape, block size, seed.
  std::string Namespace() const;
  // Checks ranges; the error names the flag.
  Status Validate() const;
};

// One request of one user: its tokens and block keys.
struct Request {
  uint32_t user = 0;  // global user id (engine * users + local user)
  uint32_t round = 0;
  std::vector<uint32_t> tokens;  // prompt then answer
  uint64_t prompt_tokens = 0;
  std::vector<BlockKey> keys;  // one per full block of tokens (prompt + answer)
  uint64_t prompt_blocks = 0;  // full blocks inside the prompt: the ones queried
};

class Workload {
 public:
  explicit Workload(const WorkloadConfig& config) : c_(config) {}
  const WorkloadConfig& config() const { return c_; }

  // Round `round` of global user `user`.
  Request MakeRequest(uint32_t user, uint32_t round) const;

  // Token ids: the system prompt's and each user's stream.
  uint32_t SystemToken(uint64_t position) const;
  uint32_t UserToken(uint32_t user, uint64_t position) const;

  // The chain hash: key of a block given the previous block's key (or none).
  BlockKey ChainKey(const BlockKey* previous, std::span<const uint32_t> tokens) const;

 private:
  WorkloadConfig c_;
};

// The seed of the words of slot `slot` of the block named `key`
// (slot_words.h: word i is SlotWord(seed, i)).
uint64_t BlockSlotSeed(const BlockKey& key, uint32_t slot);
// The KV bytes of slot `slot` of the block named `key`.
void FillBlockSlot(const BlockKey& key, uint32_t slot, uint8_t* dst, uint64_t bytes);
// True if `src` holds exactly FillBlockSlot's bytes.
bool CheckBlockSlot(const BlockKey& key, uint32_t slot, const uint8_t* src, uint64_t bytes);

}  // namespace orbitkv::demo
