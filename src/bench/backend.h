// Backend: one engine's handle on what stores blocks in a route run: a Manager
// (orbitkv::Client over its socket, the engine's pages registered as one
// instance, with the model description of a hybrid model) or the bench's
// NaiveStore. The calls mirror the cache API: Query a key chain, Restore
// chosen blocks of the query's prefix (a hybrid query: of its recovery plan's
// pieces) into pages, Release what was not restored, Publish pages of a
// storage group under keys. Used by one engine thread; the PageTarget and
// NaiveStore outlive it.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bench/naive_store.h"
#include "bench/page_target.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

class Backend {
 public:
  struct Lookup {
    QueryId query = 0;        // Manager's query id (0: nothing held)
    uint32_t prefix = 0;      // restorable prefix of the keys asked (hybrid: pieces.size())
    std::vector<Tier> tiers;  // per block of the prefix (hybrid: per piece)
    // Hybrid instances: the recovery plan (QueryResult's fields of that name).
    uint64_t prefix_tokens = 0;
    std::vector<QuerySource> pieces;
    uint64_t not_needed_bytes = 0;
  };
  virtual ~Backend() = default;
  virtual Result<Lookup> Query(std::span<const BlockKey> keys) = 0;
  // REQUIRES: `keys` are the keys queried; blocks index into the prefix (the
  // plan's pieces); pages[i] (a page of that piece's group) receives
  // blocks[i]. One result per block.
  virtual Result<std::vector<BlockResult>> Restore(const Lookup& lookup,
                                                   std::span<const BlockKey> keys,
                                                   std::span<const uint32_t> blocks,
                                                   std::span<const uint64_t> pages) = 0;
  // Lets go of what the query still holds.
  virtual Status Release(const Lookup& lookup) = 0;
  // pages[i] of layout group `group_id` under keys[i] (hybrid: the plain
  // chain key naming the prefix that ends with the piece).
  virtual Result<PublishResult> Publish(uint32_t group_id, std::span<const BlockKey> keys,
                                        std::span<const uint64_t> pages) = 0;
  // Unregisters and disconnects.
  virtual Status Close() = 0;
  // The Manager's timeline of the last Restore call (none for the naive store).
  virtual std::optional<RestoreTimeline> last_timeline() const { return std::nullopt; }
};

// Connects to the Manager at `socket` and registers `pages` in namespace `ns`
// with storage codec `storage` (default: the Manager's) and, for a hybrid
// model, its description.
Result<std::unique_ptr<Backend>> ConnectManagerBackend(
    const std::string& socket, const std::string& ns, PageTarget& pages,
    const std::string& client_name, const StorageCodecRequest& storage = {},
    const std::optional<ModelDescription>& model = std::nullopt);
// The naive route over `store`: one pread + one copy per slot per block.
Result<std::unique_ptr<Backend>> NewNaiveBackend(NaiveStore& store, PageTarget& pages);

}  // namespace orbitkv::bench
