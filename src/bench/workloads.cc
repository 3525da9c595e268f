#include "bench/workloads.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "workload/workload.h"

namespace orbitkv::bench {
namespace {

// Token streams: demo::Workload::UserToken(stream, position) is one
// deterministic stream per id; each workload draws from its own id range.
constexpr uint32_t kDocumentStreams = 1'000'000;
constexpr uint32_t kQuestionStreams = 2'000'000;
constexpr uint32_t kFamilyStreams = 3'000'000;
constexpr uint32_t kTailStreams = 4'000'000;
constexpr uint32_t kChainStreams = 5'000'000;
constexpr uint32_t kSerialStreams = 6'000'000;

constexpr uint64_t kMaxRequestBlocks = 65536;

class Builder {
 public:
  explicit Builder(const WorkloadParams& p) : p_(p), w_(Config(p)) {}

  const demo::Workload& workload() const { return w_; }

  // Appends `count` tokens of `stream` from `start`.
  void Append(std::vector<uint32_t>& tokens, uint32_t stream, uint64_t start,
              uint64_t count) const {
    for (uint64_t i = 0; i < count; ++i) tokens.push_back(w_.UserToken(stream, start + i));
  }

  // A request over `tokens`, of which the first `prompt_tokens` are the prompt.
  BenchRequest Make(const std::vector<uint32_t>& tokens, uint64_t prompt_tokens) const {
    BenchRequest r;
    r.prompt_tokens = prompt_tokens;
    r.prompt_blocks = static_cast<uint32_t>(prompt_tokens / p_.block_tokens);
    const uint64_t blocks = tokens.size() / p_.block_tokens;
    r.keys.reserve(blocks);
    for (uint64_t b = 0; b < blocks; ++b) {
      std::span<const uint32_t> t(tokens.data() + b * p_.block_tokens, p_.block_tokens);
      r.keys.push_back(w_.ChainKey(b == 0 ? nullptr : &r.keys.back(), t));
    }
    return r;
  }

