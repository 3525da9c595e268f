// Engine: one engine thread of a route run. It opens its page target and its
// backend (a Manager session or the naive store), then runs its requests phase
// by phase as the PhaseGate opens them: per request it queries the prompt's key
// chain, restores the prefix into poisoned pages (one Restore call per source
// tier, so each call is timed against one route), checks every restored byte
// against the key's content (unless verification is off), writes the blocks it
// did not restore ("prefill") and publishes them. After the plan's phases it
// runs the per-block latency probes (single-block restores) in phase
// plan.phases.size(), one in flight across all engines at a time (the
// target is the latency of a restore alone; scale measures it under load). Failures abort the gate
// and come back as the status.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "bench/backend.h"
#include "bench/page_target.h"
#include "bench/phase_gate.h"
#include "bench/samples.h"
#include "bench/workloads.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

// Counters the driver reads for the live line (relaxed atomics).
struct LiveCounters {
  std::atomic<uint64_t> requests{0}, queried{0}, hits{0}, restored_bytes{0}, mismatched{0};
};

struct EngineOptions {
  uint32_t index = 0;
  const Plan* plan = nullptr;
  std::string device = "host";
  std::vector<uint64_t> slot_bytes;
  bool page_first = false;  // pages in a page-first layout (else split)
  uint32_t block_tokens = 16;
  bool verify = true;
  uint32_t probes = 0;             // single-block restores after the plan
  std::mutex* probe_mu = nullptr;  // shared by the engines: held across each probe
  // Tests: every Nth restored block is overwritten before it is checked, so
  // verification must catch it (0: never).
  uint32_t corrupt_every = 0;
  uint64_t seed = 1;
  std::chrono::steady_clock::time_point epoch;
  // Opens this engine's backend over its pages (called on the engine thread).
  std::function<Result<std::unique_ptr<Backend>>(PageTarget&)> connect;
  PhaseGate* gate = nullptr;
  LiveCounters* live = nullptr;
};

// Runs the engine to the end (or until the gate aborts); fills *out.
Status RunEngine(const EngineOptions& options, EngineSamples* out);

}  // namespace orbitkv::bench
