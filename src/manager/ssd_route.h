// SsdRoute: one way to move a restore's SSD blocks from the store into the
// engine's pages (DESIGN.md "route"): io_uring into pinned DRAM staging then a
// copy (UringRoute), or cuFile into GPU staging then a scatter (CufileRoute).
// Manager::Impl::SubmitSsd is the one place that picks a route.
//
// Contract, for every route:
//  * Submit() takes the restore's SSD blocks; each block it keeps finishes
//    exactly once (RestoreRec::Finish) with OK, its read/verify/copy error, or
//    Cancelled, and its lease is completed or cancelled first. It returns the
//    blocks it declined, untouched (only a route that may fall back declines:
//    the caller passes them to the next route); it declines all or none.
//  * A block that fails with Corruption (the object on SSD is damaged) has its
//    extent dropped from the store (SsdStore::DropIfCorrupt) before it
//    finishes, so a later Publish of the key stores it again.
//  * Cancel() finishes the restore's blocks that were not submitted to the
//    device yet with Cancelled, before it returns, and returns how many;
//    submitted blocks complete normally.
//  * Close() stops intake and waits until every kept block finished.
// Work a route keeps holds a LaneToken (Manager::Drain waits for them).
// REQUIRES: the caller holds the restore's instance (InstanceGuard) across
// Submit and Cancel. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "manager/restore.h"
#include "manager/sources.h"

namespace orbitkv {

class SsdRoute {
 public:
  virtual ~SsdRoute() = default;
  [[nodiscard]] virtual std::vector<RestoreBlock> Submit(const std::shared_ptr<RestoreRec>& restore,
                                                         std::vector<RestoreBlock> blocks) = 0;
  virtual uint32_t Cancel(const std::shared_ptr<RestoreRec>& restore) = 0;
  virtual void Close() = 0;
};

}  // namespace orbitkv