 private:
  static demo::WorkloadConfig Config(const WorkloadParams& p) {
    demo::WorkloadConfig c;
    c.block_tokens = p.block_tokens;
    c.system_prompt_tokens = p.system_prompt_tokens;
    c.history_tokens = p.history_tokens;
    c.question_tokens = p.question_tokens;
    c.answer_tokens = p.answer_tokens;
    c.seed = p.seed;
    return c;
  }
  const WorkloadParams& p_;
  demo::Workload w_;
};

Phase NewPhase(std::string name, uint32_t engines, bool measured = true,
               bool drain_before = false) {
  Phase ph;
  ph.name = std::move(name);
  ph.measured = measured;
  ph.drain_before = drain_before;
  ph.engines.resize(engines);
  return ph;
}

// Chains of blocks_per_request blocks covering the working set; one request
// each, spread over the engines.
std::vector<BenchRequest> Chains(const WorkloadParams& p, const Builder& b) {
  const uint64_t blocks = std::max<uint64_t>(1, p.working_set_bytes / p.block_bytes);
  std::vector<BenchRequest> out;
  for (uint64_t first = 0, c = 0; first < blocks; first += p.blocks_per_request, ++c) {
    const uint64_t n = std::min<uint64_t>(p.blocks_per_request, blocks - first);
    std::vector<uint32_t> tokens;
    b.Append(tokens, kChainStreams + static_cast<uint32_t>(c), 0, n * p.block_tokens);
    out.push_back(b.Make(tokens, tokens.size()));
  }
  return out;
}

Plan MultiRoundQa(const WorkloadParams& p, const Builder& b) {
  Plan plan;
  plan.shape = "users x rounds: a shared " + std::to_string(p.system_prompt_tokens) +
               "-token system prompt + a " + std::to_string(p.history_tokens) +
               "-token history per user, growing by a " + std::to_string(p.question_tokens) +
               "-token question and a " + std::to_string(p.answer_tokens) +
               "-token answer per round";
  Phase ph = NewPhase("conversation", p.engines);
  for (uint32_t round = 0; round < p.rounds; ++round) {
    for (uint32_t user = 0; user < p.users; ++user) {
      demo::Request r = b.workload().MakeRequest(user, round);
      BenchRequest br;
      br.keys = std::move(r.keys);
      br.prompt_blocks = static_cast<uint32_t>(r.prompt_blocks);
      br.prompt_tokens = r.prompt_tokens;
      ph.engines[user % p.engines].push_back(std::move(br));
    }
  }
  plan.phases.push_back(std::move(ph));
  return plan;
}

Plan LongDocQa(const WorkloadParams& p, const Builder& b) {
  Plan plan;
  plan.shape = std::to_string(p.documents) + " documents of " + std::to_string(p.document_tokens) +
               " tokens, each asked once cold and " + std::to_string(p.repeats) +
               " more times in shuffled order, with a " + std::to_string(p.question_tokens) +
               "-token question and a " + std::to_string(p.answer_tokens) + "-token answer";
  auto request = [&](uint32_t doc, uint64_t index) {
    std::vector<uint32_t> tokens;
    b.Append(tokens, kDocumentStreams + doc, 0, p.document_tokens);
    b.Append(tokens, kQuestionStreams + static_cast<uint32_t>(index), 0,
             uint64_t{p.question_tokens} + p.answer_tokens);
    return b.Make(tokens, uint64_t{p.document_tokens} + p.question_tokens);
  };
  uint64_t index = 0;
  Phase cold = NewPhase("cold", p.engines);
  for (uint32_t d = 0; d < p.documents; ++d)
    cold.engines[d % p.engines].push_back(request(d, index++));
  plan.phases.push_back(std::move(cold));
  Phase warm = NewPhase("repeat", p.engines, true, /*drain_before=*/true);
  std::mt19937_64 rng(p.seed);
  std::vector<uint32_t> order(p.documents);
  uint64_t n = 0;
  for (uint32_t r = 0; r < p.repeats; ++r) {
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t d : order) warm.engines[n++ % p.engines].push_back(request(d, index++));
  }
  plan.phases.push_back(std::move(warm));
  return plan;
}

Plan SerialPrefix(const WorkloadParams& p, const Builder& b) {
  Plan plan;
  plan.shape = "per engine one context growing by " + std::to_string(p.step_tokens) +
               " tokens per request for " + std::to_string(p.steps) +
               " requests: each restores the previous context";
  Phase ph = NewPhase("serial", p.engines);
  for (uint32_t e = 0; e < p.engines; ++e) {
    std::vector<uint32_t> tokens;
    for (uint32_t s = 0; s < p.steps; ++s) {
      b.Append(tokens, kSerialStreams + e, tokens.size(), p.step_tokens);
      ph.engines[e].push_back(b.Make(tokens, tokens.size()));
    }
  }
  plan.phases.push_back(std::move(ph));
  return plan;
}

Plan SustainedMixedPrefix(const WorkloadParams& p, const Builder& b) {
  Plan plan;
  plan.shape = std::to_string(p.requests) + " requests over " + std::to_string(p.families) +
               " prefix families (Zipf s=" + std::to_string(p.zipf).substr(0, 4) + ") of " +
               std::to_string(p.prefix_tokens) + " tokens + 0.." + std::to_string(p.tail_tokens) +
               " fresh tokens + a " + std::to_string(p.answer_tokens) + "-token answer";
  std::vector<double> cdf(p.families);
  double sum = 0;
  for (uint32_t f = 0; f < p.families; ++f) cdf[f] = sum += 1.0 / std::pow(f + 1.0, p.zipf);
  for (double& c : cdf) c /= sum;
  std::mt19937_64 rng(p.seed);
  std::uniform_real_distribution<double> u01(0, 1);
  std::uniform_int_distribution<uint32_t> tail(0, p.tail_tokens);
  Phase ph = NewPhase("mixed", p.engines);
  for (uint32_t i = 0; i < p.requests; ++i) {
    const uint32_t family = static_cast<uint32_t>(std::min<size_t>(
        std::lower_bound(cdf.begin(), cdf.end(), u01(rng)) - cdf.begin(), p.families - 1));
    const uint32_t fresh = tail(rng);
    std::vector<uint32_t> tokens;
    b.Append(tokens, kFamilyStreams + family, 0, p.prefix_tokens);
    b.Append(tokens, kTailStreams + i, 0, uint64_t{fresh} + p.answer_tokens);
    ph.engines[i % p.engines].push_back(b.Make(tokens, uint64_t{p.prefix_tokens} + fresh));
  }
  plan.phases.push_back(std::move(ph));
  return plan;
}

Plan PublishOnly(const WorkloadParams& p, const Builder& b) {
  Plan plan;
  plan.shape = "publish the working set in requests of " + std::to_string(p.blocks_per_request) +
               " blocks, no queries";
  Phase ph = NewPhase("publish", p.engines);
  std::vector<BenchRequest> chains = Chains(p, b);
  for (size_t i = 0; i < chains.size(); ++i) {
    chains[i].query = false;
    chains[i].prompt_blocks = 0;
    ph.engines[i % p.engines].push_back(std::move(chains[i]));
  }
  plan.phases.push_back(std::move(ph));
  return plan;
}

Plan RestoreOnly(const WorkloadParams& p, const Builder& b) {
  Plan plan;
  plan.shape = "publish the working set (not measured), wait for SSD writeback, then restore " +
               std::to_string(p.passes) + " pass(es) over it in shuffled requests of " +
               std::to_string(p.blocks_per_request) + " blocks";
  std::vector<BenchRequest> chains = Chains(p, b);
  Phase populate = NewPhase("populate", p.engines, /*measured=*/false);
  for (size_t i = 0; i < chains.size(); ++i) {
    BenchRequest r = chains[i];
    r.query = false;
    r.prompt_blocks = 0;
    populate.engines[i % p.engines].push_back(std::move(r));
  }
  plan.phases.push_back(std::move(populate));
  Phase restore = NewPhase("restore", p.engines, true, /*drain_before=*/true);
  std::mt19937_64 rng(p.seed);
  std::vector<size_t> order(chains.size());
  uint64_t n = 0;
  for (uint32_t pass = 0; pass < p.passes; ++pass) {
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t c : order) restore.engines[n++ % p.engines].push_back(chains[c]);
  }
  plan.phases.push_back(std::move(restore));
  return plan;
}

