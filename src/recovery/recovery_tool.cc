// orbitkv-recovery-tool: the C++ side of the Python parity test
// (tests/python/test_hybrid.py). Reads JSON from stdin:
//   {"cases": [{"model": {key_block_tokens, groups: [{name, kind (number),
//     storage_group, block_tokens, bytes, window_tokens,
//     checkpoint_interval_tokens, checkpoint_positions}]}, "chain": [hex keys]}]}
// and prints one JSON result per case: {"error": message} for a refused
// description, else {"canonical": hex, "fingerprint": hex, "masks": [hex],
// "object_keys": [[hex per chain key] per group]}. Exit 2 on unreadable input.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "recovery/model_description.h"
#include "recovery/object_keys.h"

namespace {

using nlohmann::json;
using orbitkv::BlockKey;

std::string Hex(const uint8_t* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

BlockKey KeyFromHex(const std::string& s) {
  if (s.size() != 64) throw std::invalid_argument("a chain key is 64 hex digits: " + s);
  BlockKey k{};
  for (size_t i = 0; i < 32; ++i)
    k[i] = static_cast<uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return k;
}

orbitkv::ModelDescription FromJson(const json& j) {
  orbitkv::ModelDescription d;
  d.key_block_tokens = j.at("key_block_tokens").get<uint64_t>();
  for (const json& g : j.at("groups")) {
    orbitkv::GroupDescription o;
    o.name = g.at("name").get<std::string>();
    o.kind = static_cast<orbitkv::GroupKind>(g.at("kind").get<uint8_t>());
    o.storage_group = g.at("storage_group").get<uint32_t>();
    o.block_tokens = g.at("block_tokens").get<uint64_t>();
    o.bytes = g.at("bytes").get<uint64_t>();
    o.window_tokens = g.value("window_tokens", uint64_t{0});
    o.checkpoint_interval_tokens = g.value("checkpoint_interval_tokens", uint64_t{0});
    o.checkpoint_positions = g.value("checkpoint_positions", std::vector<uint64_t>{});
    d.groups.push_back(std::move(o));
  }
  return d;
}

json Run(const json& c) {
  const orbitkv::ModelDescription d = FromJson(c.at("model"));
  if (orbitkv::Status st = orbitkv::recovery::ValidateModelDescription(d); !st.ok()) {
    return {{"error", std::string(st.message())}};
  }
  const std::vector<uint8_t> bytes = orbitkv::recovery::CanonicalBytes(d);
  json out = {
      {"canonical", Hex(bytes.data(), bytes.size())},
      {"fingerprint", orbitkv::recovery::FingerprintHex(orbitkv::recovery::Fingerprint(d))}};
  std::vector<BlockKey> chain;
  for (const json& k : c.value("chain", json::array())) chain.push_back(KeyFromHex(k));
  json masks = json::array(), keys = json::array();
  for (const BlockKey& m : orbitkv::recovery::GroupMasks(d)) {
    masks.push_back(Hex(m.data(), m.size()));
    json per = json::array();
    for (const BlockKey& k : chain) {
      const BlockKey o = orbitkv::recovery::ObjectKey(k, m);
      per.push_back(Hex(o.data(), o.size()));
    }
    keys.push_back(per);
  }
  out["masks"] = masks;
  out["object_keys"] = keys;
  return out;
}

}  // namespace

int main() {
  try {
    const json in = json::parse(std::cin);
    json out = json::array();
    for (const json& c : in.at("cases")) out.push_back(Run(c));
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orbitkv-recovery-tool: %s\n", e.what());
    return 2;
  }
}
