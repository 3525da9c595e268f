// The cache API: the operations an engine performs on the Manager, as plain
// structs. The Manager implements CacheService in-process; the socket server
// decodes protocol messages into these and calls it; the C++ client and the
// Python module expose the same operations. Every field that crosses the
// socket is validated by the Manager before use.
//
// Lifecycle: RegisterInstance -> (Publish | Query -> Restore | Prepare)* ->
// UnregisterInstance. A session (one client connection) owns its instances;
// closing the session unregisters them and releases every lease, pin and
// reservation they held.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "orbitkv/layout.h"
#include "orbitkv/model_description.h"
#include "orbitkv/status.h"

namespace orbitkv {

// One client connection (the Manager's session; leases are held per session).
using SessionId = uint64_t;
using InstanceId = uint64_t;
using QueryId = uint64_t;
using RestoreId = uint64_t;
using BlockKey = std::array<uint8_t, 32>;

enum class Tier : uint8_t { kNone = 0, kDram = 1, kSsd = 2 };

struct RegisterRequest {
  std::string ns;  // namespace: model, dtype, layout fingerprint, TP/PP shape, salt
  uint32_t rank = 0;
  std::string device = "host";  // "host" or "cuda:N"
  InstanceLayout layout;
  // Host regions are passed as memfds alongside the request (one per
  // layout.region_bytes entry). CUDA regions ("cuda:N") are passed here
  // instead: one cudaIpcGetMemHandle per region, in layout order, each naming
  // an allocation of at least that region's bytes on device N (the Manager
  // checks the size of what it opens).
  std::vector<std::array<uint8_t, 64>> ipc_handles;
  // A hybrid model's storage groups (orbitkv/model_description.h); absent for
  // a dense model. Validated when decoded; part of the namespace's identity.
  // Until the Manager compiles hybrid recovery requirements (issue 14) the
  // socket server refuses a register that carries one.
  std::optional<ModelDescription> model;
};

struct PublishRequest {
  InstanceId instance = 0;
  uint32_t group_id = 0;
  std::vector<BlockKey> keys;
  std::vector<uint64_t> pages;     // one page per key
  std::vector<uint32_t> slot_ids;  // empty: every slot this instance holds (a complete group
                                   // when it holds all); else a fragment: these slots only
};

struct PublishResult {
  // When Publish returns, the engine may reuse the pages: their bytes are in DRAM.
  uint32_t stored = 0;   // objects (or fragments) accepted
  uint32_t sealed = 0;   // objects that became complete and visible
  uint32_t skipped = 0;  // already cached (DRAM or SSD): nothing to do
  uint32_t dropped = 0;  // not stored: the DRAM pool had no room (the engine may back off)
};

struct QueryRequest {
  InstanceId instance = 0;
  uint32_t group_id = 0;
  std::vector<BlockKey> keys;  // a chain: key i names the prefix of blocks 0..i
  // The query's leases expire after this; at most the Manager's
  // --max-query-ttl-ms (default 60 s), a larger value is InvalidArgument.
  uint32_t ttl_ms = 30000;
};

// Query budget: the bytes of each distinct key of a live query are charged
// once (a repeated key is free) until it is restored, released or expires. A
// session may hold at most budget / (sessions with instances) of the
// Manager-wide budget (default: the pool size).
struct QueryResult {
  QueryId query = 0;           // 0 when nothing is restorable
  uint32_t prefix = 0;         // longest restorable prefix (blocks 0..prefix-1)
  std::vector<Tier> sources;   // per block of the prefix
  uint64_t logical_bytes = 0;  // charged to the query budget until restore or expiry
  // The prefix ended because the Manager-wide budget or this session's share
  // of it was spent, not at a miss: block `prefix` may well be cached (retry
  // after restoring or releasing queries).
  bool budget_limited = false;
};

// Restore timeouts. A restore owns its destination pages from the call until
// its completion: the Manager may write any of them until then, and none
// after. CancelRestore releases what was not yet submitted; submitted blocks
// still complete, so the completion of a cancelled restore is what says its
// pages are free. The socket client (client.h Restore) keeps this contract
// across a client-side deadline: it cancels, waits a bounded grace for the
// completion, and returns DeadlineExceeded only when the pages are still
// owned (WaitRestore waits for the completion).
struct RestoreRequest {
  InstanceId instance = 0;
  QueryId query = 0;
  std::vector<uint32_t> blocks;  // indices into the query's prefix
  std::vector<uint64_t> pages;   // destination page per block
  bool want_timeline = false;    // reply with the restore's RestoreTimeline
};

// Where one restore's time went, on the Manager's clock, in nanoseconds since
// it was queued (the Manager took the request); -1 for a stage the restore
// did not have (a restore of DRAM blocks only does no I/O). Stages:
// source_ready: its blocks were taken from the query, their DRAM pins and SSD
// leases held by the restore; io_submitted: its first SSD read was submitted;
// io_complete: its last SSD read completed (on the cuFile route, read and
// scatter complete together); copy_complete: its last copy or scatter into
// the engine's pages completed; done: its last block finished.
struct RestoreTimeline {
  int64_t source_ready_ns = -1;
  int64_t io_submitted_ns = -1;
  int64_t io_complete_ns = -1;
  int64_t copy_complete_ns = -1;
  int64_t done_ns = -1;
  friend bool operator==(const RestoreTimeline&, const RestoreTimeline&) = default;
};

struct BlockResult {
  uint32_t block = 0;
  Tier source = Tier::kNone;
  Status status;
};

struct RestoreResult {
  std::vector<BlockResult> blocks;          // one per requested block
  std::optional<RestoreTimeline> timeline;  // when the request wanted it
};

struct PrepareRequest {
  InstanceId instance = 0;
  uint32_t group_id = 0;
  std::vector<BlockKey> keys;  // SSD objects to warm into DRAM
};

// Drops every object of the namespace of `instance` (one of the session's), in
// DRAM and on SSD: the engine's "clear my cache".
struct ClearNamespaceRequest {
  InstanceId instance = 0;
};

struct ClearNamespaceResult {
  uint64_t dram_objects = 0;  // sealed DRAM entries dropped
  uint64_t ssd_objects = 0;   // SSD directory entries dropped
};

}  // namespace orbitkv
