#include "manager/session_table.h"

#include "orbitkv/logging.h"

namespace orbitkv {

SessionId SessionTable::Open(int peer_pid) {
  const SessionId id = next_id_.fetch_add(1);
  MutexLock l(mu_);
  sessions_[id].pid = peer_pid;
  return id;
}

bool SessionTable::Contains(SessionId session) const {
  MutexLock l(mu_);
  return sessions_.count(session) != 0;
}

void SessionTable::Close(SessionId session) {
  MutexLock l(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  if (it->second.instances > 0) --sessions_with_instances_;
  sessions_.erase(it);
}

std::vector<SessionId> SessionTable::Sessions() const {
  MutexLock l(mu_);
  std::vector<SessionId> out;
  for (const auto& [id, s] : sessions_) out.push_back(id);
  return out;
}

bool SessionTable::ReshapeNamespaceLocked(uint64_t ns, const InstanceLayout& layout) {
  for (const auto& [id, other] : instances_) {
    if (other->ns == ns) return false;  // live shapes are fixed: checked by the caller
  }
  bool differs = false;
  for (const GroupLayout& g : layout.groups) {
    auto it = shapes_.find({ns, g.group_id});
    if (it != shapes_.end() && it->second->slot_bytes != g.slot_bytes) differs = true;
  }
  if (!differs) return false;
  std::erase_if(shapes_, [&](const auto& kv) { return kv.first.first == ns; });
  return true;
}

namespace {

// What a namespace id is interned under: the engine's namespace string with
// its model fingerprint (Instance::ns_key), and its storage codec: instances
// that differ in either never share objects.
std::pair<recovery::NamespaceKey, std::string> NamespaceKey(const Instance& inst) {
  return {inst.ns_key, inst.codec.Identity()};
}

}  // namespace

Status SessionTable::Add(const std::shared_ptr<Instance>& inst) {
  MutexLock l(mu_);
  auto session = sessions_.find(inst->session);
  if (session == sessions_.end()) return Status::NotFound("unknown session");
  auto [ns_it, fresh] = ns_ids_.emplace(NamespaceKey(*inst), 0);
  if (fresh) ns_it->second = next_id_.fetch_add(1);
  if (!fresh && ReshapeNamespaceLocked(ns_it->second, inst->layout)) {
    // Its last instance left and the new one declares other slot sizes: the
    // namespace starts afresh, so objects of the old shape are never served
    // (misses, not Corruption) and never make a publish of the new shape skip.
    OKV_LOG_INFO(
        "namespace '{}': slot sizes changed after its last instance left; objects "
        "cached under the old shape are no longer served",
        inst->ns_name);
    ns_it->second = next_id_.fetch_add(1);
  }
  inst->ns = ns_it->second;
  // Every live instance of a namespace must agree on each group's shape.
  std::vector<std::pair<uint32_t, std::shared_ptr<const ObjectShape>>> new_shapes;
  for (const GroupLayout& g : inst->layout.groups) {
    auto it = shapes_.find({inst->ns, g.group_id});
    if (it != shapes_.end()) {
      if (it->second->slot_bytes != g.slot_bytes) {
        return Status::InvalidArgument("group " + std::to_string(g.group_id) +
                                       ": slot sizes differ from another instance of namespace '" +
                                       inst->ns_name + "'");
      }
      inst->shapes[g.group_id] = it->second;
    } else {
      auto shape = std::make_shared<const ObjectShape>(MakeObjectShape(g.slot_bytes));
      inst->shapes[g.group_id] = shape;
      new_shapes.emplace_back(g.group_id, shape);
    }
  }
  for (auto& [gid, shape] : new_shapes) shapes_[{inst->ns, gid}] = shape;
  inst->id = next_id_.fetch_add(1);
  instances_[inst->id] = inst;
  if (session->second.instances++ == 0) ++sessions_with_instances_;
  return Status::OK();
}

Result<std::shared_ptr<Instance>> SessionTable::Find(SessionId session, InstanceId id) const {
  MutexLock l(mu_);
  auto it = instances_.find(id);
  if (it == instances_.end() || it->second->session != session) {
    return Status::NotFound("instance " + std::to_string(id) + " is not registered");
  }
  return it->second;
}

Result<InstanceGuard> SessionTable::Acquire(SessionId session, InstanceId id) const {
  ORBITKV_ASSIGN_OR_RETURN(std::shared_ptr<Instance> inst, Find(session, id));
  return InstanceGuard::Take(std::move(inst));
}

void SessionTable::Remove(SessionId session, InstanceId id) {
  MutexLock l(mu_);
  instances_.erase(id);
  if (auto s = sessions_.find(session);
      s != sessions_.end() && s->second.instances > 0 && --s->second.instances == 0) {
    --sessions_with_instances_;
  }
}

std::vector<InstanceId> SessionTable::InstancesOf(SessionId session) const {
  MutexLock l(mu_);
  std::vector<InstanceId> out;
  for (const auto& [id, inst] : instances_) {
    if (inst->session == session) out.push_back(id);
  }
  return out;
}

std::vector<std::shared_ptr<Instance>> SessionTable::Instances() const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<Instance>> out;
  for (const auto& [id, inst] : instances_) out.push_back(inst);
  return out;
}

uint32_t SessionTable::sessions_with_instances() const {
  MutexLock l(mu_);
  return sessions_with_instances_;
}

size_t SessionTable::session_count() const {
  MutexLock l(mu_);
  return sessions_.size();
}

size_t SessionTable::instance_count() const {
  MutexLock l(mu_);
  return instances_.size();
}

}  // namespace orbitkv
