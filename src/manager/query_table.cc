#include "manager/query_table.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "manager/restore.h"

namespace orbitkv {

namespace {

// The index of each key's first occurrence in one query: open addressing over
// a power-of-two table of at least twice the keys, one allocation per query.
// A slot keeps 32 bits of the key's hash, so a probe past another key reads
// neither that key nor the others.
class FirstOccurrence {
 public:
  FirstOccurrence(std::span<const BlockKey> keys) : keys_(keys) {
    while ((size_t{1} << bits_) < 2 * keys.size()) ++bits_;
    slots_.assign(size_t{1} << bits_, Slot{});
  }
  // The first occurrence of keys[i] among those added; adds i if none.
  uint32_t FindOrAdd(uint32_t i) {
    const BlockKey& key = keys_[i];
    const size_t mask = slots_.size() - 1;
    const uint64_t h = KeyHash{}(ToKey(key)) * 0x9E3779B97F4A7C15ull;
    const uint32_t tag = static_cast<uint32_t>(h);
    for (size_t s = h >> (64 - bits_);; s = (s + 1) & mask) {
      Slot& slot = slots_[s];
      if (slot.index == 0) {
        slot = Slot{i + 1, tag};
        return i;
      }
      if (slot.tag == tag && keys_[slot.index - 1] == key) return slot.index - 1;
    }
  }

