// Backend: one engine's handle on what stores blocks in a route run: a Manager
// (orbitkv::Client over its socket, the engine's pages registered as one
// instance) or the bench's NaiveStore. The calls mirror the cache API: Query a
// key chain, Restore chosen blocks of the query's prefix into pages, Release
// what was not restored, Publish pages under keys. Used by one engine thread;
// the PageTarget and NaiveStore outlive it.
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
    uint32_t prefix = 0;      // restorable prefix of the keys asked
    std::vector<Tier> tiers;  // per block of the prefix
  };
  virtual ~Backend() = default;
  virtual Result<Lookup> Query(std::span<const BlockKey> keys) = 0;
  // REQUIRES: `keys` are the keys queried; blocks index into the prefix;
  // pages[i] receives blocks[i]. One result per block.
  virtual Result<std::vector<BlockResult>> Restore(const Lookup& lookup,
                                                   std::span<const BlockKey> keys,
                                                   std::span<const uint32_t> blocks,
                                                   std::span<const uint64_t> pages) = 0;
  // Lets go of what the query still holds.
  virtual Status Release(const Lookup& lookup) = 0;
  virtual Result<PublishResult> Publish(std::span<const BlockKey> keys,
                                        std::span<const uint64_t> pages) = 0;
  // Unregisters and disconnects.
  virtual Status Close() = 0;
  // The Manager's timeline of the last Restore call (none for the naive store).
  virtual std::optional<RestoreTimeline> last_timeline() const { return std::nullopt; }
};

// Connects to the Manager at `socket` and registers `pages` in namespace `ns`
// with storage codec `storage` (default: the Manager's).
Result<std::unique_ptr<Backend>> ConnectManagerBackend(const std::string& socket,
                                                       const std::string& ns, PageTarget& pages,
                                                       const std::string& client_name,
                                                       const StorageCodecRequest& storage = {});
// The naive route over `store`: one pread + one copy per slot per block.
Result<std::unique_ptr<Backend>> NewNaiveBackend(NaiveStore& store, PageTarget& pages);

}  // namespace orbitkv::bench
