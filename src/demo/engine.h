// Engine: one demo engine process. Connects to the Manager, registers one
// host instance (split layout, pages in sealed memfds) in the namespace all
// engines share, then serves its users round by round. Per request it queries
// the prompt's block-key chain, restores the hit prefix into poisoned pages
// and checks every byte against the key's deterministic content, "prefills"
// the missed blocks and "decodes" the answer by writing that content, and
// publishes the new blocks. Computing KV is simulated: writing the bytes, paced
// to compute_tokens_per_s. Each request's counts go to the parent as one
// line on report_fd (record.h).
//
// A hybrid engine (EngineOptions::hybrid) registers the model description of
// DemoHybridModel in a namespace of its own: its queries return a recovery
// plan, it restores exactly the plan's pieces (each into its own group's
// pages, workload/hybrid.h), checks them, and publishes per group the pieces
// that end after the restored prefix P; its records say what recovery did not
// read (window blocks before P - W, older checkpoints).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orbitkv/model_description.h"
#include "workload/workload.h"

namespace orbitkv::demo {

// The hybrid engine's model, per key block of the workload (block_tokens
// tokens): "attn" (full attention, K/V slots of half the bytes per token),
// "swa" (a window of kHybridWindowTokens, the other half) and "gdn" (a
// recurrent conv + SSM state checkpoint of kHybridCheckpointBytes every
// kHybridCheckpointBlocks blocks).
inline constexpr uint64_t kHybridWindowTokens = 512;
inline constexpr uint64_t kHybridCheckpointBytes = 64 * 1024;
inline constexpr uint64_t kHybridCheckpointBlocks = 4;
struct HybridModel {
  ModelDescription description;
  std::vector<std::vector<uint64_t>> slot_bytes;  // per group of the description
};
HybridModel DemoHybridModel(const WorkloadConfig& w);

struct EngineOptions {
  WorkloadConfig workload;
  uint32_t index = 0;   // this engine: users index*users .. index*users+users-1
  bool hybrid = false;  // a hybrid engine (DemoHybridModel)
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
