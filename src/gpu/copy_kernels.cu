#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "gpu/copy_kernels.h"

namespace orbitkv::gpu {
namespace {

constexpr unsigned kThreads = 256;
// Caps the grid of one launch (kCopyOpsPerLargeLaunch * this blocks at most); a
// larger op is covered by grid-stride loops.
constexpr uint64_t kMaxBlocksPerOp = 1024;

// One launch's ops, passed by value as the kernel's parameter (constant bank,
// read in place through __grid_constant__). first_block[i] is the first block
// of op i; op i owns blocks [first_block[i], first_block[i + 1]). Two sizes:
// up to kCopyOpsPerLaunch ops (3.6 KiB, within the classic 4 KiB parameter
// limit) and up to kCopyOpsPerLargeLaunch (28 KiB: CUDA 12.1's 32 KiB limit,
// Volta and later), so a plan of thousands of small ops (the 70B TP=8 rank's
// 4 KiB slots) is a few launches, not one per 128 ops, while a one-block
// copy still passes only a small parameter block.
template <size_t N>
struct GatherScatterParams {
  uint64_t dst[N];
  uint64_t src[N];
  uint64_t bytes[N];
  uint32_t first_block[N];
  uint32_t count;
};
static_assert(sizeof(GatherScatterParams<kCopyOpsPerLaunch>) <= 4000,
              "small launches stay under the classic 4 KiB parameter limit");
static_assert(CUDART_VERSION >= 12010, "large kernel parameters need CUDA 12.1");
static_assert(sizeof(GatherScatterParams<kCopyOpsPerLargeLaunch>) <= 32000,
              "large launches stay under the 32 KiB parameter limit");

// Copies n bytes with `nthreads` threads (this one is `tid`): bytes up to the
// first V-aligned dst address, then V words, then the remaining bytes.
// REQUIRES: dst and src congruent modulo sizeof(V); nthreads >= sizeof(V).
template <typename V>
__device__ __forceinline__ void CopySpan(unsigned char* __restrict__ dst,
                                         const unsigned char* __restrict__ src, uint64_t n,
                                         uint64_t tid, uint64_t nthreads) {
  constexpr uint64_t kWord = sizeof(V);
  uint64_t head = (kWord - (reinterpret_cast<uintptr_t>(dst) & (kWord - 1))) & (kWord - 1);
  if (head > n) head = n;
  if (tid < head) dst[tid] = src[tid];
  const uint64_t words = (n - head) / kWord;
  V* __restrict__ dv = reinterpret_cast<V*>(dst + head);
  const V* __restrict__ sv = reinterpret_cast<const V*>(src + head);
  uint64_t i = tid;
  // Four loads in flight per thread before their stores.
  for (; i + 3 * nthreads < words; i += 4 * nthreads) {
    const V a = sv[i];
    const V b = sv[i + nthreads];
    const V c = sv[i + 2 * nthreads];
    const V d = sv[i + 3 * nthreads];
    dv[i] = a;
    dv[i + nthreads] = b;
    dv[i + 2 * nthreads] = c;
    dv[i + 3 * nthreads] = d;
  }
  for (; i < words; i += nthreads) dv[i] = sv[i];
  const uint64_t done = head + words * kWord;
  if (tid < n - done) dst[done + tid] = src[done + tid];
}

template <size_t N>
__global__ void __launch_bounds__(kThreads)
    GatherScatterKernel(const __grid_constant__ GatherScatterParams<N> p) {
  // The op owning this block: the last i with first_block[i] <= blockIdx.x.
  const uint32_t block = blockIdx.x;
  uint32_t lo = 0;
  uint32_t hi = p.count - 1;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (p.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const uint32_t op = lo;
  const uint32_t end_block = op + 1 < p.count ? p.first_block[op + 1] : gridDim.x;
  const uint64_t nthreads = static_cast<uint64_t>(end_block - p.first_block[op]) * blockDim.x;
  const uint64_t tid = static_cast<uint64_t>(block - p.first_block[op]) * blockDim.x + threadIdx.x;

  auto* dst = reinterpret_cast<unsigned char*>(p.dst[op]);
  const auto* src = reinterpret_cast<const unsigned char*>(p.src[op]);
  const uint64_t n = p.bytes[op];
  const uint64_t skew = p.dst[op] ^ p.src[op];
  if ((skew & 15) == 0) {
    CopySpan<uint4>(dst, src, n, tid, nthreads);
  } else if ((skew & 7) == 0) {
    CopySpan<uint2>(dst, src, n, tid, nthreads);
  } else if ((skew & 3) == 0) {
    CopySpan<uint32_t>(dst, src, n, tid, nthreads);
  } else if ((skew & 1) == 0) {
    CopySpan<uint16_t>(dst, src, n, tid, nthreads);
  } else {
    CopySpan<uint8_t>(dst, src, n, tid, nthreads);
  }
}

template <size_t N>
cudaError_t Launch(const GatherScatterParams<N>& params, uint32_t blocks, cudaStream_t stream) {
  (void)cudaGetLastError();  // report this launch's error, not an older one
  GatherScatterKernel<N><<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

// The non-empty ops of ops[0, count) in launches of up to N.
template <size_t N>
cudaError_t LaunchAll(const CopyDesc* ops, size_t count, cudaStream_t stream) {
  // 28 KiB for the large size: on the heap, once per thread.
  thread_local std::unique_ptr<GatherScatterParams<N>> held;
  if (!held) held = std::make_unique<GatherScatterParams<N>>();
  GatherScatterParams<N>& params = *held;
  params.count = 0;
  uint32_t blocks = 0;
  for (size_t i = 0; i < count; ++i) {
    const CopyDesc& op = ops[i];
    if (op.bytes == 0) continue;
    uint64_t op_blocks = (op.bytes + kCopyBytesPerBlock - 1) / kCopyBytesPerBlock;
    if (op_blocks > kMaxBlocksPerOp) op_blocks = kMaxBlocksPerOp;
    const uint32_t k = params.count++;
    params.dst[k] = op.dst;
    params.src[k] = op.src;
    params.bytes[k] = op.bytes;
    params.first_block[k] = blocks;
    blocks += static_cast<uint32_t>(op_blocks);
    if (params.count == N) {
      const cudaError_t err = Launch(params, blocks, stream);
      if (err != cudaSuccess) return err;
      params.count = 0;
      blocks = 0;
    }
  }
  if (params.count > 0) return Launch(params, blocks, stream);
  return cudaSuccess;
}

#if CUDART_VERSION >= 12080
// Set once a driver answered cudaMemcpyBatchAsync with "not supported".
std::atomic<bool> g_batch_refused{false};
#endif

}  // namespace

cudaError_t LaunchGatherScatter(const CopyDesc* ops, size_t count, cudaStream_t stream) {
  size_t nonempty = 0;
  for (size_t i = 0; i < count; ++i) nonempty += ops[i].bytes != 0;
  if (nonempty > kCopyOpsPerLaunch) return LaunchAll<kCopyOpsPerLargeLaunch>(ops, count, stream);
  return LaunchAll<kCopyOpsPerLaunch>(ops, count, stream);
}

bool EngineBatchCopyAvailable() {
#if CUDART_VERSION >= 12080
  return !g_batch_refused.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

cudaError_t EnqueueEngineCopies(const CopyDesc* ops, size_t count, cudaStream_t stream,
                                bool* batched, size_t first_batch) {
  if (batched != nullptr) *batched = false;
  if (count == 0) return cudaSuccess;
#if CUDART_VERSION >= 12080
  if (count > 1 && !g_batch_refused.load(std::memory_order_relaxed)) {
    // Several batches of at most kEngineOpsPerBatch: the copy engines start
    // on the first while the rest are enqueued (one batch of a 64 MiB call's
    // 2048 ops took about 1 ms to enqueue before its first byte moved).
    // `first_batch` ops first, each next batch twice the last.
    size_t batch =
        first_batch > 0 && first_batch < kEngineOpsPerBatch ? first_batch : kEngineOpsPerBatch;
    if (count > batch) {
      for (size_t first = 0; first < count;) {
        const size_t n = std::min(batch, count - first);
        bool part = false;
        const cudaError_t err = EnqueueEngineCopies(ops + first, n, stream, &part);
        if (err != cudaSuccess) return err;
        if (batched != nullptr) *batched = part;
        first += n;
        batch = std::min(2 * batch, kEngineOpsPerBatch);
      }
      return cudaSuccess;
    }
    // count <= kEngineOpsPerBatch here: 3 KiB of stack, no allocation.
    void* dsts[kEngineOpsPerBatch];
    void* srcs[kEngineOpsPerBatch];
    size_t sizes[kEngineOpsPerBatch];
    for (size_t i = 0; i < count; ++i) {
      dsts[i] = reinterpret_cast<void*>(ops[i].dst);
      srcs[i] = reinterpret_cast<void*>(ops[i].src);
      sizes[i] = static_cast<size_t>(ops[i].bytes);
    }
    // One attribute set for every op: sources read in stream order (after the
    // stream's earlier work); no location hints (they only apply to managed
    // or pageable memory).
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagDefault;
    size_t attr_index = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t err =
        cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_index, 1, stream);
#else
    // CUDA 12.8/12.9: non-const arrays and a failIdx out-parameter.
    size_t fail_index = 0;
    const cudaError_t err =
        cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &attr_index, 1, &fail_index, stream);
#endif
    if (err == cudaSuccess) {
      if (batched != nullptr) *batched = true;
      return cudaSuccess;
    }
    (void)cudaGetLastError();
    // Not supported here: never ask again. Refused as invalid: this call goes
    // op by op, and each op's own copy reports what is wrong with it (a
    // defensive fallback; the H200 refusal it was added for came from the
    // staged plan's spans, staged_copy_plan.h, which per-op copies refuse too).
    if (err == cudaErrorNotSupported || err == cudaErrorCallRequiresNewerDriver) {
      g_batch_refused.store(true, std::memory_order_relaxed);
    } else if (err != cudaErrorInvalidValue) {
      return err;
    }
  }
#endif
  for (size_t i = 0; i < count; ++i) {
    const cudaError_t err = cudaMemcpyAsync(
        reinterpret_cast<void*>(ops[i].dst), reinterpret_cast<const void*>(ops[i].src),
        static_cast<size_t>(ops[i].bytes), cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace orbitkv::gpu
