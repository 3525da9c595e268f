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
#include <vector>

#include "gpu/platform.h"

namespace orbitkv::gpu {

enum class CopyDirection { kToDevice, kToHost };

struct StagingShape {
  uint64_t chunk_bytes = 8u << 20;       // one staging buffer
  uint64_t max_gap = 4096;               // kToDevice only: host bytes read along between ops
  uint64_t direct_min_bytes = 1u << 20;  // ops at least this large are not staged
  uint64_t align = 256;                  // staging offset == host address (mod align)
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

// REQUIRES: every op has bytes > 0; for kToDevice op.src is host memory and
// op.dst device memory, for kToHost the reverse; shape.chunk_bytes >=
// shape.direct_min_bytes + shape.align; align a power of two. For kToDevice,
// host ranges within max_gap of each other must lie in one pinned allocation
// (a span reads the gap between them: the pool, one registered region, is
// always; ops from separate cudaHostAlloc buffers may not be: a decode lane
// test of such buffers saw the DMA refused as invalid on the H200).
StagedCopyPlan PlanStagedCopy(std::span<const CopyOp> ops, CopyDirection direction,
                              const StagingShape& shape);

}  // namespace orbitkv::gpu
