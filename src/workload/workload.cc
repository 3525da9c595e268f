#include "workload/workload.h"

#include <cstring>

#include "workload/slot_words.h"

namespace orbitkv::demo {
namespace {

inline uint64_t Mix(uint64_t x) { return SlotMix(x); }

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint64_t SlotSeed(const BlockKey& key, uint32_t slot) { return BlockSlotSeed(key, slot); }
inline uint64_t Word(uint64_t seed, uint64_t i) { return SlotWord(seed, i); }

}  // namespace

std::vector<uint64_t> WorkloadConfig::SlotBytes() const {
  std::vector<uint64_t> out(slots, block_bytes() / slots);
  out.back() += block_bytes() % slots;
  return out;
}

uint64_t WorkloadConfig::MaxBlocksPerRequest() const {
  const uint64_t tokens = uint64_t{system_prompt_tokens} + history_tokens +
                          uint64_t{rounds} * (question_tokens + answer_tokens);
  return tokens / block_tokens;
}

uint64_t WorkloadConfig::WorkingSetBlocks() const {
  const uint64_t per_user =
      uint64_t{history_tokens} + uint64_t{rounds} * (question_tokens + answer_tokens);
  const uint64_t users_total = uint64_t{engines} * users;
  return system_prompt_tokens / block_tokens +
         users_total * ((system_prompt_tokens % block_tokens + per_user) / block_tokens);
}

std::string WorkloadConfig::Namespace() const {
  return "orbitkv-demo/bpt" + std::to_string(bytes_per_token) + "/b" +
         std::to_string(block_tokens) + "/s" + std::to_string(slots) + "/seed" +
         std::to_string(seed);
}

Status WorkloadConfig::Validate() const {
  if (engines == 0 || engines > 64) return Status::InvalidArgument("--engines must be 1..64");
  if (users == 0 || users > 100000) return Status::InvalidArgument("--users must be 1..100000");
  if (rounds == 0 || rounds > 1000) return Status::InvalidArgument("--rounds must be 1..1000");
  if (block_tokens == 0 || block_tokens > 4096)
    return Status::InvalidArgument("--block-tokens must be 1..4096");
  if (bytes_per_token < slots)
    return Status::InvalidArgument("--bytes-per-token must be at least " + std::to_string(slots));
  if (block_bytes() / slots > (1ull << 30))
    return Status::InvalidArgument("--bytes-per-token x --block-tokens is too large");
  if (question_tokens + answer_tokens == 0)
    return Status::InvalidArgument("--question-tokens + --answer-tokens must be positive");
  if (MaxBlocksPerRequest() == 0)
    return Status::InvalidArgument("a request must hold at least one full block");
  if (MaxBlocksPerRequest() > 65536)
    return Status::InvalidArgument("requests are too long: over 65536 blocks");
  return Status::OK();
}

uint32_t Workload::SystemToken(uint64_t position) const {
  return static_cast<uint32_t>(Mix(Mix(c_.seed) ^ position) % 128000);
}

uint32_t Workload::UserToken(uint32_t user, uint64_t position) const {
  return static_cast<uint32_t>(
      Mix(Mix(c_.seed + (uint64_t{user} + 1) * 0x100000001B3ULL) ^ position) % 128000);
}

BlockKey Workload::ChainKey(const BlockKey* previous, std::span<const uint32_t> tokens) const {
  // Four 64-bit lanes, each absorbing the previous key and every token; a
  // non-cryptographic 256-bit chain, plenty for a demo's key space.
  uint64_t lane[4];
  for (int j = 0; j < 4; ++j) {
    lane[j] = Mix(c_.seed * 0x9E3779B97F4A7C15ULL + uint64_t(j) * 0x632BE59BD9B4E019ULL);
    if (previous) lane[j] = Mix(lane[j] ^ Load64(previous->data() + 8 * j));
  }
  for (uint32_t t : tokens) {
    for (int j = 0; j < 4; ++j) lane[j] = Mix(lane[j] ^ (uint64_t{t} << (8 * j)) ^ 0xA5);
  }
  BlockKey out;
  for (int j = 0; j < 4; ++j) {
    const uint64_t v = Mix(lane[j] ^ (lane[(j + 1) % 4] >> 17));
    std::memcpy(out.data() + 8 * j, &v, sizeof v);
  }
  return out;
}

Request Workload::MakeRequest(uint32_t user, uint32_t round) const {
  Request r;
  r.user = user;
  r.round = round;
  const uint64_t turn = uint64_t{c_.question_tokens} + c_.answer_tokens;
  const uint64_t history = c_.history_tokens + round * turn;
  const uint64_t user_prompt = history + c_.question_tokens;
  const uint64_t user_total = history + turn;
  r.prompt_tokens = c_.system_prompt_tokens + user_prompt;
  r.tokens.reserve(c_.system_prompt_tokens + user_total);
  for (uint64_t i = 0; i < c_.system_prompt_tokens; ++i) r.tokens.push_back(SystemToken(i));
  for (uint64_t i = 0; i < user_total; ++i) r.tokens.push_back(UserToken(user, i));
  const uint64_t blocks = r.tokens.size() / c_.block_tokens;
  r.prompt_blocks = r.prompt_tokens / c_.block_tokens;
  r.keys.reserve(blocks);
  for (uint64_t b = 0; b < blocks; ++b) {
    std::span<const uint32_t> t(r.tokens.data() + b * c_.block_tokens, c_.block_tokens);
    r.keys.push_back(ChainKey(b == 0 ? nullptr : &r.keys.back(), t));
  }
  return r;
}

// The word seed of one slot: every key word and the slot id feed it.
uint64_t BlockSlotSeed(const BlockKey& key, uint32_t slot) {
  uint64_t s = Mix(uint64_t{slot} + 0x5107);
  for (int w = 0; w < 4; ++w) s = Mix(s ^ Load64(key.data() + 8 * w));
  return s;
}

void FillBlockSlot(const BlockKey& key, uint32_t slot, uint8_t* dst, uint64_t bytes) {
  const uint64_t seed = SlotSeed(key, slot);
  const uint64_t words = bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    const uint64_t w = Word(seed, i);
    std::memcpy(dst + 8 * i, &w, 8);
  }
  if (bytes % 8) {
    const uint64_t w = Word(seed, words);
    std::memcpy(dst + 8 * words, &w, bytes % 8);
  }
}

bool CheckBlockSlot(const BlockKey& key, uint32_t slot, const uint8_t* src, uint64_t bytes) {
  const uint64_t seed = SlotSeed(key, slot);
  const uint64_t words = bytes / 8;
  uint64_t diff = 0;
  for (uint64_t i = 0; i < words; ++i) diff |= Load64(src + 8 * i) ^ Word(seed, i);
  if (bytes % 8) {
    const uint64_t w = Word(seed, words);
    diff |= static_cast<uint64_t>(std::memcmp(src + 8 * words, &w, bytes % 8) != 0);
  }
  return diff == 0;
}

}  // namespace orbitkv::demo
