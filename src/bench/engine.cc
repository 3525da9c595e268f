#include "bench/engine.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

namespace orbitkv::bench {
namespace {

double ThreadCpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

class EngineRun {
 public:
  EngineRun(const EngineOptions& o, PageTarget& pages, Backend& backend, EngineSamples& out)
      : o_(o), pages_(pages), backend_(backend), out_(out), block_bytes_(pages.block_bytes()) {}

  double Now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - o_.epoch).count();
  }

  Status Serve(const BenchRequest& r, uint32_t phase, bool measured) {
    RequestSample rs;
    rs.phase = phase;
    rs.prompt_tokens = r.prompt_tokens;
    std::vector<bool> valid(r.keys.size(), false);
    if (r.query && r.prompt_blocks > 0) {
      rs.queried_cache = true;
      rs.queried = r.prompt_blocks;
      std::span<const BlockKey> prompt(r.keys.data(), r.prompt_blocks);
      const double q0 = Now();
      ORBITKV_ASSIGN_OR_RETURN(Backend::Lookup lookup, backend_.Query(prompt));
      rs.query_s = Now() - q0;
      rs.missed = r.prompt_blocks - lookup.prefix;
      if (o_.verify)
        for (uint32_t p = 0; p < lookup.prefix; ++p) pages_.Poison(p);
      // One Restore call per source tier: DRAM first, then SSD.
      for (Tier tier : {Tier::kDram, Tier::kSsd}) {
        std::vector<uint32_t> blocks;
        std::vector<uint64_t> dst;
        for (uint32_t b = 0; b < lookup.prefix; ++b) {
          if (lookup.tiers[b] == tier) {
            blocks.push_back(b);
            dst.push_back(b);
          }
        }
        if (blocks.empty()) continue;
        CallSample call;
        call.tier = tier;
        const double cpu0 = ThreadCpu();
        call.start = Now();
        Result<std::vector<BlockResult>> res = backend_.Restore(lookup, prompt, blocks, dst);
        call.end = Now();
        call.cpu = ThreadCpu() - cpu0;
        call.timeline = backend_.last_timeline();
        rs.restore_s += call.end - call.start;
        if (!res.ok()) {
          rs.failed += blocks.size();
          if (out_.first_restore_error.empty()) out_.first_restore_error = res.status().ToString();
          continue;
        }
        for (const BlockResult& b : *res) {
          if (!b.status.ok()) {
            ++rs.failed;
            if (out_.first_restore_error.empty()) out_.first_restore_error = b.status.ToString();
            continue;
          }
          ++call.blocks;
          ++out_.restored_blocks;
          if (o_.corrupt_every && out_.restored_blocks % o_.corrupt_every == 0)
            pages_.Poison(b.block);
          if (o_.verify) {
            ++out_.verified_blocks;
            if (!pages_.Check(r.keys[b.block], b.block)) {
              ++rs.mismatched;
              ++out_.mismatched;
              o_.live->mismatched.fetch_add(1, std::memory_order_relaxed);
              std::fprintf(stderr,
                           "orbitkv-bench: MISMATCH engine %u phase %u block %u (source %s)\n",
                           o_.index, phase, b.block, b.source == Tier::kSsd ? "ssd" : "dram");
              continue;
            }
          }
          valid[b.block] = true;
          (b.source == Tier::kSsd ? rs.hit_ssd : rs.hit_dram)++;
        }
        call.bytes = call.blocks * block_bytes_;
        o_.live->restored_bytes.fetch_add(call.bytes, std::memory_order_relaxed);
        if (measured) out_.restores.push_back(call);
      }
      rs.restored_blocks = rs.hit_dram + rs.hit_ssd;
    }
    // "Prefill" and "decode": write what was not restored, then publish it.
    std::vector<BlockKey> keys;
    std::vector<uint64_t> pages;
    for (uint64_t i = 0; i < r.keys.size(); ++i) {
      if (valid[i]) continue;
      pages_.Fill(r.keys[i], i);
      keys.push_back(r.keys[i]);
      pages.push_back(i);
    }
    if (!keys.empty()) {
      CallSample call;
      const double cpu0 = ThreadCpu();
      call.start = Now();
      ORBITKV_ASSIGN_OR_RETURN(PublishResult pr, backend_.Publish(keys, pages));
      call.end = Now();
      call.cpu = ThreadCpu() - cpu0;
      call.blocks = pr.stored;
      call.bytes = call.blocks * block_bytes_;
      out_.dropped += pr.dropped;
      if (measured) out_.publishes.push_back(call);
    }
    o_.live->requests.fetch_add(1, std::memory_order_relaxed);
    o_.live->queried.fetch_add(rs.queried, std::memory_order_relaxed);
    o_.live->hits.fetch_add(rs.restored_blocks, std::memory_order_relaxed);
    if (measured) out_.requests.push_back(rs);
    return Status::OK();
  }

