// QueryTable::OpenPlanned: the query of a hybrid instance. Kept apart from the
// dense walk (query_table.cc) so that path stays as it is.
#include <algorithm>
#include <functional>
#include <map>

#include "manager/query_table.h"
#include "recovery/object_keys.h"
#include "recovery/recovery_plan.h"

namespace orbitkv {
namespace {

// Asks the DRAM pool and the SSD catalog about each piece once and holds what
// it finds (QueryTable::HoldSource), keyed by (group, index).
class HoldingOracle final : public recovery::PresenceOracle {
 public:
  using HoldFn = std::function<Tier(QueryBlock&)>;
  HoldingOracle(const ModelDescription& d, std::span<const BlockKey> keys,
                std::span<const BlockKey> masks, uint64_t ns, HoldFn hold)
      : d_(d), keys_(keys), masks_(masks), ns_(ns), hold_(std::move(hold)) {}

  Tier Block(uint32_t group, uint64_t block) override {
    return Ask(group, block, recovery::BlockKeyIndex(d_, d_.groups[group], block));
  }
  Tier Checkpoint(uint32_t group, uint64_t position) override {
    return Ask(group, position, recovery::CheckpointKeyIndex(d_, position));
  }
  // What was held for piece (group, index); the caller takes it or releases it.
  std::map<std::pair<uint32_t, uint64_t>, QueryBlock>& held() { return held_; }

 private:
  Tier Ask(uint32_t group, uint64_t index, uint64_t key_index) {
    QueryBlock b;
    b.id = ObjectId{ns_, d_.groups[group].storage_group,
                    ToKey(recovery::ObjectKey(keys_[key_index], masks_[group]))};
    const Tier t = hold_(b);
    if (t != Tier::kNone) held_.emplace(std::make_pair(group, index), b);
    return t;
  }

  const ModelDescription& d_;
  std::span<const BlockKey> keys_, masks_;
  const uint64_t ns_;
  HoldFn hold_;
  std::map<std::pair<uint32_t, uint64_t>, QueryBlock> held_;
};

}  // namespace

Tier QueryTable::HoldSource(QueryBlock& b, SessionId session, Clock::TimePoint deadline) {
  // A probe: the planner may not keep it; the plan's pieces count as used below.
  if (std::optional<DramView> v = dram_->Pin(b.id, DramCache::PinUse::kProbe)) {
    b.tier = Tier::kDram;
    b.dram = *v;
    b.size = v->size;
    return b.tier;
  }
  if (!ssd_) return Tier::kNone;
  std::optional<SsdCatalog::Leased> l =
      ssd_->catalog().LookupAndLease(StoreKey(b.id), {session, 1, deadline});
  if (!l) return Tier::kNone;
  b.tier = Tier::kSsd;
  b.ref = l->ref;
  b.lease = l->lease;
  b.size = l->ref.object_size;
  return b.tier;
}

Result<QueryResult> QueryTable::OpenPlanned(const Lookup& in, const ModelDescription& d,
                                            std::span<const BlockKey> masks) {
  MutexLock l(mu_);
  uint64_t& session_charged = charged_[in.session];
  // What this session may still charge: the Manager-wide budget left, and its
  // share of it when that is smaller.
  const uint64_t share = budget_ / std::max<uint32_t>(1, in.sessions_with_instances);
  const uint64_t manager_left = budget_used_ < budget_ ? budget_ - budget_used_ : 0;
  const uint64_t session_left =
      share < budget_ ? (session_charged < share ? share - session_charged : 0) : manager_left;
  const uint64_t max_bytes = std::min(manager_left, session_left);
  auto hold = [&](QueryBlock& b) { return HoldSource(b, in.session, in.deadline); };

  uint64_t chain = in.keys.size();
  recovery::RecoveryPlan plan;
  std::map<std::pair<uint32_t, uint64_t>, QueryBlock> held;
  for (;;) {
    HoldingOracle oracle(d, in.keys, masks, in.ns, hold);
    Result<recovery::RecoveryPlan> compiled =
        recovery::CompileRecoveryPlan(d, chain, oracle, max_bytes);
    if (!compiled.ok()) {
      for (auto& [k, b] : oracle.held()) ReleaseSource(b);
      return compiled.status();
    }
    plan = std::move(compiled).value();
    held = std::move(oracle.held());
    if (plan.sources.size() <= kMaxQuerySources || chain == 0) break;
    // Too many sources for one reply: plan over a proportionally shorter chain.
    for (auto& [k, b] : held) ReleaseSource(b);
    chain = std::min(chain - 1, chain * kMaxQuerySources / plan.sources.size());
  }

  QueryRec q;
  q.session = in.session;
  q.instance = in.instance;
  q.deadline = in.deadline;
  QueryResult res;
  std::unordered_map<Key, uint32_t, KeyHash> first;  // object key -> its first source
  for (const recovery::PlanSource& s : plan.sources) {
    auto it = held.find({s.group, s.index});
    QueryBlock b = it->second;  // the oracle held every source the plan names
    held.erase(it);
    const uint32_t index = static_cast<uint32_t>(q.blocks.size());
    auto [dup, fresh] = first.emplace(b.id.key, index);
    if (fresh) {
      b.charge = s.bytes;
      budget_used_ += s.bytes;
      session_charged += s.bytes;
      res.logical_bytes += s.bytes;
    }
    b.charge_owner = dup->second;  // a repeated object rides on its first charge
    ++(fresh ? b : q.blocks[dup->second]).holders;
    q.blocks.push_back(b);
    res.pieces.push_back({s.group, d.groups[s.group].storage_group, s.index, b.tier, s.bytes});
    res.sources.push_back(b.tier);
    (b.tier == Tier::kDram ? m_.hits_dram : m_.hits_ssd)->Inc();
  }
  for (auto& [k, b] : held) ReleaseSource(b);  // asked, but not part of the plan
  std::vector<EntryId> used;
  for (const QueryBlock& b : q.blocks) {
    if (b.tier == Tier::kDram) used.push_back(b.dram.id);
  }
  if (!used.empty()) dram_->NoteUse(used);
  res.prefix = static_cast<uint32_t>(q.blocks.size());
  res.prefix_tokens = plan.prefix_tokens;
  res.not_needed_bytes = plan.not_needed_bytes;
  res.budget_limited = plan.budget_limited;
  if (plan.budget_limited) {
    (session_left < manager_left ? m_.budget_cuts_session : m_.budget_cuts_manager)->Inc();
  } else {
    m_.misses->Inc(in.keys.size() - plan.prefix_keys);
  }
  if (!q.blocks.empty()) {
    res.query = next_id_.fetch_add(1);
    queries_.emplace(res.query, std::move(q));
  }
  return res;
}

}  // namespace orbitkv
