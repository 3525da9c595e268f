// Client: an engine's handle on the Manager, over its Unix socket. The same
// operations as the cache API (orbitkv/cache_api.h). Blocking calls may run on
// many threads at once; a Restore waiting in one thread can be cancelled from
// another with CancelRestore(ticket). Errors come back as the Manager's Status.
// Host page regions are passed as memfds sealed with F_SEAL_SHRINK; CUDA page
// regions as cudaIpcMemHandles (see RegisterInstance).
//
// Connect authenticates the server: it must run as this process's euid (or
// as ClientConfig::server_uid); any other is refused with PermissionDenied
// naming its uid before a single byte or fd is sent. When the Manager closes
// the connection for a limit (connections, frame size, fds, idle timeout) it
// says why, and calls fail with that typed reason (ResourceExhausted,
// PermissionDenied, DeadlineExceeded) instead of a bare Cancelled.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include <sys/types.h>

#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv {

struct ClientConfig {
  // Empty: DefaultSocketPath().
  std::string socket_path;
  std::chrono::milliseconds timeout{60000};  // per call
  // How long a Restore past its timeout waits for the Manager to confirm the
  // cancelled restore's completion (see Restore).
  std::chrono::milliseconds restore_cancel_grace{5000};
  std::string client_name = "orbitkv-client";
  // A uid the Manager may run as besides this process's euid (a root engine
  // using a user's Manager names that user). Unset: the same uid only.
  std::optional<uid_t> server_uid;
  // How long a call polls for its reply before its thread sleeps (README,
  // "Connection model"): a reply within it reaches the caller with no thread
  // wake; the calling thread spends at most this much CPU per call (longer
  // for a large request, at most 2 ms). 0: sleep at once, for an engine
  // host short of cores. Unset: the environment's ORBITKV_CLIENT_SPIN_US
  // (0..10000; anything else fails Connect), else 500 us.
  std::optional<std::chrono::microseconds> spin_wait;
};

// The environment variable that sets ClientConfig::spin_wait where the
// config leaves it unset (the Python and engine adapters' clients included).
inline constexpr const char* kClientSpinEnv = "ORBITKV_CLIENT_SPIN_US";

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
  // request.model describes a hybrid model's storage groups (full attention,
  // sliding window, recurrent checkpoints; orbitkv/model_description.h); leave
  // it empty for a dense model. A bad description is InvalidArgument naming the
  // field. Queries of a described instance return recovery plans
  // (QueryResult's pieces; README "Hybrid models").
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
  // A ticket names a restore for CancelRestore and WaitRestore; take one
  // before calling Restore.
  virtual uint64_t NewTicket() = 0;
  // Restores into request.pages. The timeout contract (ClientConfig::timeout,
  // then restore_cancel_grace): when Restore returns a RestoreResult or any
  // error but DeadlineExceeded, the Manager writes no more of these pages.
  // Within the timeout that is the restore's completion. Past it the client
  // sends CancelRestore(ticket) and waits up to restore_cancel_grace for the
  // completion, and returns it if it comes (blocks not yet submitted when the
  // cancel arrived report Cancelled; the others were restored). If it does not
  // come (the Manager is stalled), Restore returns DeadlineExceeded, and only
  // then: the pages stay owned by the Manager, which may still write them, until
  // WaitRestore(ticket) returns something other than DeadlineExceeded. Do not
  // reuse the pages before that. If the connection breaks instead (the
  // Manager died), nothing more is written by a dead Manager.
  virtual Result<RestoreResult> Restore(const RestoreRequest& request, uint64_t ticket = 0) = 0;
  // Waits up to `timeout` for the completion of a restore whose Restore call
  // returned DeadlineExceeded. DeadlineExceeded again: still owned; call again.
  // InvalidArgument: no restore of that ticket is outstanding.
  virtual Result<RestoreResult> WaitRestore(uint64_t ticket, std::chrono::milliseconds timeout) = 0;
  // True if something not yet submitted was released.
  virtual Result<bool> CancelRestore(uint64_t ticket) = 0;
  virtual Result<uint32_t> Prepare(const PrepareRequest& request) = 0;
  // Drops every object of the namespace of `instance` (one of this
  // connection's), in DRAM and on SSD; other namespaces are untouched. Restores
  // already holding an object finish with it. NotFound for an unknown instance.
  virtual Result<ClearNamespaceResult> ClearNamespace(InstanceId instance) = 0;
  virtual void Close() = 0;
  // True once the connection is gone: Close was called, or the Manager closed
  // it or died. Every later call fails.
  virtual bool closed() const = 0;
};

// $XDG_RUNTIME_DIR, else /tmp/orbitkv-$EUID (which the Manager creates 0700
// and refuses to use unless this user owns it, it is no symlink and only its
// owner can enter it).
std::string DefaultSocketDirectory();
// DefaultSocketDirectory() + "/orbitkv.sock".
std::string DefaultSocketPath();

}  // namespace orbitkv
