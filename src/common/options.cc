#include "orbitkv/options.h"

#include <algorithm>

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
  if (writeback_yield_ms > 1000) {
    return Status::InvalidArgument("--writeback-yield-ms must be between 0 (off) and 1000");
  }
  if (codec_budget == 0) return Status::InvalidArgument("--codec-budget must be more than 0");
  if (publish_batch_bytes < (64u << 10) || publish_batch_bytes > (1ull << 30)) {
    return Status::InvalidArgument("--publish-batch-bytes must be between 64kib and 1gib");
  }
  if (host_copy_threads > 64) {
    return Status::InvalidArgument("--host-copy-threads must be 0..64, got " +
                                   std::to_string(host_copy_threads));
  }
  if (publish_depth == 0 || publish_depth > 8) {
    return Status::InvalidArgument("--publish-depth must be between 1 and 8");
  }
  if (!ssd_cache_path.empty() && ssd_read_staging != 0 &&
      (ssd_read_staging < (64u << 10) || ssd_read_staging > pool_size / 2)) {
    return Status::InvalidArgument(
        "--ssd-read-staging must be auto or between 64kib and half of --pool-size");
  }
  if (ssd_read_run < (64u << 10) || ssd_read_run > (1ull << 30) || ssd_read_run % 4096 != 0) {
    return Status::InvalidArgument(
        "--ssd-read-run must be between 64kib and 1gib, a multiple of 4kib");
  }
  if (ssd_uring_gpu_staging != 0 &&
      (ssd_uring_gpu_staging < (1u << 20) || ssd_uring_gpu_staging > (4ull << 30))) {
    return Status::InvalidArgument("--ssd-uring-gpu-staging must be 0 or between 1mib and 4gib");
  }
  if (max_query_ttl_ms == 0 || max_query_ttl_ms > 3600000) {
    return Status::InvalidArgument("--max-query-ttl-ms must be between 1 and 3600000 (1 h)");
  }
  return Status::OK();
}

uint64_t ManagerOptions::ReadStagingBytes() const {
  constexpr uint64_t kMiB = 1 << 20;
  uint64_t bytes = ssd_read_staging;
  if (bytes == 0) {
    const uint64_t want = 2ull * ssd_io_workers * ssd_queue_depth * kMiB;
    bytes = std::min(std::max(want, 64 * kMiB), pool_size / 4);
  }
  return bytes / 4096 * 4096;
}

}  // namespace orbitkv