Status Validate(const WorkloadParams& p) {
  if (p.engines == 0 || p.engines > 64) return Status::InvalidArgument("--engines must be 1..64");
  if (p.block_tokens == 0 || p.block_tokens > 4096)
    return Status::InvalidArgument("--block-tokens must be 1..4096");
  if (p.block_bytes == 0) return Status::InvalidArgument("the model's block has no bytes");
  if (p.blocks_per_request == 0 || p.blocks_per_request > kMaxRequestBlocks)
    return Status::InvalidArgument("--blocks-per-request must be 1..65536");
  if (p.users == 0) return Status::InvalidArgument("--users must be positive");
  if (p.rounds == 0) return Status::InvalidArgument("--rounds must be positive");
  if (p.documents == 0) return Status::InvalidArgument("--documents must be positive");
  if (p.steps == 0 || p.step_tokens == 0)
    return Status::InvalidArgument("--steps and --step-tokens must be positive");
  if (p.requests == 0 || p.families == 0)
    return Status::InvalidArgument("--requests and --families must be positive");
  if (p.passes == 0) return Status::InvalidArgument("--passes must be positive");
  if (!(p.zipf >= 0)) return Status::InvalidArgument("--zipf must be >= 0");
  return Status::OK();
}

}  // namespace

const std::vector<WorkloadInfo>& Workloads() {
  static const std::vector<WorkloadInfo> w = {
      {"multi-round-qa",
       "users x rounds of a chat (LMCache's multi-round QA): shared system prompt, history, "
       "questions and answers",
       "dram,ssd-uring,naive"},
      {"long-doc-qa", "long documents asked about again and again", "dram,ssd-uring,naive"},
      {"serial-prefix", "one context per engine growing request by request",
       "dram,ssd-uring,naive"},
      {"sustained-mixed-prefix",
       "a seeded stream of requests over Zipf-popular shared prefixes with fresh tails",
       "dram,ssd-uring,naive"},
      {"publish-only", "publish the working set; no queries", "dram,naive"},
      {"restore-only",
       "publish a working set larger than the DRAM pool, then restore it: the SSD serves",
       "ssd-uring,naive"},
      {"block-size-sweep",
       "restore-only at several block sizes (--sweep-block-tokens), working set within the pool",
       "dram,ssd-uring,naive"},
      {"scale",
       "costs against work on one DRAM-only Manager: query latency vs chain length, restore and "
       "publish GB/s vs engines, directory bytes per object and RSS, restore latency under a "
       "publish storm (scale.h; --scale-*); begins with query-scale",
       "dram"},
      {"query-scale",
       "Manager::Query latency against chain length on an in-process Manager, the chain all in "
       "DRAM and half on SSD (query_scale.h; --scale-chain-tokens)",
       "dram"},
  };
  return w;
}

const WorkloadInfo* FindWorkload(std::string_view name) {
  for (const WorkloadInfo& w : Workloads())
    if (w.name == name) return &w;
  return nullptr;
}

Result<Plan> MakePlan(std::string_view workload, const WorkloadParams& params) {
  ORBITKV_RETURN_IF_ERROR(Validate(params));
  Builder b(params);
  Plan plan;
  if (workload == "multi-round-qa") {
    plan = MultiRoundQa(params, b);
  } else if (workload == "long-doc-qa") {
    plan = LongDocQa(params, b);
  } else if (workload == "serial-prefix") {
    plan = SerialPrefix(params, b);
  } else if (workload == "sustained-mixed-prefix") {
    plan = SustainedMixedPrefix(params, b);
  } else if (workload == "publish-only") {
    plan = PublishOnly(params, b);
  } else if (workload == "restore-only" || workload == "block-size-sweep") {
    plan = RestoreOnly(params, b);
  } else if (workload == "scale" || workload == "query-scale") {
    return Status::InvalidArgument("--workload " + std::string(workload) +
                                   " has no plan: RunScale / RunQueryScale drive it");
  } else {
    return Status::InvalidArgument("--workload: unknown workload '" + std::string(workload) + "'");
  }
  plan.workload = std::string(workload);
  std::set<BlockKey> keys;
  for (const Phase& ph : plan.phases) {
    for (const std::vector<BenchRequest>& reqs : ph.engines) {
      for (const BenchRequest& r : reqs) {
        keys.insert(r.keys.begin(), r.keys.end());
        plan.max_request_blocks = std::max<uint64_t>(plan.max_request_blocks, r.keys.size());
        if (ph.measured) ++plan.measured_requests;
      }
    }
  }
  plan.working_set_blocks = keys.size();
  if (plan.max_request_blocks == 0)
    return Status::InvalidArgument("no request holds a full block: raise the token counts");
  if (plan.max_request_blocks > kMaxRequestBlocks)
    return Status::InvalidArgument("requests are too long: over 65536 blocks");
  return plan;
}

}  // namespace orbitkv::bench
