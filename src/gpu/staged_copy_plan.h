// StagedCopyPlan: how the staged host<->device mover (gpu/cuda_platform.h,
// ORBITKV_GPU_COPY=staged) turns many small copies between pinned host memory
// and device memory into a few large DMA transfers. Pure arithmetic on
// addresses, no CUDA: built and tested everywhere.
//
// A restore copies each slot of each object (header + 512-byte aligned
// segments, contiguous in the pinned pool) into its own page: 64 copies of
// 32 KiB per block of an 8B model, each a DMA descriptor on its own. The plan
// merges the host side of the ops into contiguous spans (to the device: gaps
// of up to max_gap bytes are read along, since reading a header or padding is
// harmless; to the host: only exactly adjacent ranges, since a write must not
// touch bytes outside the ops), packs the spans into chunks of at most
// chunk_bytes of device staging, and gives every op its piece: the device-side
// copy between its page and its place in the chunk. Ops of direct_min_bytes
// or more are not staged (one DMA each is already efficient).
//
// Execution (the CUDA mover): per chunk, to the device: span DMAs host ->
// staging, then one scatter kernel staging -> pages; to the host: one gather
// kernel pages -> staging, then span DMAs staging -> host. Every byte of every
// staged op is covered by exactly one piece, inside one span of its chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "gpu/platform.h"

namespace orbitkv::gpu {

enum class CopyDirection { kToDevice, kToHost };

struct StagingShape {
  uint64_t chunk_bytes = 8u << 20;       // one staging buffer
  uint64_t max_gap = 4096;               // kToDevice only: host bytes read along between ops
  uint64_t direct_min_bytes = 1u << 20;  // ops at least this large are not staged
  uint64_t align = 256;                  // staging offset == host address (mod align)
  // Whether an op of `bytes` goes to the copy engines as it is.
  bool Direct(uint64_t bytes) const { return bytes >= direct_min_bytes; }
};

struct StagedCopyPlan {
  // A contiguous host range and where it sits in its chunk's staging buffer.
  struct Span {
    uint64_t host = 0;
    uint64_t bytes = 0;
    uint64_t staging_offset = 0;
  };
  // One op's device-side copy: between `device` and staging_offset of its chunk.
  struct Piece {
    uint64_t device = 0;
    uint64_t staging_offset = 0;
    uint64_t bytes = 0;
  };
  struct Chunk {
    size_t span_begin = 0, span_end = 0;    // into spans
    size_t piece_begin = 0, piece_end = 0;  // into pieces
    uint64_t staging_bytes = 0;             // used of chunk_bytes
  };
  std::vector<Span> spans;
  std::vector<Piece> pieces;
  std::vector<Chunk> chunks;
  std::vector<CopyOp> direct;  // not staged: copied as they are
  uint64_t host_bytes = 0;     // sum of span bytes (>= staged op bytes: gaps read along)
};

// StagedCopyPlanner: builds a StagedCopyPlan from ops given in batches, so
// that a large call's first chunks can be enqueued while the rest is still
// being planned (CudaDevice::CopyAsync feeds it one window of a call's ops at
// a time: 16000 slot pieces of a 70B TP=8 Publish took 430-500 us to plan on
// the project's VM before the first byte moved). Each Add sorts its own ops by
// host address and packs them after what earlier batches left open: a span
// continues across batches only where its order allows (host at or after the
// span's start), otherwise a new span or chunk begins. Chunks [0,
// final_chunks()) never change again; Finish closes the last one. The plan's
// vectors keep their capacity across Reset, so a reused planner (one per
// thread) allocates nothing in the steady state.
// REQUIRES (per op): bytes > 0; for kToDevice op.src is host memory and op.dst
// device memory, for kToHost the reverse; ops do not overlap one another (in
// any batch). shape.chunk_bytes >= shape.direct_min_bytes + shape.align;
// align a power of two. For kToDevice, host ranges within max_gap of each
// other must lie in one pinned allocation (a span reads the gap between them:
// the pool, one registered region, is always; ops from separate cudaHostAlloc
// buffers may not be: a decode lane test of such buffers saw the DMA refused
// as invalid on the H200).
class StagedCopyPlanner {
 public:
  // Starts an empty plan (keeping the vectors' capacity).
  void Reset(CopyDirection direction, const StagingShape& shape);
  // Plans `ops` after the ops of earlier batches. Ops of direct_min_bytes or
  // more go to plan().direct.
  void Add(std::span<const CopyOp> ops);
  // Closes the open chunk: every chunk is final after it.
  void Finish();
  // Chunks that later Adds cannot change.
  size_t final_chunks() const { return finished_ ? plan_.chunks.size() : closed_; }
  const StagedCopyPlan& plan() const { return plan_; }
  // Moves the plan out (the planner needs a Reset before its next use).
  StagedCopyPlan TakePlan() { return std::move(plan_); }

 private:
  void CloseChunk(StagedCopyPlan::Chunk& c);

  CopyDirection direction_ = CopyDirection::kToDevice;
  StagingShape shape_;
  StagedCopyPlan plan_;
  std::vector<std::pair<uint64_t, size_t>> order_;  // scratch of Add
  size_t closed_ = 0;                               // chunks closed (all but the open one)
  bool finished_ = false;
};

// The whole plan of `ops` at once (one Add, then Finish). Same REQUIRES.
StagedCopyPlan PlanStagedCopy(std::span<const CopyOp> ops, CopyDirection direction,
                              const StagingShape& shape);

}  // namespace orbitkv::gpu
