#include "orbitkv/options.h"

namespace orbitkv {

std::string_view SsdBackendName(SsdBackend b) {
  switch (b) {
    case SsdBackend::kAuto:
      return "auto";
    case SsdBackend::kUring:
      return "uring";
    case SsdBackend::kCufile:
      return "cufile";
  }
  return "?";
}

std::string_view SsdReadPathName(SsdReadPath p) {
  return p == SsdReadPath::kUring ? "uring" : "cufile";
}

Status ManagerOptions::Validate() const {
  if (pool_size < (1u << 20)) return Status::InvalidArgument("--pool-size must be at least 1mib");
  if (!ssd_cache_path.empty()) {
    if (ssd_shards == 0 || ssd_shards > 256) {
      return Status::InvalidArgument("--ssd-shards must be between 1 and 256");
    }
    if (ssd_cache_capacity / ssd_shards < (1u << 20)) {
      return Status::InvalidArgument("--ssd-cache-capacity must give every shard at least 1mib");
    }
  }
  if (checkpoint_dram_percent > 100) {
    return Status::InvalidArgument("--checkpoint-dram-percent must be between 0 and 100");
  }
  if (ssd_queue_depth == 0 || ssd_queue_depth > 4096) {
    return Status::InvalidArgument("--ssd-queue-depth must be between 1 and 4096");
  }
  if (ssd_io_workers == 0 || ssd_io_workers > 64) {
    return Status::InvalidArgument("--ssd-io-workers must be between 1 and 64");
  }
  if (codec_budget == 0) return Status::InvalidArgument("--codec-budget must be more than 0");
  if (max_query_ttl_ms == 0 || max_query_ttl_ms > 3600000) {
    return Status::InvalidArgument("--max-query-ttl-ms must be between 1 and 3600000 (1 h)");
  }
  return Status::OK();
}

}  // namespace orbitkv
