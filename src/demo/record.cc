#include "demo/record.h"

#include <nlohmann/json.hpp>

namespace orbitkv::demo {

using nlohmann::json;

std::string EncodeRecord(const RequestRecord& r) {
  json j = {{"engine", r.engine},         {"user", r.user},
            {"round", r.round},           {"queried", r.queried},
            {"hit_dram", r.hit_dram},     {"hit_ssd", r.hit_ssd},
            {"failed", r.failed},         {"missed", r.missed},
            {"mismatched", r.mismatched}, {"restore_bytes", r.restore_bytes},
            {"restore_ns", r.restore_ns}, {"computed_tokens", r.computed_tokens},
            {"published", r.published},   {"stored", r.stored},
            {"skipped", r.skipped}};
  if (!r.first_error.empty()) j["first_error"] = r.first_error;
  if (r.hybrid) {
    j["hybrid"] = true;
    j["prefix_tokens"] = r.prefix_tokens;
    j["pieces"] = r.pieces;
    j["checkpoint_bytes"] = r.checkpoint_bytes;
    j["not_needed_bytes"] = r.not_needed_bytes;
  }
  return j.dump() + "\n";
}

std::string EncodeDone() { return json{{"done", true}}.dump() + "\n"; }

std::string EncodeError(const std::string& message) {
  return json{{"error", message}}.dump() + "\n";
}

EngineMessage DecodeLine(const std::string& line) {
  EngineMessage m;
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    m.error = "unreadable report line: " + line;
    return m;
  }
  if (j.contains("error")) {
    m.error = j["error"].is_string() ? j["error"].get<std::string>() : "engine failed";
    return m;
  }
  if (j.value("done", false)) {
    m.done = true;
    return m;
  }
  RequestRecord r;
  r.engine = j.value("engine", 0u);
  r.user = j.value("user", 0u);
  r.round = j.value("round", 0u);
  r.queried = j.value("queried", uint64_t{0});
  r.hit_dram = j.value("hit_dram", uint64_t{0});
  r.hit_ssd = j.value("hit_ssd", uint64_t{0});
  r.failed = j.value("failed", uint64_t{0});
  r.missed = j.value("missed", uint64_t{0});
  r.mismatched = j.value("mismatched", uint64_t{0});
  r.restore_bytes = j.value("restore_bytes", uint64_t{0});
  r.restore_ns = j.value("restore_ns", uint64_t{0});
  r.computed_tokens = j.value("computed_tokens", uint64_t{0});
  r.published = j.value("published", uint64_t{0});
  r.stored = j.value("stored", uint64_t{0});
  r.skipped = j.value("skipped", uint64_t{0});
  r.first_error = j.value("first_error", std::string());
  r.hybrid = j.value("hybrid", false);
  r.prefix_tokens = j.value("prefix_tokens", uint64_t{0});
  r.pieces = j.value("pieces", uint64_t{0});
  r.checkpoint_bytes = j.value("checkpoint_bytes", uint64_t{0});
  r.not_needed_bytes = j.value("not_needed_bytes", uint64_t{0});
  m.record = r;
  return m;
}

}  // namespace orbitkv::demo
