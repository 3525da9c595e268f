// QueryBlock and RestoreBlock: what a query holds for one block (a pinned DRAM
// entry or a leased SSD extent) and what a restore owns of it once taken, with
// the destination page. Plain values: their owner (QueryTable, a RestoreRec,
// an SSD route) says which thread touches them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "orbitkv/cache_api.h"
#include "store/catalog.h"
#include "store/dram_cache.h"
#include "store/object_id.h"

namespace orbitkv {

// Fields ordered without padding holes: a query of a 128k-token chain writes
// 8192 of these, and their bytes are much of the query's time.
struct QueryBlock {
  ObjectId id;
  uint64_t size = 0;  // logical object bytes
  // Query budget: a key is charged once per query, on its first occurrence
  // (`charge`), and credited when the last of its `holders` is taken.
  uint64_t charge = 0;        // owner only: bytes charged to the budget
  uint32_t charge_owner = 0;  // index of the key's first occurrence in the query
  uint32_t holders = 0;       // owner only: occurrences not yet taken
  Tier tier = Tier::kNone;
  bool taken = false;  // moved into a restore or released
  DramView dram;       // kDram: the pinned entry this block holds
  ExtentRef ref;       // kSsd
  LeaseId lease = 0;   // kSsd: one interest
};
static_assert(sizeof(QueryBlock) <= 160, "QueryBlock grew: see the note above it");

struct RestoreBlock {
  size_t result = 0;  // index into the restore's results
  QueryBlock src;
  uint64_t page = 0;
  DramView scratch;  // io_uring route: where the object was read
};

}  // namespace orbitkv
