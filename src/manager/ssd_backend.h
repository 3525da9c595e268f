// SSD backend selection (spec "Automatic selection", "File capacity",
// "Enable and qualify"): decides at startup whether the GPU storage tier may
// use cuFile, cache-wide, and holds the cuFile file registrations.
//
//  * uring: cuFile is never loaded.
//  * auto: the storage driver opens under the native-only policy and every
//    shard must register with it; any failure selects io_uring for the whole
//    cache and `reason` says why. No platform (no CUDA build or device) is
//    io_uring too.
//  * cufile: the same steps, but any failure fails startup with the driver's
//    error, naming cuFile.
// Once cuFile is selected, every shard's capacity is reserved with fallocate
// (SsdStore::ReserveCapacity); a reservation failure fails startup in both
// modes (never a silent sparse io_uring cache).
// --ssd-read-path cufile requires cuFile to be selected: otherwise startup
// fails, since an explicit route is never replaced by the host route.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "gpu/platform.h"
#include "io/file_system.h"
#include "orbitkv/options.h"
#include "orbitkv/status.h"

namespace orbitkv {

class SsdStore;

struct SsdBackendSelection {
  bool cufile = false;
  std::string reason;  // one line for the startup log
  // Per shard, when cufile: an fd of its own (O_RDWR | O_DIRECT; cuFile
  // refuses the store's O_NOFOLLOW fds with 5019) and its registration,
  // released before the fd.
  std::vector<UniqueFd> fds;
  std::vector<std::unique_ptr<gpu::StorageFile>> files;
};

// `platform` may be null (`no_platform_why` then says why). The shards'
// cuFile fds are opened through `fs` (the FileSystem seam).
Result<SsdBackendSelection> SelectSsdBackend(const ManagerOptions& options, gpu::Platform* platform,
                                             const std::string& no_platform_why, SsdStore& store,
                                             FileSystem* fs);

}  // namespace orbitkv
