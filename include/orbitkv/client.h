// Client: an engine's handle on the Manager, over its Unix socket. The same
// operations as the cache API (orbitkv/cache_api.h). Blocking calls may run on
// many threads at once; a Restore waiting in one thread can be cancelled from
// another with CancelRestore(ticket). Errors come back as the Manager's Status.
// Host page regions are passed as memfds sealed with F_SEAL_SHRINK.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv {

struct ClientConfig {
  std::string socket_path;  // empty: $XDG_RUNTIME_DIR/orbitkv.sock or /tmp/orbitkv-$UID.sock
  std::chrono::milliseconds timeout{60000};  // per call
  std::string client_name = "orbitkv-client";
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ClientConfig& config = {});
  virtual ~Client() = default;

  virtual Result<InstanceId> RegisterInstance(const RegisterRequest& request,
                                              std::span<const int> region_fds) = 0;
  virtual Status UnregisterInstance(InstanceId instance) = 0;
  virtual Result<PublishResult> Publish(const PublishRequest& request) = 0;
  virtual Result<QueryResult> Query(const QueryRequest& request) = 0;
  // Releases what a query still holds (blocks the engine will not restore).
  virtual Status ReleaseQuery(InstanceId instance, QueryId query) = 0;
  // A ticket names a restore for CancelRestore; take one before calling Restore.
  virtual uint64_t NewTicket() = 0;
  virtual Result<RestoreResult> Restore(const RestoreRequest& request, uint64_t ticket = 0) = 0;
  // True if something not yet submitted was released.
  virtual Result<bool> CancelRestore(uint64_t ticket) = 0;
  virtual Result<uint32_t> Prepare(const PrepareRequest& request) = 0;
  virtual void Close() = 0;
};

std::string DefaultSocketPath();

}  // namespace orbitkv
