// SessionTable: the Manager's sessions (one per client connection), the
// namespace interning, the group shapes every live instance of a namespace
// agrees on, and the registered instances. Acquire() is how every operation
// finds its instance and holds it open (InstanceGuard). Ids come from the
// Manager's one id sequence. Thread-safe; mu_ is a leaf lock (nothing is
// called with it held but the id sequence and Instance::Hold).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "manager/instance.h"

namespace orbitkv {

class SessionTable {
 public:
  explicit SessionTable(std::atomic<uint64_t>* next_id) : next_id_(*next_id) {}

  SessionId Open(int peer_pid) EXCLUDES(mu_);
  bool Contains(SessionId session) const EXCLUDES(mu_);
  // Forgets the session. REQUIRES: its instances were removed.
  void Close(SessionId session) EXCLUDES(mu_);
  std::vector<SessionId> Sessions() const EXCLUDES(mu_);

  // Gives `inst` (Instance::Create'd, not yet shared) its namespace id and
  // shapes and an id, and registers it. NotFound for an unknown session;
  // InvalidArgument when a group's slot sizes differ from a live instance of
  // the namespace. A namespace whose last instance left and whose new one
  // declares other slot sizes starts afresh under a new id, so objects of the
  // old shape are never served.
  Status Add(const std::shared_ptr<Instance>& inst) EXCLUDES(mu_);
  // NotFound unless `id` is registered by `session`.
  Result<std::shared_ptr<Instance>> Find(SessionId session, InstanceId id) const EXCLUDES(mu_);
  // Find, then a hold on it (Cancelled while it unregisters).
  Result<InstanceGuard> Acquire(SessionId session, InstanceId id) const EXCLUDES(mu_);
  void Remove(SessionId session, InstanceId id) EXCLUDES(mu_);
  std::vector<InstanceId> InstancesOf(SessionId session) const EXCLUDES(mu_);
  std::vector<std::shared_ptr<Instance>> Instances() const EXCLUDES(mu_);

  // Sessions with at least one registered instance (the query budget's share).
  uint32_t sessions_with_instances() const EXCLUDES(mu_);
  size_t session_count() const EXCLUDES(mu_);
  size_t instance_count() const EXCLUDES(mu_);

 private:
  // True when namespace `ns` has no live instance and `layout` gives one of
  // its known groups other slot sizes; its old shapes are forgotten then.
  bool ReshapeNamespaceLocked(uint64_t ns, const InstanceLayout& layout) REQUIRES(mu_);

  std::atomic<uint64_t>& next_id_;
  mutable Mutex mu_;
  struct Session {
    int pid = 0;
    uint32_t instances = 0;  // registered instances
  };
  std::unordered_map<SessionId, Session> sessions_ GUARDED_BY(mu_);
  uint32_t sessions_with_instances_ GUARDED_BY(mu_) = 0;
  // Interned namespaces: the name with or without a model fingerprint, and
  // the storage codec (NamespaceKey in session_table.cc).
  std::map<std::pair<recovery::NamespaceKey, std::string>, uint64_t> ns_ids_ GUARDED_BY(mu_);
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<const ObjectShape>> shapes_
      GUARDED_BY(mu_);
  std::unordered_map<InstanceId, std::shared_ptr<Instance>> instances_ GUARDED_BY(mu_);
};

}  // namespace orbitkv
