// QueryTable: the live queries and what they hold (DRAM pins and SSD leases,
// QueryBlock), the query byte budget and each session's charge against it,
// query expiry, and the registry of restores in flight. Lookup() walks a key
// chain and takes its sources under the budget; Take() moves validated blocks
// of a query into a restore. Thread-safe; mu_ is taken after SessionTable's
// (never while holding it) and before the DRAM pool's and the catalog's locks,
// which Lookup and the releases call with mu_ held.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "manager/sources.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/clock.h"
#include "orbitkv/metrics.h"
#include "orbitkv/model_description.h"
#include "store/dram_cache.h"
#include "store/ssd_store.h"

namespace orbitkv {

class RestoreRec;

struct QueryMetrics {
  Counter *hits_dram = nullptr, *hits_ssd = nullptr, *misses = nullptr;
  Counter *budget_cuts_manager = nullptr, *budget_cuts_session = nullptr;
  Counter* expired = nullptr;
};

class QueryTable {
 public:
  // `ssd` may be null (no SSD tier). `budget`: the Manager-wide query budget.
  QueryTable(std::atomic<uint64_t>* next_id, uint64_t budget, DramCache* dram, SsdStore* ssd,
             QueryMetrics metrics)
      : next_id_(*next_id), budget_(budget), dram_(dram), ssd_(ssd), m_(metrics) {}

  struct Lookup {
    SessionId session = 0;
    InstanceId instance = 0;
    uint64_t ns = 0;
    uint32_t group = 0;
    std::span<const BlockKey> keys;
    Clock::TimePoint deadline;
    // Sessions with instances: a session may hold at most budget / this.
    uint32_t sessions_with_instances = 1;
  };
  // Takes the longest prefix of keys found (DRAM pinned, else SSD leased
  // until the deadline) within the budget and the session's share of it, and
  // keeps it as a query (none when the prefix is empty).
  QueryResult Open(const Lookup& lookup) EXCLUDES(mu_);
  // A hybrid instance's query (query_table_plan.cc): compiles the recovery plan
  // of `lookup.keys` for `model` (recovery::CompileRecoveryPlan) under what the
  // session may still charge, with an oracle that pins each piece it asks
  // about in DRAM (preferred) or leases it on SSD, so what the plan counts on
  // cannot leave in between; then keeps exactly the plan's sources as the
  // query (charged their description bytes) and releases the rest. Pieces are
  // objects ObjectId{ns, storage_group, ObjectKey(chain key, masks[group])}.
  // `lookup.group` is not used. InvalidArgument for a chain the planner refuses.
  Result<QueryResult> OpenPlanned(const Lookup& lookup, const ModelDescription& model,
                                  std::span<const BlockKey> masks) EXCLUDES(mu_);
  // Releases the query's remaining sources. NotFound unless live for `session`.
  Status Release(SessionId session, QueryId query) EXCLUDES(mu_);

  struct Taken {
    uint32_t group = 0;
    std::vector<RestoreBlock> dram, ssd;
  };
  // Validates `blocks` of a live query of (session, instance) and moves them
  // into `restore`, which is registered under a new id (restore->id). SSD
  // leases then live until their read, not the TTL. Errors leave the query as it was.
  Result<Taken> Take(SessionId session, InstanceId instance, QueryId query,
                     std::span<const uint32_t> blocks, std::span<const uint64_t> pages,
                     const std::shared_ptr<RestoreRec>& restore) EXCLUDES(mu_);

  // Releases every query of the session (or instance) and forgets the session's charge.
  void DropSession(SessionId session) EXCLUDES(mu_);
  void DropInstance(InstanceId instance) EXCLUDES(mu_);
  // Releases the queries whose deadline passed; counts them.
  void Expire(Clock::TimePoint now) EXCLUDES(mu_);

  // The restore registry.
  std::shared_ptr<RestoreRec> FindRestore(SessionId session, RestoreId id) const EXCLUDES(mu_);
  std::vector<RestoreId> RestoresOf(SessionId session) const EXCLUDES(mu_);
  void ForgetRestore(RestoreId id) EXCLUDES(mu_);

  struct Stats {
    size_t queries = 0, restores = 0;
    uint64_t budget_used = 0;
  };
  Stats stats() const EXCLUDES(mu_);

 private:
  struct QueryRec {
    SessionId session = 0;
    InstanceId instance = 0;
    uint32_t group = 0;
    Clock::TimePoint deadline;
    std::vector<QueryBlock> blocks;
  };
  // Releases a block's source (pin or lease). REQUIRES: !b.taken.
  void ReleaseSource(QueryBlock& b);
  // Pins `b.id` in DRAM, else leases it on SSD until `deadline`; its tier
  // (kNone: absent, nothing held).
  Tier HoldSource(QueryBlock& b, SessionId session, Clock::TimePoint deadline);
  // Block i of q leaves the query (restored or released): its key's charge is
  // credited with the last occurrence.
  void UnchargeLocked(QueryRec& q, size_t i) REQUIRES(mu_);
  // The same, but the session's charge is left to the caller: returns what
  // it must credit there (0 unless this was the key's last holder).
  uint64_t CreditLocked(QueryRec& q, size_t i) REQUIRES(mu_);
  // Releases every untaken block (the caller forgets the query).
  void DropQueryLocked(QueryRec& q) REQUIRES(mu_);
  template <typename Pred>
  void DropIfLocked(Pred pred) REQUIRES(mu_);

  std::atomic<uint64_t>& next_id_;
  const uint64_t budget_;
  DramCache* const dram_;
  SsdStore* const ssd_;
  const QueryMetrics m_;

  mutable Mutex mu_;
  std::unordered_map<QueryId, QueryRec> queries_ GUARDED_BY(mu_);
  std::unordered_map<RestoreId, std::weak_ptr<RestoreRec>> restores_ GUARDED_BY(mu_);
  uint64_t budget_used_ GUARDED_BY(mu_) = 0;
  std::unordered_map<SessionId, uint64_t> charged_ GUARDED_BY(mu_);  // per session
};

}  // namespace orbitkv
