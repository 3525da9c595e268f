// Device::GatherObjectsAsync on CUDA (gpu/platform.h, SlotTable): whole
// objects gathered from engine pages, with the CRC32C of each slot, in one
// kernel per kGatherObjectsPerLaunch objects. One thread block per (object,
// slot): it copies the slot's bytes from the page to the object in 16-byte
// words where both addresses allow (bytes otherwise), consecutive threads on
// consecutive words, so a warp writes 512 contiguous bytes (whole PCIe write
// lines when the object is pinned host memory), and writes zeros over the gap
// to the next slot; then each thread CRCs one
// 128-byte leaf of the slot from the page (gpu/crc32c_grid.h,
// CrcLeafOfShortRange) and the block XORs them. The slot table lives in
// device memory (made once per table); the objects travel by value as kernel
// parameters. Returns the first CUDA error of a refused launch. REQUIRES:
// the current device is the stream's; every slot 1..kCrcPieceBytes bytes;
// every address one the kernel may read or write (the caller checked them).
// Thread-safe. C++17 and CUDA runtime types only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace orbitkv::gpu {

// One slot of a table: page p's bytes at base + p * stride, `bytes` of them,
// into the object at `offset`, followed there by `zero_after` zero bytes (the
// gap to the next slot).
struct GatherSlotDesc {
  uint64_t base = 0;
  uint64_t stride = 0;
  uint64_t bytes = 0;
  uint64_t offset = 0;
  uint64_t zero_after = 0;
};

struct GatherObjectDesc {
  uint64_t page = 0;
  uint64_t object = 0;  // address
};

// Objects per launch: a call of up to kGatherObjectsPerSmallLaunch objects
// passes 1 KiB of parameters (a launch's host cost grows with them: 3-4 us
// under 4 KiB, 6-7 us at 28 KiB on the H100); larger calls launch
// kGatherObjectsPerLaunch (8 KiB) at a time.
inline constexpr size_t kGatherObjectsPerSmallLaunch = 64;
inline constexpr size_t kGatherObjectsPerLaunch = 512;

// crcs[i * slots + j]: the CRC32C of slot j of object i. `table`: `slots`
// descriptors in device memory.
cudaError_t LaunchGatherObjects(const GatherSlotDesc* table, uint32_t slots,
                                const GatherObjectDesc* objects, size_t count, uint32_t* crcs,
                                cudaStream_t stream);

}  // namespace orbitkv::gpu
