// Manager::Query, ReleaseQuery, Prepare and ClearNamespace (DESIGN.md "Query",
// "prepare"): metadata-only lookups that take sources (QueryTable), warm-up
// reads of SSD objects into DRAM through the io_uring readers
// (UringRoute::Prepare), and dropping a namespace's objects from both tiers.
#include <algorithm>

#include "manager/manager_impl.h"
#include "orbitkv/logging.h"

namespace orbitkv {
namespace {

Status CheckGroup(const Instance& inst, uint32_t group) {
  if (inst.groups.count(group)) return Status::OK();
  return Status::InvalidArgument("group " + std::to_string(group) +
                                 " is not in this instance's layout");
}

}  // namespace

Result<QueryResult> Manager::Query(SessionId session, const QueryRequest& req) {
  Impl& x = *impl_;
  const Clock::TimePoint start = x.config.clock->Now();
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, x.sessions->Acquire(session, req.instance));
  if (!inst->hybrid()) ORBITKV_RETURN_IF_ERROR(CheckGroup(*inst, req.group_id));
  const uint32_t max_ttl = x.config.options.max_query_ttl_ms;
  if (req.ttl_ms == 0 || req.ttl_ms > max_ttl) {
    return Status::InvalidArgument("query ttl_ms " + std::to_string(req.ttl_ms) +
                                   " is outside (0, " + std::to_string(max_ttl) +
                                   "] (the Manager's --max-query-ttl-ms)");
  }
  QueryTable::Lookup lookup;
  lookup.session = session;
  lookup.instance = req.instance;
  lookup.ns = inst->ns;
  lookup.group = req.group_id;
  lookup.keys = req.keys;
  lookup.deadline = start + std::chrono::milliseconds(req.ttl_ms);
  lookup.sessions_with_instances = x.sessions->sessions_with_instances();
  QueryResult res;
  if (inst->hybrid()) {
    // The plan spans every group of the description (recovery_plan.h).
    ORBITKV_ASSIGN_OR_RETURN(res, x.queries->OpenPlanned(lookup, *inst->model, inst->masks));
  } else {
    res = x.queries->Open(lookup);
  }
  x.m.query_seconds->Observe(ToSeconds(x.config.clock->Now() - start));
  return res;
}

Status Manager::ReleaseQuery(SessionId session, QueryId query) {
  return impl_->queries->Release(session, query);
}

Result<uint32_t> Manager::Prepare(SessionId session, const PrepareRequest& req) {
  Impl& x = *impl_;
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, x.sessions->Acquire(session, req.instance));
  ORBITKV_RETURN_IF_ERROR(CheckGroup(*inst, req.group_id));
  if (!x.ssd) return 0u;
  std::vector<QueryBlock> blocks;
  const Clock::TimePoint deadline = x.config.clock->Now() + std::chrono::seconds(30);
  for (const BlockKey& k : req.keys) {
    QueryBlock b;
    b.id = inst->Object(req.group_id, k);
    if (x.dram->Contains(b.id)) continue;
    std::optional<ExtentRef> ref = x.ssd->catalog().Lookup(StoreKey(b.id));
    if (!ref) continue;
    Result<LeaseId> lease = x.ssd->catalog().AcquireLease({&*ref, 1}, {session, 1, deadline});
    if (!lease.ok()) continue;
    b.tier = Tier::kSsd;
    b.ref = *ref;
    b.lease = *lease;
    b.size = ref->object_size;
    blocks.push_back(b);
  }
  const uint32_t n = static_cast<uint32_t>(blocks.size());
  if (n == 0) return 0u;
  if (!x.uring->Prepare(std::move(blocks), inst->shapes.at(req.group_id)->slot_bytes)) return 0u;
  return n;
}

Result<ClearNamespaceResult> Manager::ClearNamespace(SessionId session,
                                                     const ClearNamespaceRequest& req) {
  Impl& x = *impl_;
  ORBITKV_ASSIGN_OR_RETURN(InstanceGuard inst, x.sessions->Acquire(session, req.instance));
  ClearNamespaceResult out;
  out.dram_objects = x.dram->EraseNamespace(inst->ns);
  if (x.ssd) out.ssd_objects = x.ssd->catalog().DropTag(inst->ns);
  OKV_LOG_INFO("namespace '{}' cleared by instance {}: {} DRAM and {} SSD objects dropped",
               inst->ns_name, req.instance, out.dram_objects, out.ssd_objects);
  return out;
}

}  // namespace orbitkv
