// Engine: one demo engine process. Connects to the Manager, registers one
// host instance (split layout, pages in sealed memfds) in the namespace all
// engines share, then serves its users round by round. Per request it queries
// the prompt's block-key chain, restores the hit prefix into poisoned pages
// and checks every byte against the key's deterministic content, "prefills"
// the missed blocks and "decodes" the answer by writing that content, and
// publishes the new blocks. Computing KV is simulated: writing the bytes, paced
// to compute_tokens_per_s. Each request's counts go to the parent as one
// line on report_fd (record.h).
#pragma once

#include <cstdint>
#include <string>

#include "workload/workload.h"

namespace orbitkv::demo {

struct EngineOptions {
  WorkloadConfig workload;
  uint32_t index = 0;  // this engine: users index*users .. index*users+users-1
  std::string socket_path;
  int report_fd = -1;
  uint32_t query_ttl_ms = 30000;
  // Simulated model compute: tokens whose KV was not restored (prefill of the
  // misses, decode of the answer) take this long per token; 0 = no pacing.
  double compute_tokens_per_s = 0;
};

// Exit status: 0 all verified, 1 a restored block had wrong bytes, 3 error.
int RunEngine(const EngineOptions& options);

}  // namespace orbitkv::demo
