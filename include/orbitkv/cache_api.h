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

// The storage codec a namespace asks for (README "Storage codecs"). The codec
// and its parameters are part of the namespace's identity: objects of
// different codecs never mix. The lossy codecs (fp8, turboquant-*) need the
// element dtype and head_dim; ans uses the dtype's element size (bf16 when
// unknown) and ignores head_dim.
struct StorageCodecRequest {
  std::string codec;      // "" = the Manager's --storage-codec; none|ans|fp8|turboquant-4|-3
  std::string dtype;      // every slot's element type: "" (unknown), bf16, fp16, fp8_e4m3fn
  uint32_t head_dim = 0;  // elements per (token, head) vector; 0 unknown
  friend bool operator==(const StorageCodecRequest&, const StorageCodecRequest&) = default;
};

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
  // a dense model. Validated (also against the layout: every layout group is
  // a description group's storage_group, of its bytes); part of the
  // namespace's identity, so instances whose descriptions differ never share
  // objects. A hybrid instance publishes plain chain keys; the Manager stores
  // each under recovery::ObjectKey(key, mask of the group).
  std::optional<ModelDescription> model;
  StorageCodecRequest storage;  // default: the Manager's --storage-codec
};

// REQUIRES: the engine's writes to `pages` have landed before it calls
// Publish (its stream synchronized; a cudaMemcpy from pageable memory or a
// cudaMemset returns before that). The Manager reads CUDA pages from its own
// context, which no engine stream orders: bytes still in flight are published
// as the Manager's copy happens to see them, and an object whose CRC32C (taken
// on the GPU) and copy saw different bytes fails its check when restored from
// SSD and is dropped.
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
  uint32_t group_id = 0;       // not used for a hybrid instance: its plan spans every group
  std::vector<BlockKey> keys;  // a chain: key i names the prefix of blocks 0..i
  // The query's leases expire after this; at most the Manager's
  // --max-query-ttl-ms (default 60 s), a larger value is InvalidArgument.
  uint32_t ttl_ms = 30000;
};

// One source of a hybrid query (QueryResult::pieces): a block of a
// full-attention or sliding-window group, or a recurrent checkpoint.
struct QuerySource {
  uint32_t group = 0;          // index into the description's groups
  uint32_t storage_group = 0;  // that group's storage_group (whose pages a restore writes)
  uint64_t index = 0;          // block index; recurrent: the checkpoint's position in tokens
  Tier tier = Tier::kNone;     // DRAM when it is in both tiers
  uint64_t bytes = 0;          // the description's bytes per block or checkpoint
  friend bool operator==(const QuerySource&, const QuerySource&) = default;
};

// The most sources one query returns (the wire's per-message limit); a longer
// hybrid plan is recompiled over a shorter chain.
inline constexpr uint32_t kMaxQuerySources = 65536;

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
  // Hybrid instances only (dense: 0 and empty). The compiled recovery plan
  // (recovery/recovery_plan.h): P in tokens, and exactly the sources that
  // rebuild it (by group, then ascending index), which the query pins or
  // leases and charges (logical_bytes, the description's bytes); `prefix` is
  // pieces.size() and sources[i] is pieces[i].tier, so RestoreRequest.blocks
  // index this list. budget_limited: a longer P was recoverable within the
  // chain but not within the budget. not_needed_bytes: the bytes of [0, P)
  // recovery does not read (window blocks before P - W, older checkpoints).
  uint64_t prefix_tokens = 0;
  std::vector<QuerySource> pieces;
  uint64_t not_needed_bytes = 0;
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
  std::vector<uint32_t> blocks;  // indices into the query's prefix (hybrid: into its pieces)
  // Destination page per block; for a hybrid source, a page of its storage
  // group (a recurrent group: the state slot in that group's layout). Each
  // piece is written only into its own group's slots.
  std::vector<uint64_t> pages;
  bool want_timeline = false;  // reply with the restore's RestoreTimeline
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
