// PageTarget: an engine's KV pages as the bench drives them, whatever memory
// they live in: host pages (sealed memfds, here) or CUDA pages (the GPU tier's
// cuda_pages.h), in any layout: a dense model's one group (split: one region
// per slot, or page-first) or a hybrid model's groups (workload/hybrid.h).
// Groups are indices into the layout's groups. A target registers itself with
// the Manager (Describe), writes a piece's deterministic content (Fill,
// workload/workload.h), checks it byte for byte (Check), poisons pages before
// a restore, and moves a page of a group to and from a contiguous host buffer
// for the naive route (Gather, Scatter). One engine thread uses a target; it
// is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/layout.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

// One page of one group of a target.
struct PageRef {
  uint32_t group = 0;
  uint64_t page = 0;
};

class PageTarget {
 public:
  virtual ~PageTarget() = default;
  virtual const InstanceLayout& layout() const = 0;
  // Bytes of one page of `group`: the sum of its slot sizes.
  uint64_t group_bytes(uint32_t group = 0) const;

  // Sets request->device and request->layout and the regions: host targets
  // add one fd per region to *region_fds (the caller sends them; the target
  // keeps its own), CUDA targets fill the request's IPC handles.
  virtual void Describe(RegisterRequest* request, std::vector<int>* region_fds) const = 0;
  // Overwrites every slot of `page` of `group`, so a restore that did not
  // write a byte cannot pass Check with stale content.
  virtual void Poison(uint32_t group, uint64_t page) = 0;
  // Poison(pages[i]) for every i, before one Restore call. CUDA pages: one
  // descriptor upload, one kernel launch and one synchronisation for them all.
  virtual void PoisonMany(std::span<const PageRef> pages);
  virtual void Fill(uint32_t group, const BlockKey& key, uint64_t page) = 0;
  // Fill(group, keys[i], pages[i]) for every i: what an engine's forward pass
  // produces before one Publish call. CUDA pages: one kernel launch and one
  // synchronisation for them all (one per block kept each engine idle about
  // 1 ms per 32-block call, between its Publish calls). REQUIRES: equal sizes.
  virtual void FillMany(uint32_t group, std::span<const BlockKey> keys,
                        std::span<const uint64_t> pages);
  // True if every slot of `page` of `group` holds exactly Fill(key)'s bytes.
  virtual bool Check(uint32_t group, const BlockKey& key, uint64_t page) = 0;
  // Element i: Check(pages[i].group, keys[i], pages[i].page), for the blocks
  // of one Restore call. CUDA pages: one kernel launch and one synchronisation
  // for them all (a check per block put a launch and a wait per block
  // between an engine's Restore calls, so fewer of the engines' calls
  // overlapped than unverified). REQUIRES: equal sizes.
  virtual std::vector<bool> CheckMany(std::span<const PageRef> pages,
                                      std::span<const BlockKey> keys);
  // Copies the slots of `page` of `group`, back to back, to dst[0, group_bytes(group)).
  virtual void Gather(uint32_t group, uint64_t page, uint8_t* dst) = 0;
  // Copies src[0, group_bytes(group)) into the slots of `page`: one copy per
  // slot. CUDA pages: one cudaMemcpyAsync per slot, then one stream
  // synchronisation (what simple offloaders such as vLLM's swap path do).
  virtual void Scatter(uint32_t group, const uint8_t* src, uint64_t page) = 0;
  // A 4 KiB aligned buffer for Gather/Scatter (O_DIRECT I/O goes straight in
  // and out of it): malloc'ed for host pages, pinned (cudaMallocHost) for CUDA
  // pages. Freed with FreeBuffer.
  virtual Result<uint8_t*> AllocateBuffer(uint64_t bytes);
  virtual void FreeBuffer(uint8_t* buffer);
};

// A target for `device` with `layout` (validated by the Manager at
// register). Host pages are built here; "cuda:N" goes to CreateCudaPageTarget
// (cuda_pages.h), Unavailable in builds without CUDA.
Result<std::unique_ptr<PageTarget>> CreatePageTarget(const std::string& device,
                                                     const InstanceLayout& layout);
// A dense model's target: `pages` pages of the given slot sizes in one group,
// in a split layout (one region per slot) or a page-first one (one region, a
// page's slots back to back).
Result<std::unique_ptr<PageTarget>> CreatePageTarget(const std::string& device, uint64_t pages,
                                                     const std::vector<uint64_t>& slot_bytes,
                                                     bool page_first = false);

}  // namespace orbitkv::bench
