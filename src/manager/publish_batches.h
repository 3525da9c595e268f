// PublishBatchTarget: the size of Publish's next D2H batch (DESIGN.md
// "Publish"). A Publish of CUDA pages copies its objects into the pool in
// batches, one D2H job each, pipelined --publish-depth deep: the next batch is
// assembled and enqueued while the earlier ones' copies run. The job the last
// enqueue leaves behind runs with nothing beside it, so the call's batches shrink
// towards its end: each takes at most half of the bytes still to come, down
// to cap/8 (at least one object: a batch closes once it reaches its target).
// Pure; no CUDA.
#pragma once

#include <algorithm>
#include <cstdint>

namespace orbitkv {

// `remaining`: the call's bytes not yet in an enqueued batch (the batch being
// built included); `cap`: the largest batch (--publish-batch-bytes). Returns
// the bytes at which the batch being built is enqueued.
inline uint64_t PublishBatchTarget(uint64_t remaining, uint64_t cap) {
  const uint64_t floor = std::max<uint64_t>(1, cap / 8);
  return std::clamp<uint64_t>(remaining / 2, floor, std::max<uint64_t>(floor, cap));
}

}  // namespace orbitkv
