#include "bench/route.h"

#include <algorithm>

#include "workload/format.h"

namespace orbitkv::bench {

const std::vector<RouteInfo>& Routes() {
  static const std::vector<RouteInfo> routes = {
      {Route::kDram,
       "dram",
       "Manager --admission all: restores served from the pinned DRAM pool",
       Tier::kDram,
       false,
       false,
       {"--admission", "all", "--ssd-backend", "uring"}},
      {Route::kSsdUring,
       "ssd-uring",
       "Manager --admission reuse --ssd-read-path uring: objects leave DRAM once written back, "
       "restores read the SSD through io_uring into pinned staging",
       Tier::kSsd,
       false,
       false,
       {"--admission", "reuse", "--ssd-backend", "uring", "--ssd-read-path", "uring"}},
      {Route::kSsdAuto,
       "ssd-auto",
       "Manager --admission reuse --ssd-backend auto: cuFile reads into GPU staging (GPU tier)",
       Tier::kSsd,
       false,
       true,
       {"--admission", "reuse", "--ssd-backend", "auto"}},
      {Route::kNaive,
       "naive",
       "baseline in the bench: one O_DIRECT pread per block into a host buffer, then one "
       "memcpy per slot into the page; one pwrite per block to publish",
       Tier::kSsd,
       true,
       false,
       {}},
      {Route::kDramEngines,
       "dram-engines",
       "dram with ORBITKV_GPU_COPY=engines: one copy-engine DMA per slot (the mover before issue "
       "18), for comparison",
       Tier::kDram,
       false,
       true,
       {"--admission", "all", "--ssd-backend", "uring"},
       {"ORBITKV_GPU_COPY=engines"}},
      {Route::kDramKernel,
       "dram-kernel",
       "dram with ORBITKV_GPU_COPY=kernel: a zero-copy kernel over the mapped pinned pool, for "
       "comparison",
       Tier::kDram,
       false,
       true,
       {"--admission", "all", "--ssd-backend", "uring"},
       {"ORBITKV_GPU_COPY=kernel"}},
      {Route::kDramEncoded,
       "dram-encoded",
       "dram with --codec-dram-copy encoded: once written back, DRAM holds the --storage-codec "
       "encoded objects; restores into CUDA pages move the encoded bytes and decode on the GPU "
       "(host pages: on the CPU)",
       Tier::kDram,
       false,
       false,
       {"--admission", "all", "--ssd-backend", "uring", "--codec-dram-copy", "encoded"}},
      {Route::kGpuEncoded,
       "gpu-encoded",
       "dram-encoded on the GPU tier (--ssd-backend auto): Publish encodes complete groups on the "
       "GPU, DRAM keeps the encoded copy and cuFile writes it (Publish returns at the encode); "
       "restores move the encoded bytes and decode on the GPU",
       Tier::kDram,
       false,
       true,
       {"--admission", "all", "--ssd-backend", "auto", "--codec-dram-copy", "encoded"}},
  };
  return routes;
}

const RouteInfo& Info(Route route) {
  for (const RouteInfo& r : Routes())
    if (r.route == route) return r;
  return Routes().front();  // unreachable: every enumerator has a row
}

CeilingKind RestoreCeiling(Route route, std::string_view device) {
  if (Info(route).tier == Tier::kSsd) return CeilingKind::kFioRead;
  return device == "host" ? CeilingKind::kMemcpy : CeilingKind::kCudaH2D;
}

Result<std::vector<Route>> ParseRoutes(std::string_view list) {
  std::vector<Route> out;
  for (const std::string& name : demo::SplitList(list)) {
    const RouteInfo* found = nullptr;
    for (const RouteInfo& r : Routes())
      if (r.name == name) found = &r;
    if (!found) {
      std::string known;
      for (const RouteInfo& r : Routes())
        known += (known.empty() ? "" : ", ") + std::string(r.name);
      return Status::InvalidArgument("--routes: unknown route '" + name + "' (known: " + known +
                                     ")");
    }
    if (std::find(out.begin(), out.end(), found->route) == out.end()) out.push_back(found->route);
  }
  if (out.empty()) return Status::InvalidArgument("--routes: no route given");
  return out;
}

Status RouteSupported(Route route, std::string_view device) {
  const RouteInfo& info = Info(route);
  if (info.needs_cuda && device == "host") {
    return Status::Unavailable("route " + std::string(info.name) +
                               " needs CUDA pages (--device cuda:N) and the GPU storage tier");
  }
  return Status::OK();
}

}  // namespace orbitkv::bench
