// The rules of Device::CreateSlotTable (gpu/platform.h) that need no device,
// shared by the CUDA and fake platforms: each checks the memory itself.
// Pure; built and tested everywhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::gpu {

// Checks `slots` over pages [0, pages): 1..kGatherMaxSlots slots, pages >= 1,
// each slot 1..kGatherSlotMaxBytes bytes at a 16-byte aligned object offset,
// a non-null base whose pages do not overflow the address space, and no two
// slots overlapping in the object. On success returns the object bytes (the
// end of the last slot) and sets (*extents)[i] to the bytes slot i spans in
// device memory: [base, base + stride * (pages - 1) + bytes), and
// (*zero_after)[i] to the bytes from slot i's end to the next slot's offset
// (0 for the last slot: the gaps a gather writes as zeros). InvalidArgument
// naming the slot and the rule otherwise.
Result<uint64_t> CheckSlotSpans(std::span<const SlotSpan> slots, uint64_t pages,
                                std::vector<uint64_t>* extents, std::vector<uint64_t>* zero_after);

}  // namespace orbitkv::gpu
