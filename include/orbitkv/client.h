// Client: an engine's handle on the Manager, over its Unix socket. The same
// operations as the cache API (orbitkv/cache_api.h). Blocking calls may run on
// many threads at once; a Restore waiting in one thread can be cancelled from
// another with CancelRestore(ticket). Errors come back as the Manager's Status.
// Host page regions are passed as memfds sealed with F_SEAL_SHRINK; CUDA page
// regions as cudaIpcMemHandles (see RegisterInstance).
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

  // Registers an instance whose pages live in the regions of request.layout.
  //
  // Host instances (request.device "host"): `region_fds` are the regions, one
  // memfd per layout.region_bytes entry, in order, each sealed with
  // F_SEAL_SHRINK and at least that region's size (HostMemory makes them);
  // request.ipc_handles is empty. The fds are sent over SCM_RIGHTS; the
  // caller keeps its own.
  //
  // CUDA instances (request.device "cuda:N", N a decimal 0..1023 without
  // leading zeros): `region_fds` is empty and request.ipc_handles holds one
  // cudaIpcMemHandle_t (64 bytes, copied as is into the std::array) per
  // layout.region_bytes entry, in order. The engine gets each with
  // cudaIpcGetMemHandle(&handle, base) on a cudaMalloc allocation made on
  // device N. A handle names the whole allocation and the Manager maps it from
  // its base, so a region must start at the allocation's base and the
  // allocation must hold at least the region's bytes (the Manager checks).
  // Stream-ordered memory (cudaMallocAsync / memory pools) has no such handle.
  // The allocation must stay alive (not cudaFree'd) until UnregisterInstance
  // returns: the Manager copies into and out of it until then. (Closing the
  // connection also unregisters, but the engine cannot tell when the Manager
  // is done: unregister first.)
  //
  // Anything else (fds with a CUDA device, handles with "host", a handle count
  // other than the region count, another device string) is InvalidArgument
  // from the Manager naming the field. A Manager that cannot serve the device
  // (no GPU tier, no such CUDA device) fails the call with a message naming
  // it.
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
