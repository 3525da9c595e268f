// Route: the ways orbitkv-bench moves stored bytes into engine pages, compared
// in one run with the same pool and SSD capacities, seed and requests. A
// registry: each route says what serves it (a fresh Manager with the flags
// listed, or the naive baseline inside the bench), which tier's restores it
// measures, the ceiling its throughput is a fraction of, and what it needs
// from the host. The GPU tier fills in the rows marked for it (the cuFile
// route, CUDA-page ceilings) without touching the drivers. Pure data.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

enum class Route {
  kDram,         // Manager, DRAM pool -> pages (memcpy for host pages, H2D for CUDA pages)
  kSsdUring,     // Manager, SSD -> io_uring -> pinned staging -> pages
  kSsdAuto,      // Manager, --ssd-backend auto: cuFile into GPU staging (CUDA pages; GPU tier)
  kNaive,        // the bench itself: one pread per block into a host buffer, one copy per slot
  kDramEngines,  // kDram with ORBITKV_GPU_COPY=engines: one DMA per slot (CUDA pages)
  kDramKernel,   // kDram with ORBITKV_GPU_COPY=kernel: zero-copy kernel (CUDA pages)
  // kDram with --codec-dram-copy encoded: DRAM holds the encoded objects once
  // written back (CUDA pages: GPU decode; host pages: CPU). Needs --storage-codec.
  kDramEncoded,
  // kDramEncoded on the GPU tier (--ssd-backend auto, CUDA pages): complete
  // groups encode on the GPU at publish; DRAM keeps the encoded copy and
  // cuFile writes it. Needs --storage-codec.
  kGpuEncoded,
};

// What a route's throughput is a fraction of.
enum class CeilingKind {
  kMemcpy,   // host pages: memcpy, as many threads as the Manager copies on
  kCudaH2D,  // CUDA pages: pinned cudaMemcpy host to device (GPU tier)
  kFioRead,  // SSD: fio, io_uring, O_DIRECT, same directory, block size and depth
};

struct RouteInfo {
  Route route;
  std::string_view name;  // as in --routes
  std::string_view description;
  Tier tier;                               // the tier whose restores the route measures
  bool naive;                              // served by the bench's NaiveStore, not a Manager
  bool needs_cuda;                         // only with --device cuda:N
  std::vector<std::string> manager_flags;  // the Manager run for this route
  std::vector<std::string> manager_env;    // "NAME=value" for that Manager
};

const std::vector<RouteInfo>& Routes();
const RouteInfo& Info(Route route);
// The ceiling a route's restore throughput is compared with on `device`.
CeilingKind RestoreCeiling(Route route, std::string_view device);
// "dram,ssd-uring,naive" -> routes, in the given order, no repeats. The error
// (InvalidArgument) names the unknown route and lists the known ones.
Result<std::vector<Route>> ParseRoutes(std::string_view list);
// OK when the route can run here on `device`; Unavailable saying why not.
Status RouteSupported(Route route, std::string_view device);

}  // namespace orbitkv::bench
