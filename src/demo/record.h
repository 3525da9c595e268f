// RequestRecord: what an engine reports to the demo parent after each request,
// one JSON object per line over a pipe. The last line of an engine is either
// {"done":true} or {"error":"..."}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace orbitkv::demo {

struct RequestRecord {
  uint32_t engine = 0;
  uint32_t user = 0;
  uint32_t round = 0;
  uint64_t queried = 0;          // prompt blocks asked for
  uint64_t hit_dram = 0;         // restored from DRAM
  uint64_t hit_ssd = 0;          // restored from SSD
  uint64_t failed = 0;           // in the query's prefix but the restore failed: recomputed
  uint64_t missed = 0;           // beyond the query's prefix: prefilled
  uint64_t mismatched = 0;       // restored blocks whose bytes were wrong
  uint64_t restore_bytes = 0;    // KV bytes restored (ok blocks)
  uint64_t restore_ns = 0;       // Restore call wall time
  uint64_t computed_tokens = 0;  // tokens whose KV the engine computed (prefill, decode)
  uint64_t published = 0;        // blocks sent to Publish
  uint64_t stored = 0;           // accepted by the Manager
  uint64_t skipped = 0;          // already cached or refused for room
  std::string first_error;       // first failed block's status, if any
  // A hybrid engine's request: the recovery plan's prefix P and pieces
  // restored, of their bytes (restore_bytes) those of checkpoints, and the
  // bytes of [0, P) recovery did not read (QueryResult.not_needed_bytes).
  bool hybrid = false;
  uint64_t prefix_tokens = 0, pieces = 0, checkpoint_bytes = 0, not_needed_bytes = 0;
};

std::string EncodeRecord(const RequestRecord& r);

// One parsed line: a record, the end of an engine's run, or its fatal error.
struct EngineMessage {
  std::optional<RequestRecord> record;
  bool done = false;
  std::string error;  // non-empty: the engine failed
};
EngineMessage DecodeLine(const std::string& line);
std::string EncodeDone();
std::string EncodeError(const std::string& message);

}  // namespace orbitkv::demo
