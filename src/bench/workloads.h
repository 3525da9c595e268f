// Workloads: the named workloads of orbitkv-bench, each turned into a plan. A
// plan is a list of phases; a phase gives every engine its requests, in order.
// Engines run a phase concurrently and wait for each other between phases; a
// phase may first wait for the Manager's SSD writeback to drain, so that SSD
// routes serve its restores from SSD. Only measured phases count in the
// figures. A request is a block-key chain (workload/workload.h: a key names its
// whole prefix, a block's bytes are a function of its key), so equal seeds and
// flags give identical plans in every run and on every route. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

struct WorkloadParams {
  uint32_t engines = 2;
  uint32_t block_tokens = 16;
  uint64_t block_bytes = 0;  // bytes of one block (for sizes given in bytes)
  uint64_t seed = 1;
  // multi-round-qa (LMCache's multi-round QA shape).
  uint32_t users = 8;  // in total, spread over the engines
  uint32_t rounds = 4;
  uint32_t system_prompt_tokens = 1000;
  uint32_t history_tokens = 2000;
  uint32_t question_tokens = 100;
  uint32_t answer_tokens = 100;
  // long-doc-qa.
  uint32_t documents = 8;
  uint32_t document_tokens = 10000;
  uint32_t repeats = 2;
  // serial-prefix.
  uint32_t steps = 16;
  uint32_t step_tokens = 1024;
  // sustained-mixed-prefix.
  uint32_t requests = 64;
  uint32_t families = 16;
  uint32_t prefix_tokens = 2048;
  uint32_t tail_tokens = 1024;  // each request adds 0..tail_tokens fresh tokens
  double zipf = 1.0;
  // publish-only, restore-only, block-size-sweep.
  uint64_t working_set_bytes = 0;
  uint32_t blocks_per_request = 32;
  uint32_t passes = 1;
};

struct BenchRequest {
  std::vector<BlockKey> keys;  // full blocks: prompt then answer
  uint32_t prompt_blocks = 0;  // the prefix that is queried and restored
  uint64_t prompt_tokens = 0;  // for the TTFT model
  bool query = true;           // false: publish every block without asking
};

struct Phase {
  std::string name;
  bool measured = true;
  bool drain_before = false;  // wait for SSD writeback to finish before it starts
  std::vector<std::vector<BenchRequest>> engines;  // requests per engine
};

struct Plan {
  std::string workload;
  std::string shape;  // one line: what the requests look like
  std::vector<Phase> phases;
  uint64_t working_set_blocks = 0;  // distinct keys in the plan
  uint64_t max_request_blocks = 0;  // pages one engine needs
  uint64_t measured_requests = 0;
};

struct WorkloadInfo {
  std::string_view name;
  std::string_view description;
  std::string_view default_routes;
};
const std::vector<WorkloadInfo>& Workloads();
const WorkloadInfo* FindWorkload(std::string_view name);

// The plan of `workload` (block-size-sweep: one point, a restore-only plan).
// InvalidArgument naming the flag for shapes that hold no full block or are
// too large.
Result<Plan> MakePlan(std::string_view workload, const WorkloadParams& params);

}  // namespace orbitkv::bench
