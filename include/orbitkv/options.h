// ManagerOptions: every knob of orbitkv-cache-manager, declared once with its
// default. src/server/flags.cc turns command-line flags into these (and prints
// the defaults in --help); the Manager library takes them as they are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "orbitkv/status.h"

namespace orbitkv {

enum class SsdBackend { kAuto, kUring, kCufile };
enum class SsdReadPath { kUring, kCufile };

std::string_view SsdBackendName(SsdBackend b);
std::string_view SsdReadPathName(SsdReadPath p);

// Environment switches, read by ParseFlags (src/server/flags.cc) only.
inline constexpr const char* kCostObservationsEnv = "ORBITKV_COST_OBSERVATIONS";

struct ManagerOptions {
  // DRAM tier.
  uint64_t pool_size = 4ull * 1000 * 1000 * 1000;  // --pool-size 4gb
  // all: keep every published object in DRAM; reuse: keep one in DRAM only
  // when its key was seen before (others go to SSD and leave DRAM).
  bool admission_reuse = false;  // --admission all|reuse (default all)
  // Hybrid models' recurrent checkpoints (tens of MiB each) may hold at most
  // this share of the pool once written back and unused; beyond it the least
  // recently used leave DRAM (their SSD copy stays), so a stream of
  // checkpoints never flushes the attention blocks. 100: no cap.
  uint32_t checkpoint_dram_percent = 25;  // --checkpoint-dram-percent
  // SSD tier. SSD caching is off when ssd_cache_path is empty.
  std::string ssd_cache_path;                                 // --ssd-cache-path
  uint64_t ssd_cache_capacity = 512ull * 1000 * 1000 * 1000;  // --ssd-cache-capacity 512gb
  SsdBackend ssd_backend = SsdBackend::kAuto;                 // --ssd-backend
  std::optional<SsdReadPath> ssd_read_path;                   // --ssd-read-path (unset)
  uint32_t ssd_shards = 4;                                    // --ssd-shards
  uint32_t ssd_queue_depth = 64;  // --ssd-queue-depth (per io_uring worker)
  uint32_t ssd_io_workers = 2;    // --ssd-io-workers
  // Restores before writeback on the disk: while a restore's io_uring reads
  // are queued or in flight, each writeback lane waits up to this long before
  // its next write and then writes one object at a time; it never waits
  // while a publisher waits for pool room. 0 off; at most 1000.
  uint32_t writeback_yield_ms = 20;  // --writeback-yield-ms
  // Pinned staging that SSD demand and warm-up reads land in, taken from
  // pool_size (--ssd-read-staging; 0 = auto, ReadStagingBytes()).
  uint64_t ssd_read_staging = 0;
  // The most a restore reads into the staging before its copy-out starts
  // (ReadStaging::Runs): a restore reads run after run, each run's copy
  // overlapping the next run's reads, so the copy left after the last read
  // is one run's. Smaller runs shorten that tail and let concurrent restores
  // share the staging; each run is also the depth of the reads in flight per
  // I/O worker. 64 KiB .. 1 GiB, 4 KiB aligned.
  uint64_t ssd_read_run = 8ull << 20;  // --ssd-read-run 8mib
  // io_uring restores into CUDA pages: device memory per GPU (two buffers of
  // half of it, outside pool_size, allocated on first use) into which a
  // run's objects are copied so that the GPU checks their CRC32C before any
  // byte reaches the pages (manager/gpu_checked_copy.h). 0: the CPU checks
  // them, as for host pages. 0 or 1 MiB..4 GiB.
  uint64_t ssd_uring_gpu_staging = 32ull << 20;  // --ssd-uring-gpu-staging 32mib
  // Queries: the longest lease a query may ask for (ttl_ms); larger ones are
  // refused, so a forgotten query holds its budget share for at most this.
  uint32_t max_query_ttl_ms = 60000;  // --max-query-ttl-ms
  // Storage codec of namespaces whose engine does not ask for one at register
  // (RegisterRequest::storage): none|ans|fp8|turboquant-4|turboquant-3
  // (README "Storage codecs"). Compression is off by default.
  std::string storage_codec = "none";  // --storage-codec
  // Codec memory: the encoded output the io_uring writeback lanes hold at
  // once (split between them); for the GPU codec path, retained encoded input
  // plus decoder scratch per worker. More than 0.
  uint64_t codec_budget = 256ull << 20;  // --codec-budget 256mib
  // What DRAM keeps of an encoded namespace's object once the writeback lane
  // encoded it for the SSD: raw (false: the published copy; DRAM restores
  // stay exact copies) or encoded (true: the encoded object replaces it, less
  // pool per object, and restores into CUDA pages move the encoded bytes and
  // decode on the GPU; lossy codecs then give the SSD's bytes from DRAM too).
  bool codec_dram_copy_encoded = false;  // --codec-dram-copy raw|encoded
  // Publish of CUDA pages: the largest D2H batch (one job; pipelined
  // --publish-depth deep, so a call holds at most depth x this of the pool
  // unsealed). 64 KiB to 1 GiB; a batch always takes at least one object.
  uint64_t publish_batch_bytes = 16ull << 20;  // --publish-batch-bytes 16mib
  // D2H jobs of one Publish call in flight at once (1..8; 1 = no overlap of
  // a batch's assembly with the previous batch's copies).
  uint32_t publish_depth = 2;  // --publish-depth
  // Publish of CUDA pages whose slots are 16 KiB or less (a 70B TP=8 rank's
  // 4 KiB): a batch is one gather kernel with one descriptor per object, the
  // slots' CRC32Cs computed as it copies (false: one copy and one CRC
  // descriptor per slot through the DRAM<->HBM mover). Only for an instance
  // that writes every slot of its group: a gather writes an object from its
  // first slot to its last, zeros between.
  bool publish_gather = true;  // --publish-gather
  // Restores into host pages: helper threads that share a restore's memcpys
  // with the thread serving it (manager/host_copier.h), so one large restore
  // is not held to one core's copy rate; 0: every copy on that thread (0..64).
  uint32_t host_copy_threads = 0;  // --host-copy-threads
  // Opt-in cost observations: orbitkv_cost_seconds{path} per SSD restore route
  // (environment ORBITKV_COST_OBSERVATIONS=1, read by ParseFlags).
  bool cost_observations = false;
  // Service.
  std::string socket_path;         // --socket (default: $XDG_RUNTIME_DIR or /tmp, per user)
  uint16_t metrics_port = 9464;    // --metrics-port; 0 disables /metrics
  std::string log_level = "info";  // --log-level

  // Checks cross-field rules (capacity vs shards, ...). The error names the flag.
  Status Validate() const;
  // The SSD read staging, 4 KiB aligned: ssd_read_staging, or with 0 (auto)
  // room for every I/O worker's queue depth of 1 MiB reads twice over (one
  // run read while the previous is copied out), within [64 MiB, pool / 4].
  uint64_t ReadStagingBytes() const;
};

}  // namespace orbitkv
