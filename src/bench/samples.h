// Samples: what one engine thread measures during a route run, before the
// driver aggregates them (figures.h). Times are seconds since the run's epoch
// (steady clock); CPU seconds are the engine thread's own (CLOCK_THREAD_CPUTIME_ID),
// which is the mover's CPU for the naive route. Plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orbitkv/cache_api.h"

namespace orbitkv::bench {

// One Restore or Publish call. Restore calls carry blocks of one tier only
// (the engine splits a query's prefix by source), so each is attributable.
struct CallSample {
  Tier tier = Tier::kNone;  // restores: the source; publishes: kNone
  uint64_t blocks = 0;      // blocks restored (ok) or stored
  uint64_t bytes = 0;       // KV bytes of those blocks
  double start = 0, end = 0;
  double cpu = 0;
  std::optional<RestoreTimeline> timeline;  // restores through a Manager
};

// One request of a measured phase.
struct RequestSample {
  uint32_t phase = 0;
  uint64_t queried = 0, hit_dram = 0, hit_ssd = 0, failed = 0, missed = 0, mismatched = 0;
  uint64_t prompt_tokens = 0;
  uint64_t restored_blocks = 0;
  double query_s = 0;    // the Query call
  double restore_s = 0;  // every Restore call of the request
  bool queried_cache = false;
};

struct EngineSamples {
  std::vector<CallSample> restores, publishes;  // measured phases only
  std::vector<RequestSample> requests;          // measured phases only
  std::vector<CallSample> probes;  // single-block restores after the workload (per-block latency)
  uint64_t verified_blocks = 0;    // restored blocks checked byte for byte (all phases)
  uint64_t mismatched = 0;         // of those, wrong bytes
  uint64_t restored_blocks = 0;    // all phases
  uint64_t dropped = 0;            // publishes the store had no room for
  std::string first_restore_error;
};

}  // namespace orbitkv::bench