 private:
  struct Slot {
    uint32_t index = 0;  // index + 1; 0: empty
    uint32_t tag = 0;    // low bits of the mixed hash
  };
  std::span<const BlockKey> keys_;  // of one namespace and group: keys decide
  unsigned bits_ = 4;
  std::vector<Slot> slots_;
};

}  // namespace

QueryResult QueryTable::Open(const Lookup& in) {
  const size_t n = in.keys.size();
  FirstOccurrence first(in.keys);
  QueryRec q;
  q.session = in.session;
  q.instance = in.instance;
  q.group = in.group;
  q.deadline = in.deadline;
  q.blocks.reserve(n);
  uint64_t charged = 0, hits_dram = 0;
  MutexLock l(mu_);
  uint64_t& session_charged = charged_[in.session];
  const uint64_t share = budget_ / std::max<uint32_t>(1, in.sessions_with_instances);
  Counter* cut = nullptr;  // the limit that ended the prefix, if one did
  // Admits q.blocks.back(), the source of key q.blocks.size() - 1, unless its
  // bytes are over the Manager-wide budget or this session's share: then the
  // prefix ends there (the reply says so; it is not a miss), and the caller
  // releases the block and pops it.
  auto admit = [&]() {
    mu_.AssertHeld();
    QueryBlock& b = q.blocks.back();
    const uint32_t index = static_cast<uint32_t>(q.blocks.size() - 1);
    const uint32_t owner = first.FindOrAdd(index);
    if (owner == index) {
      if (share < budget_ && session_charged + b.size > share) cut = m_.budget_cuts_session;
      if (!cut && budget_used_ + b.size > budget_) cut = m_.budget_cuts_manager;
      if (cut) return false;
      b.charge = b.size;
      budget_used_ += b.size;
      session_charged += b.size;
      charged += b.size;
    }
    b.charge_owner = owner;  // a repeated key rides on its first charge
    ++(owner == index ? b : q.blocks[owner]).holders;
    return true;
  };
  while (q.blocks.size() < n && !cut) {
    // A run of DRAM blocks under one pool lock, then at most one SSD block.
    const size_t at = q.blocks.size();
    hits_dram +=
        dram_->PinRun(in.ns, in.group, in.keys.subspan(at), [&](size_t j, const DramView& v) {
          // Built in place: a chain's blocks are most of a query's bytes.
          QueryBlock& b = q.blocks.emplace_back();
          b.id = ObjectId{in.ns, in.group, ToKey(in.keys[at + j])};
          b.tier = Tier::kDram;
          b.dram = v;
          b.size = v.size;
          if (admit()) return true;
          q.blocks.pop_back();
          return false;  // PinRun unpins it
        });
    const size_t i = q.blocks.size();
    if (cut || i == n || !ssd_) break;
    const ObjectId id{in.ns, in.group, ToKey(in.keys[i])};
    std::optional<SsdCatalog::Leased> leased =
        ssd_->catalog().LookupAndLease(StoreKey(id), LeaseSpec{in.session, 1, in.deadline});
    if (!leased) break;
    QueryBlock& b = q.blocks.emplace_back();
    b.id = id;
    b.tier = Tier::kSsd;
    b.ref = leased->ref;
    b.lease = leased->lease;
    b.size = leased->ref.object_size;
    if (!admit()) {
      ReleaseSource(b);
      q.blocks.pop_back();
    }
  }
  QueryResult res;
  res.prefix = static_cast<uint32_t>(q.blocks.size());
  res.logical_bytes = charged;
  res.budget_limited = cut != nullptr;
  res.sources.reserve(q.blocks.size());
  for (const QueryBlock& b : q.blocks) res.sources.push_back(b.tier);
  m_.hits_dram->Inc(hits_dram);
  m_.hits_ssd->Inc(q.blocks.size() - hits_dram);
  if (cut) {
    cut->Inc();
  } else {
    m_.misses->Inc(n - q.blocks.size());
  }
  if (!q.blocks.empty()) {
    res.query = next_id_.fetch_add(1);
    queries_.emplace(res.query, std::move(q));
  }
  return res;
}

Status QueryTable::Release(SessionId session, QueryId query) {
  MutexLock l(mu_);
  auto it = queries_.find(query);
  if (it == queries_.end() || it->second.session != session) {
    return Status::NotFound("query " + std::to_string(query) + " is not live");
  }
  DropQueryLocked(it->second);
  queries_.erase(it);
  return Status::OK();
}

Result<QueryTable::Taken> QueryTable::Take(SessionId session, InstanceId instance, QueryId query,
                                           std::span<const uint32_t> blocks,
                                           std::span<const uint64_t> pages,
                                           const std::shared_ptr<RestoreRec>& r) {
  MutexLock l(mu_);
  auto it = queries_.find(query);
  if (it == queries_.end() || it->second.session != session || it->second.instance != instance) {
    return Status::NotFound("query " + std::to_string(query) +
                            " is not live for this instance (expired or released)");
  }
  QueryRec& q = it->second;
  // One pass, linear in the call (a 128k-token prefix restores 8192 blocks
  // at once, and this runs under mu_, which every query takes).
  std::vector<bool> named(q.blocks.size());
  for (uint32_t b : blocks) {
    if (b >= q.blocks.size()) {
      return Status::InvalidArgument("restore: block " + std::to_string(b) +
                                     " is beyond the query's prefix of " +
                                     std::to_string(q.blocks.size()));
    }
    if (q.blocks[b].taken) {
      return Status::InvalidArgument("restore: block " + std::to_string(b) +
                                     " was already restored or released");
    }
    if (named[b]) {
      return Status::InvalidArgument("restore: block " + std::to_string(b) + " given twice");
    }
    named[b] = true;
  }
  // Validated: take the blocks out of the query.
  Taken out;
  out.group = q.group;
  r->id = next_id_.fetch_add(1);
  r->Init(std::vector<uint32_t>(blocks.begin(), blocks.end()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    QueryBlock& src = q.blocks[blocks[i]];
    RestoreBlock rb;
    rb.result = i;
    rb.src = src;
    rb.page = pages[i];
    src.taken = true;
    UnchargeLocked(q, blocks[i]);
    if (src.tier == Tier::kSsd) {
      // The restore owns the lease now: it lives until the read, not the TTL.
      ssd_->catalog().KeepUntilDone(src.lease).IgnoreError(
          "an expired lease fails its block at submission");
    }
    (src.tier == Tier::kDram ? out.dram : out.ssd).push_back(rb);
  }
  if (std::all_of(q.blocks.begin(), q.blocks.end(), [](auto& b) { return b.taken; })) {
    queries_.erase(it);
  }
  restores_[r->id] = r;
  return out;
}

void QueryTable::ReleaseSource(QueryBlock& b) {
  if (b.tier == Tier::kDram) dram_->Unpin(b.dram.id);
  if (b.tier == Tier::kSsd) ssd_->catalog().Cancel(b.lease);
  b.taken = true;
}

uint64_t QueryTable::CreditLocked(QueryRec& q, size_t i) {
  QueryBlock& owner = q.blocks[q.blocks[i].charge_owner];
  if (--owner.holders != 0 || owner.charge == 0) return 0;
  budget_used_ -= owner.charge;
  return std::exchange(owner.charge, 0);
}

void QueryTable::UnchargeLocked(QueryRec& q, size_t i) {
  if (const uint64_t credit = CreditLocked(q, i)) charged_[q.session] -= credit;
}

void QueryTable::DropQueryLocked(QueryRec& q) {
  // One pool lock and one catalog lock for the whole query.
  std::vector<EntryId> pins;
  std::vector<LeaseId> leases;
  pins.reserve(q.blocks.size());
  uint64_t credit = 0;  // the session's, credited once
  for (size_t i = 0; i < q.blocks.size(); ++i) {
    QueryBlock& b = q.blocks[i];
    if (b.taken) continue;
    credit += CreditLocked(q, i);
    if (b.tier == Tier::kDram) pins.push_back(b.dram.id);
    if (b.tier == Tier::kSsd) leases.push_back(b.lease);
    b.taken = true;
  }
  if (credit != 0) charged_[q.session] -= credit;
  if (!pins.empty()) dram_->UnpinMany(pins);
  if (!leases.empty()) ssd_->catalog().CancelMany(leases);
}

template <typename Pred>
void QueryTable::DropIfLocked(Pred pred) {
  for (auto it = queries_.begin(); it != queries_.end();) {
    if (pred(it->second)) {
      DropQueryLocked(it->second);
      it = queries_.erase(it);
    } else {
      ++it;
    }
  }
}

void QueryTable::DropSession(SessionId session) {
  MutexLock l(mu_);
  DropIfLocked([&](const QueryRec& q) { return q.session == session; });
  charged_.erase(session);
}

void QueryTable::DropInstance(InstanceId instance) {
  MutexLock l(mu_);
  DropIfLocked([&](const QueryRec& q) { return q.instance == instance; });
}

void QueryTable::Expire(Clock::TimePoint now) {
  MutexLock l(mu_);
  DropIfLocked([&](const QueryRec& q) {
    if (q.deadline > now) return false;
    m_.expired->Inc();
    return true;
  });
}

std::shared_ptr<RestoreRec> QueryTable::FindRestore(SessionId session, RestoreId id) const {
  MutexLock l(mu_);
  auto it = restores_.find(id);
  if (it == restores_.end()) return nullptr;
  std::shared_ptr<RestoreRec> r = it->second.lock();
  return r && r->session == session ? r : nullptr;
}

std::vector<RestoreId> QueryTable::RestoresOf(SessionId session) const {
  MutexLock l(mu_);
  std::vector<RestoreId> out;
  for (const auto& [id, weak] : restores_) {
    if (auto r = weak.lock(); r && r->session == session) out.push_back(id);
  }
  return out;
}

void QueryTable::ForgetRestore(RestoreId id) {
  MutexLock l(mu_);
  restores_.erase(id);
}

QueryTable::Stats QueryTable::stats() const {
  MutexLock l(mu_);
  return {queries_.size(), restores_.size(), budget_used_};
}

}  // namespace orbitkv