  // Single-block restores of random keys this engine saw in measured phases.
  Status Probe() {
    std::set<BlockKey> seen;
    for (const Phase& ph : o_.plan->phases) {
      if (!ph.measured) continue;
      for (const BenchRequest& r : ph.engines[o_.index]) seen.insert(r.keys.begin(), r.keys.end());
    }
    if (seen.empty()) return Status::OK();
    std::vector<BlockKey> keys(seen.begin(), seen.end());
    std::mt19937_64 rng(o_.seed * 7919 + o_.index);
    for (uint32_t i = 0; i < o_.probes; ++i) {
      const BlockKey& key = keys[rng() % keys.size()];
      std::span<const BlockKey> one(&key, 1);
      std::unique_lock<std::mutex> alone;
      if (o_.probe_mu != nullptr) alone = std::unique_lock<std::mutex>(*o_.probe_mu);
      ORBITKV_ASSIGN_OR_RETURN(Backend::Lookup lookup, backend_.Query(one));
      if (lookup.prefix == 0) continue;
      if (o_.verify) pages_.Poison(0);
      const uint32_t block = 0;
      const uint64_t page = 0;
      CallSample call;
      call.start = Now();
      Result<std::vector<BlockResult>> res = backend_.Restore(lookup, one, {&block, 1}, {&page, 1});
      call.end = Now();
      call.timeline = backend_.last_timeline();
      if (!res.ok() || res->empty() || !(*res)[0].status.ok()) continue;
      ++out_.restored_blocks;
      if (o_.verify) {
        ++out_.verified_blocks;
        if (!pages_.Check(key, 0)) {
          ++out_.mismatched;
          o_.live->mismatched.fetch_add(1, std::memory_order_relaxed);
          std::fprintf(stderr, "orbitkv-bench: MISMATCH engine %u probe %u\n", o_.index, i);
          continue;
        }
      }
      call.tier = (*res)[0].source;
      call.blocks = 1;
      call.bytes = block_bytes_;
      out_.probes.push_back(std::move(call));
    }
    return Status::OK();
  }

 private:
  const EngineOptions& o_;
  PageTarget& pages_;
  Backend& backend_;
  EngineSamples& out_;
  const uint64_t block_bytes_;
};

Status Run(const EngineOptions& o, EngineSamples* out) {
  const uint64_t pages = std::max<uint64_t>(1, o.plan->max_request_blocks);
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<PageTarget> target,
                           CreatePageTarget(o.device, pages, o.slot_bytes, o.page_first));
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, o.connect(*target));
  EngineRun run(o, *target, *backend, *out);
  const size_t phases = o.plan->phases.size();
  for (size_t k = 0; k < phases; ++k) {
    if (!o.gate->WaitOpen(k)) return backend->Close();
    const Phase& ph = o.plan->phases[k];
    for (const BenchRequest& r : ph.engines[o.index]) {
      if (o.gate->aborted()) return backend->Close();
      ORBITKV_RETURN_IF_ERROR(
          run.Serve(r, static_cast<uint32_t>(k), ph.measured).WithContext("phase " + ph.name));
    }
    o.gate->Done(k);
  }
  if (!o.gate->WaitOpen(phases)) return backend->Close();
  ORBITKV_RETURN_IF_ERROR(run.Probe().WithContext("latency probes"));
  o.gate->Done(phases);
  return backend->Close();
}

}  // namespace

Status RunEngine(const EngineOptions& options, EngineSamples* out) {
  Status st = Run(options, out);
  if (!st.ok()) {
    st = st.WithContext("engine " + std::to_string(options.index));
    options.gate->Abort(st.ToString());
  }
  return st;
}

}  // namespace orbitkv::bench
