#include "gpu/crc32c_kernel.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "gpu/crc32c_block.cuh"

namespace orbitkv::gpu {
namespace {

static_assert(CUDART_VERSION >= 12010, "kernel parameters over 4 KiB need CUDA 12.1");
static_assert(sizeof(CrcLaunch) <= 32000, "kernel parameters must stay under 32 KiB");
static_assert(kCrcThreads % 32 == 0 && kCrcThreads >= 256 / 2, "two table entries per thread");

__device__ const CrcShiftTables kShifts = MakeCrcShiftTables();

// Grid: one block per piece of the launch; partial[g]: piece g's register at
// the piece's end.
__global__ void __launch_bounds__(kCrcThreads)
    CrcPieceKernel(const __grid_constant__ CrcLaunch l, uint32_t* partial) {
  __shared__ CrcSliceTables tables;
  for (uint32_t b = threadIdx.x; b < 256; b += kCrcThreads) FillCrcSliceEntry(&tables, b);
  __syncthreads();
  const uint32_t v = CrcBlockXor(CrcLeafContribution(tables, kShifts, l, blockIdx.x, threadIdx.x));
  if (threadIdx.x == 0) partial[blockIdx.x] = v;
}

// Grid: one block per range; out[r] its CRC32C.
__global__ void __launch_bounds__(kCrcThreads)
    CrcCombineKernel(const __grid_constant__ CrcLaunch l, const uint32_t* partial, uint32_t* out) {
  const uint32_t r = blockIdx.x;
  const uint32_t first = l.first_piece[r];
  const uint64_t pieces = l.first_piece[r + 1] - first;
  uint32_t acc = 0;
  for (uint64_t q = threadIdx.x; q < pieces; q += kCrcThreads) {
    acc ^= CrcPieceContribution(kShifts, l, r, q, partial[first + q]);
  }
  acc = CrcBlockXor(acc);
  if (threadIdx.x == 0) out[r] = CrcFinish(l, r, acc);
}

// A pool per device for the pieces' registers that keeps what it has
// allocated (the default pool would return it to the driver at every
// synchronisation). Created on first use, never destroyed.
cudaError_t ScratchPool(cudaMemPool_t* pool) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static auto* pools = new std::vector<cudaMemPool_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (pools->size() <= static_cast<size_t>(device)) pools->resize(device + 1, nullptr);
  cudaMemPool_t& p = (*pools)[device];
  if (p == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created = nullptr;
    if (cudaError_t e = cudaMemPoolCreate(&created, &props); e != cudaSuccess) return e;
    uint64_t keep = 64u << 20;
    if (cudaError_t e = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep);
        e != cudaSuccess) {
      cudaMemPoolDestroy(created);
      return e;
    }
    p = created;
  }
  *pool = p;
  return cudaSuccess;
}

}  // namespace

cudaError_t ReleaseCrcScratch(CrcScratch* scratch, cudaStream_t stream) {
  if (scratch->data == nullptr) return cudaSuccess;
  const cudaError_t e = cudaFreeAsync(scratch->data, stream);
  *scratch = CrcScratch{};
  return e;
}

cudaError_t LaunchCrc32c(const CrcDesc* ops, size_t count, uint32_t* out, cudaStream_t stream,
                         CrcScratch* scratch) {
  if (count == 0) return cudaSuccess;
  std::vector<uint64_t> data(count), bytes(count);
  for (size_t i = 0; i < count; ++i) {
    data[i] = ops[i].data;
    bytes[i] = ops[i].bytes;
  }
  // Every launch planned first, so that one allocation holds every launch's
  // piece registers (one pool allocation and free per call, not per launch).
  std::vector<CrcLaunch> launches((count + kCrcOpsPerLaunch - 1) / kCrcOpsPerLaunch);
  std::vector<uint64_t> first_partial(launches.size());
  uint64_t pieces = 0;
  for (size_t k = 0; k < launches.size(); ++k) {
    const size_t first = k * kCrcOpsPerLaunch;
    const size_t n = std::min(kCrcOpsPerLaunch, count - first);
    if (!PlanCrcLaunch(data.data() + first, bytes.data() + first, n, &launches[k])) {
      return cudaErrorInvalidValue;
    }
    first_partial[k] = pieces;
    pieces += launches[k].first_piece[n];
  }
  uint32_t* partial = nullptr;
  bool owned = false;  // allocated for this call alone
  if (pieces > 0 && scratch != nullptr && scratch->entries >= pieces) {
    partial = scratch->data;
  } else if (pieces > 0) {
    cudaMemPool_t pool = nullptr;
    if (cudaError_t e = ScratchPool(&pool); e != cudaSuccess) return e;
    // A stream's scratch grows to twice what it held (or this call's need).
    const uint64_t want =
        scratch == nullptr ? pieces : std::max<uint64_t>(pieces, 2 * scratch->entries);
    if (cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&partial),
                                                sizeof(uint32_t) * want, pool, stream);
        e != cudaSuccess) {
      return e;
    }
    if (scratch != nullptr) {
      if (cudaError_t e = ReleaseCrcScratch(scratch, stream); e != cudaSuccess) {
        cudaFreeAsync(partial, stream);
        return e;
      }
      *scratch = {partial, want};
    } else {
      owned = true;
    }
  }
  cudaError_t launched = cudaSuccess;
  for (size_t k = 0; k < launches.size() && launched == cudaSuccess; ++k) {
    const CrcLaunch& l = launches[k];
    uint32_t* const mine = partial == nullptr ? nullptr : partial + first_partial[k];
    if (l.first_piece[l.count] > 0)
      CrcPieceKernel<<<l.first_piece[l.count], kCrcThreads, 0, stream>>>(l, mine);
    CrcCombineKernel<<<l.count, kCrcThreads, 0, stream>>>(l, mine, out + k * kCrcOpsPerLaunch);
    launched = cudaGetLastError();
  }
  if (owned) {
    if (cudaError_t e = cudaFreeAsync(partial, stream); e != cudaSuccess) return e;
  }
  return launched;
}

}  // namespace orbitkv::gpu
