#include "manager/ssd_backend.h"

#include <fcntl.h>

#include "orbitkv/units.h"
#include "store/ssd_store.h"

namespace orbitkv {

Result<SsdBackendSelection> SelectSsdBackend(const ManagerOptions& o, gpu::Platform* platform,
                                             const std::string& no_platform_why, SsdStore& store,
                                             FileSystem* fs) {
  SsdBackendSelection out;
  const bool explicit_cufile = o.ssd_backend == SsdBackend::kCufile;
  auto refuse = [&](const Status& why) -> Result<SsdBackendSelection> {
    if (explicit_cufile) {
      return Status::FromCode(why.code(),
                              "--ssd-backend cufile: cuFile (GPUDirect Storage) "
                              "cannot be used: " +
                                  std::string(why.message()));
    }
    if (o.ssd_read_path == SsdReadPath::kCufile) {
      return Status::FromCode(why.code(),
                              "--ssd-read-path cufile: cuFile (GPUDirect Storage) "
                              "cannot be used: " +
                                  std::string(why.message()));
    }
    out.files.clear();  // deregister before the fds close
    out = SsdBackendSelection{};
    out.reason = "io_uring (auto: " + std::string(why.message()) + ")";
    return std::move(out);
  };
  if (o.ssd_backend == SsdBackend::kUring) {
    if (o.ssd_read_path == SsdReadPath::kCufile) {
      return Status::InvalidArgument(
          "--ssd-read-path cufile needs --ssd-backend auto or cufile, not uring");
    }
    out.reason = "io_uring (--ssd-backend uring)";
    return std::move(out);
  }
  if (platform == nullptr) return refuse(Status::Unavailable(no_platform_why));
  Result<std::string> driver = platform->OpenStorage(
      explicit_cufile ? gpu::StoragePolicy::kExplicit : gpu::StoragePolicy::kAutoNativeOnly);
  if (!driver.ok()) return refuse(driver.status());
  const ShardSet& shards = store.shards();
  for (uint32_t i = 0; i < shards.count(); ++i) {
    Result<int> fd = fs->Open(shards.path(i), O_RDWR | O_DIRECT | O_CLOEXEC, 0);
    if (!fd.ok()) {
      out.files.clear();
      return refuse(fd.status().WithContext("opening SSD shard " + shards.path(i) + " for cuFile"));
    }
    out.fds.emplace_back(*fd);
    Result<std::unique_ptr<gpu::StorageFile>> f = platform->RegisterFile(*fd);
    if (!f.ok()) {
      out.files.clear();
      return refuse(f.status().WithContext("registering SSD shard " + std::to_string(i) + " " +
                                           shards.path(i) + " with cuFile"));
    }
    out.files.push_back(std::move(f).value());
  }
  // Every shard registered: reserve the physical space before workers start.
  if (Status st = store.ReserveCapacity(); !st.ok()) {
    out.files.clear();
    return st.WithContext(std::string("--ssd-backend ") + (explicit_cufile ? "cufile" : "auto") +
                          " selected cuFile, which needs the whole --ssd-cache-capacity of " +
                          FormatByteSize(o.ssd_cache_capacity) +
                          " reserved up front; choose a capacity that fits the file system");
  }
  out.cufile = true;
  out.reason = "cuFile (" + std::string(explicit_cufile ? "--ssd-backend cufile" : "auto") + "; " +
               *driver + "; " + std::to_string(shards.count()) + " shards registered and " +
               FormatByteSize(o.ssd_cache_capacity) + " reserved)";
  return std::move(out);
}

}  // namespace orbitkv
