#include "bench/engine.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "workload/hybrid.h"

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
      : o_(o), pages_(pages), backend_(backend), out_(out), block_bytes_(pages.group_bytes(0)) {}

  double Now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - o_.epoch).count();
  }

  Status Serve(const BenchRequest& r, uint32_t phase, bool measured) {
    RequestSample rs;
    rs.phase = phase;
    rs.prompt_tokens = r.prompt_tokens;
    std::vector<bool> valid(r.keys.size(), false);  // dense: blocks restored
    uint64_t valid_tokens = 0;                      // hybrid: the prefix restored
    if (r.query && r.prompt_blocks > 0) {
      rs.queried_cache = true;
      rs.queried = r.prompt_blocks;
      std::span<const BlockKey> prompt(r.keys.data(), r.prompt_blocks);
      const double q0 = Now();
      ORBITKV_ASSIGN_OR_RETURN(Backend::Lookup lookup, backend_.Query(prompt));
      rs.query_s = Now() - q0;
      ORBITKV_RETURN_IF_ERROR(CheckPlan(lookup));
      const uint64_t prefix_blocks =
          o_.model ? lookup.prefix_tokens / BlockTokens() : lookup.prefix;
      rs.missed = r.prompt_blocks - prefix_blocks;
      rs.prefix_tokens = o_.model ? lookup.prefix_tokens : prefix_blocks * o_.block_tokens;
      rs.pieces = lookup.prefix;
      rs.not_needed_bytes = lookup.not_needed_bytes;
      if (o_.verify) {
        std::vector<uint32_t> all(lookup.prefix);
        std::iota(all.begin(), all.end(), 0u);
        PoisonDests(lookup, prompt, all);
      }
      // One Restore call per source tier: DRAM first, then SSD.
      std::vector<bool> ok(lookup.prefix, false);
      for (Tier tier : {Tier::kDram, Tier::kSsd}) {
        std::vector<uint32_t> blocks;
        for (uint32_t i = 0; i < lookup.prefix; ++i)
          if (lookup.tiers[i] == tier) blocks.push_back(i);
        if (blocks.empty()) continue;
        CallSample call = RestoreCall(lookup, prompt, blocks, &rs, &ok, phase);
        call.tier = tier;
        rs.restore_s += call.end - call.start;
        o_.live->restored_bytes.fetch_add(call.bytes, std::memory_order_relaxed);
        if (measured) out_.restores.push_back(call);
      }
      if (!o_.model) {
        for (uint32_t b = 0; b < lookup.prefix; ++b) {
          if (!ok[b]) continue;
          valid[b] = true;
          (lookup.tiers[b] == Tier::kSsd ? rs.hit_ssd : rs.hit_dram)++;
        }
      } else if (std::all_of(ok.begin(), ok.end(), [](bool x) { return x; })) {
        valid_tokens = lookup.prefix_tokens;
        CountHybridHits(lookup, prompt, prefix_blocks, &rs);
      } else {
        rs.failed += prefix_blocks;  // the plan is all or nothing: recomputed
      }
      rs.restored_blocks = rs.hit_dram + rs.hit_ssd;
    }
    // "Prefill" and "decode": write what was not restored, then publish it,
    // one Publish call per group.
    ORBITKV_RETURN_IF_ERROR(PublishMissing(r, valid, valid_tokens, measured));
    o_.live->requests.fetch_add(1, std::memory_order_relaxed);
    o_.live->queried.fetch_add(rs.queried, std::memory_order_relaxed);
    o_.live->hits.fetch_add(rs.restored_blocks, std::memory_order_relaxed);
    if (measured) out_.requests.push_back(rs);
    return Status::OK();
  }

  // Restores of one-key chains of random keys this engine saw in measured
  // phases (a hybrid model's: that key's pieces of every group).
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
      ORBITKV_RETURN_IF_ERROR(CheckPlan(lookup));
      if (lookup.prefix == 0) continue;
      std::vector<uint32_t> all(lookup.prefix);
      std::iota(all.begin(), all.end(), 0u);
      if (o_.verify) PoisonDests(lookup, one, all);
      std::vector<bool> ok(lookup.prefix, false);
      RequestSample unused;
      CallSample call = RestoreCall(lookup, one, all, &unused, &ok, kProbePhase);
      if (!std::all_of(ok.begin(), ok.end(), [](bool x) { return x; })) continue;
      const bool ssd = std::any_of(lookup.tiers.begin(), lookup.tiers.end(),
                                   [](Tier t) { return t == Tier::kSsd; });
      call.tier = ssd ? Tier::kSsd : Tier::kDram;
      out_.probes.push_back(std::move(call));
    }
    return Status::OK();
  }

 private:
  static constexpr uint32_t kProbePhase = ~0u;

  // Where index i of a lookup's prefix goes: dense block i into page i of
  // group 0; a hybrid piece into the page of the chain key naming it, in its
  // own group, with content derived from that key and group.
  struct Dest {
    uint32_t group = 0;
    BlockKey content{};
    uint64_t page = 0;
    uint64_t bytes = 0;
    bool checkpoint = false;
  };

  uint64_t BlockTokens() const { return o_.model->key_block_tokens; }

  // A hybrid instance's query result is a recovery plan: one piece per
  // source, each of a group of the description.
  Status CheckPlan(const Backend::Lookup& l) const {
    if (!o_.model) return Status::OK();
    bool ok = l.pieces.size() == l.prefix && l.tiers.size() == l.prefix;
    for (const QuerySource& s : l.pieces) ok &= s.group < o_.model->groups.size();
    if (ok) return Status::OK();
    return Status::Internal("the query of a hybrid instance returned no recovery plan (" +
                            std::to_string(l.prefix) + " sources, " +
                            std::to_string(l.pieces.size()) +
                            " pieces): was the model description registered?");
  }

  Dest DestOf(const Backend::Lookup& l, std::span<const BlockKey> keys, uint32_t i) const {
    if (!o_.model) return {0, keys[i], i, block_bytes_, false};
    const QuerySource& s = l.pieces[i];
    const uint64_t k = demo::PieceKeyIndex(*o_.model, s.group, s.index);
    return {s.group, demo::PieceContentKey(keys[k], s.group), k, s.bytes,
            o_.model->groups[s.group].kind == GroupKind::kRecurrent};
  }

  // Poisons the pages that prefix indices `blocks` restore into.
  void PoisonDests(const Backend::Lookup& lookup, std::span<const BlockKey> keys,
                   const std::vector<uint32_t>& blocks) {
    std::vector<PageRef> pages;
    pages.reserve(blocks.size());
    for (uint32_t b : blocks) {
      const Dest d = DestOf(lookup, keys, b);
      pages.push_back({d.group, d.page});
    }
    pages_.PoisonMany(pages);
  }

  // One Restore call of prefix indices `blocks`, each checked; sets ok[i] for
  // every index restored byte-exact (or unchecked), counts failures and
  // mismatches into *rs and out_, and returns the call's sample (bytes: those
  // restored).
  CallSample RestoreCall(const Backend::Lookup& lookup, std::span<const BlockKey> keys,
                         const std::vector<uint32_t>& blocks, RequestSample* rs,
                         std::vector<bool>* ok, uint32_t phase) {
    std::vector<uint64_t> dst;
    for (uint32_t b : blocks) dst.push_back(DestOf(lookup, keys, b).page);
    CallSample call;
    const double cpu0 = ThreadCpu();
    call.start = Now();
    Result<std::vector<BlockResult>> res = backend_.Restore(lookup, keys, blocks, dst);
    call.end = Now();
    call.cpu = ThreadCpu() - cpu0;
    call.timeline = backend_.last_timeline();
    if (!res.ok()) {
      rs->failed += o_.model ? 0 : blocks.size();
      if (out_.first_restore_error.empty()) out_.first_restore_error = res.status().ToString();
      return call;
    }
    std::vector<const BlockResult*> restored;
    std::vector<Dest> dests;  // restored[i]'s
    for (const BlockResult& b : *res) {
      if (!b.status.ok()) {
        rs->failed += o_.model ? 0 : 1;
        if (out_.first_restore_error.empty()) out_.first_restore_error = b.status.ToString();
        continue;
      }
      const Dest d = DestOf(lookup, keys, b.block);
      ++call.blocks;
      ++out_.restored_blocks;
      if (o_.corrupt_every && out_.restored_blocks % o_.corrupt_every == 0)
        pages_.Poison(d.group, d.page);
      restored.push_back(&b);
      dests.push_back(d);
    }
    // The call's pages are checked at once, as an engine's next forward pass
    // reads them all.
    std::vector<bool> right(restored.size(), true);
    if (o_.verify && !restored.empty()) {
      std::vector<PageRef> pages;
      std::vector<BlockKey> contents;
      for (const Dest& d : dests) {
        pages.push_back({d.group, d.page});
        contents.push_back(d.content);
      }
      right = pages_.CheckMany(pages, contents);
      out_.verified_blocks += restored.size();
    }
    for (size_t i = 0; i < restored.size(); ++i) {
      const BlockResult& b = *restored[i];
      const Dest& d = dests[i];
      if (!right[i]) {
        ++rs->mismatched;
        ++out_.mismatched;
        o_.live->mismatched.fetch_add(1, std::memory_order_relaxed);
        std::fprintf(stderr,
                     "orbitkv-bench: MISMATCH engine %u %s block %u (group %u page %llu, "
                     "source %s)\n",
                     o_.index,
                     phase == kProbePhase ? "probe" : ("phase " + std::to_string(phase)).c_str(),
                     b.block, d.group, static_cast<unsigned long long>(d.page),
                     b.source == Tier::kSsd ? "ssd" : "dram");
        continue;
      }
      (*ok)[b.block] = true;
      call.bytes += d.bytes;
      rs->restored_bytes += d.bytes;
      if (d.checkpoint) rs->checkpoint_bytes += d.bytes;
    }
    return call;
  }

  // A restored hybrid prefix's blocks by tier: a block is an SSD hit when a
  // piece ending in it came from SSD; blocks no piece ends in (before a
  // window, with no full-attention group) count as the checkpoint's tier.
  void CountHybridHits(const Backend::Lookup& lookup, std::span<const BlockKey> keys,
                       uint64_t prefix_blocks, RequestSample* rs) const {
    std::vector<Tier> tier(prefix_blocks, Tier::kNone);
    Tier state = Tier::kDram;
    for (uint32_t i = 0; i < lookup.prefix; ++i) {
      const Dest d = DestOf(lookup, keys, i);
      if (d.checkpoint && lookup.tiers[i] == Tier::kSsd) state = Tier::kSsd;
      if (d.page >= prefix_blocks) continue;
      if (tier[d.page] != Tier::kSsd) tier[d.page] = lookup.tiers[i];
    }
    for (Tier t : tier)
      ((t == Tier::kNone ? state : t) == Tier::kSsd ? rs->hit_ssd : rs->hit_dram)++;
  }

  // Writes and publishes what the request did not restore: dense blocks not
  // valid; a hybrid model's pieces ending after valid_tokens, per group.
  Status PublishMissing(const BenchRequest& r, const std::vector<bool>& valid,
                        uint64_t valid_tokens, bool measured) {
    const size_t groups = o_.model ? o_.model->groups.size() : 1;
    std::vector<std::vector<BlockKey>> keys(groups);
    std::vector<std::vector<BlockKey>> contents(groups);  // what each page is filled with
    std::vector<std::vector<uint64_t>> pages(groups);
    if (!o_.model) {
      for (uint64_t i = 0; i < r.keys.size(); ++i) {
        if (valid[i]) continue;
        keys[0].push_back(r.keys[i]);
        pages[0].push_back(i);
      }
      contents[0] = keys[0];
    } else {
      for (const demo::ChainPiece& p :
           demo::ChainPieces(*o_.model, valid_tokens, r.keys.size() * BlockTokens())) {
        const BlockKey& chain_key = r.keys[p.key_index];
        keys[p.group].push_back(chain_key);
        contents[p.group].push_back(demo::PieceContentKey(chain_key, p.group));
        pages[p.group].push_back(p.key_index);
      }
    }
    // The request's pages are made at once, as a forward pass makes them.
    for (uint32_t g = 0; g < groups; ++g) pages_.FillMany(g, contents[g], pages[g]);
    for (uint32_t g = 0; g < groups; ++g) {
      if (keys[g].empty()) continue;
      const uint32_t storage_group = o_.model ? o_.model->groups[g].storage_group : 0;
      CallSample call;
      const double cpu0 = ThreadCpu();
      call.start = Now();
      ORBITKV_ASSIGN_OR_RETURN(PublishResult pr,
                               backend_.Publish(storage_group, keys[g], pages[g]));
      call.end = Now();
      call.cpu = ThreadCpu() - cpu0;
      call.blocks = pr.stored;
      call.bytes = call.blocks * (o_.model ? o_.model->groups[g].bytes : block_bytes_);
      out_.dropped += pr.dropped;
      if (measured) out_.publishes.push_back(call);
    }
    return Status::OK();
  }

  const EngineOptions& o_;
  PageTarget& pages_;
  Backend& backend_;
  EngineSamples& out_;
  const uint64_t block_bytes_;
};

Status Run(const EngineOptions& o, EngineSamples* out) {
  const uint64_t pages = std::max<uint64_t>(1, o.plan->max_request_blocks);
  ORBITKV_ASSIGN_OR_RETURN(
      std::unique_ptr<PageTarget> target,
      o.model ? CreatePageTarget(
                    o.device, demo::HybridLayout(*o.model, o.group_slot_bytes, pages, o.page_first))
              : CreatePageTarget(o.device, pages, o.slot_bytes, o.page_first));
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
