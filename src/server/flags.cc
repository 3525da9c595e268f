#include "server/flags.h"

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "codec/codec.h"
#include "orbitkv/units.h"

namespace orbitkv {

Result<ParsedFlags> ParseFlags(int argc, const char* const* argv, std::string* out) {
  ParsedFlags parsed;
  ManagerOptions& o = parsed.options;
  CLI::App app{
      "orbitkv-cache-manager: keeps engines' KV blocks in pinned DRAM and an SSD cache "
      "and restores them into engine pages on demand."};
  app.set_version_flag("--version", "orbitkv-cache-manager 0.1.0");
  std::string pool = "4gb", capacity = "512gb", backend = "auto", read_path, staging = "auto";
  app.add_option("--pool-size", pool, "Pinned DRAM pool size (e.g. 8gb, 512mib)")
      ->capture_default_str();
  std::string admission = "all";
  app.add_option("--admission", admission,
                 "all|reuse: DRAM admission of published objects (reuse: only keys seen before)")
      ->capture_default_str();
  app.add_option("--ssd-cache-path", o.ssd_cache_path,
                 "SSD cache file; shards are PATH, PATH.1, ... SSD caching is off without it")
      ->capture_default_str();
  app.add_option("--ssd-cache-capacity", capacity,
                 "SSD cache capacity over all shards; choose what fits the file system")
      ->capture_default_str();
  app.add_option("--ssd-backend", backend,
                 "auto|uring|cufile: auto tries native cuFile and uses io_uring when unavailable")
      ->capture_default_str();
  app.add_option("--ssd-read-path", read_path,
                 "uring|cufile: force the SSD demand-read route (default: unset, by capability)")
      ->default_str("unset");
  app.add_option("--ssd-shards", o.ssd_shards, "Number of SSD shard files")->capture_default_str();
  app.add_option("--ssd-queue-depth", o.ssd_queue_depth, "io_uring queue depth per I/O worker")
      ->capture_default_str();
  app.add_option("--ssd-io-workers", o.ssd_io_workers,
                 "io_uring workers (one ring each) for SSD reads and writeback")
      ->capture_default_str();
  app.add_option("--ssd-read-staging", staging,
                 "Pinned staging for SSD reads, taken from --pool-size: a size, or auto (2 x "
                 "--ssd-io-workers x --ssd-queue-depth x 1mib, within 64mib..pool/4)")
      ->capture_default_str();
  std::string read_run = std::to_string(o.ssd_read_run >> 20) + "mib";
  app.add_option("--ssd-read-run", read_run,
                 "Most bytes a restore reads into the SSD read staging before their copy-out "
                 "starts (runs of whole objects; the next run is read while one is copied, and "
                 "each run is an I/O worker's reads in flight)")
      ->capture_default_str();
  std::string uring_gpu = std::to_string(o.ssd_uring_gpu_staging >> 20) + "mib";
  app.add_option("--ssd-uring-gpu-staging", uring_gpu,
                 "io_uring restores into CUDA pages: GPU memory per device (two buffers) in "
                 "which the GPU checks a run's CRC32C before scattering it (objects larger than "
                 "a buffer: in place in the read staging); 0: the CPU checks")
      ->capture_default_str();
  app.add_option("--max-query-ttl-ms", o.max_query_ttl_ms,
                 "Longest query lease (ttl_ms) an engine may ask for; longer ones are refused")
      ->capture_default_str();
  std::string codec_budget = std::to_string(o.codec_budget >> 20) + "mib";
  app.add_option("--storage-codec", o.storage_codec,
                 "none|ans|fp8|turboquant-4|turboquant-3: codec of SSD objects of namespaces "
                 "whose engine does not ask for one (lossy ones need the engine's dtype and "
                 "head_dim)")
      ->capture_default_str();
  std::string dram_copy = o.codec_dram_copy_encoded ? "encoded" : "raw";
  app.add_option("--codec-dram-copy", dram_copy,
                 "raw|encoded: what DRAM keeps of an encoded namespace's object once writeback "
                 "encoded it (encoded: less pool per object, GPU decode into CUDA pages)")
      ->capture_default_str();
  std::string publish_batch = std::to_string(o.publish_batch_bytes >> 20) + "mib";
  app.add_option("--publish-batch-bytes", publish_batch,
                 "Publish of CUDA pages: the largest D2H batch (one copy job; a call's last "
                 "batches are smaller)")
      ->capture_default_str();
  app.add_option("--writeback-yield-ms", o.writeback_yield_ms,
                 "Restores before writeback: while restores read from SSD, a writeback lane "
                 "waits up to this long before each write, then writes one object (0 off)")
      ->capture_default_str();
  app.add_option("--publish-depth", o.publish_depth,
                 "Publish of CUDA pages: D2H batches of one call in flight at once (1..8)")
      ->capture_default_str();
  app.add_option("--publish-gather", o.publish_gather,
                 "Publish of CUDA pages with slots of 16 KiB or less: one gather kernel per batch "
                 "with one descriptor per object, by an instance that writes every slot of its "
                 "group (false: a copy and a CRC per slot)")
      ->capture_default_str();
  app.add_option("--host-copy-threads", o.host_copy_threads,
                 "Restores into host pages: helper threads sharing a restore's memcpys with the "
                 "thread serving it (0: that thread alone; 0..64)")
      ->capture_default_str();
  app.add_option("--codec-budget", codec_budget,
                 "Codec memory: encoded output the SSD writeback lanes hold at once (split "
                 "between them)")
      ->capture_default_str();
  app.add_option("--socket", o.socket_path,
                 "Engine protocol Unix socket (default: $XDG_RUNTIME_DIR/orbitkv.sock, else "
                 "/tmp/orbitkv-$UID/orbitkv.sock in a private directory the Manager creates)")
      ->default_str("per user");
  protocol::ServerOptions& so = parsed.server;
  std::string request_buffer = std::to_string(so.max_buffered_bytes >> 20) + "mib";
  std::string frame_size = std::to_string(so.max_frame_payload >> 20) + "mib";
  uint64_t frame_timeout = so.frame_timeout.count(), idle_timeout = so.idle_timeout.count();
  uint64_t worker_spin_us = so.worker_spin.count();
  app.add_option("--max-connections", so.max_connections, "Engine connections open at once")
      ->capture_default_str();
  app.add_option("--max-connections-per-uid", so.max_connections_per_uid,
                 "Engine connections one uid may hold open at once")
      ->capture_default_str();
  app.add_option("--max-frame-size", frame_size, "Largest protocol message (at most 1gib)")
      ->capture_default_str();
  app.add_option("--max-fds-per-frame", so.max_fds_per_frame,
                 "Most file descriptors one protocol message may carry")
      ->capture_default_str();
  app.add_option("--max-request-buffer", request_buffer,
                 "Bytes of protocol messages buffered over all connections (>= --max-frame-size); "
                 "a message that does not fit waits")
      ->capture_default_str();
  app.add_option("--frame-timeout-ms", frame_timeout,
                 "A message begun must arrive whole within this; 0 = no limit")
      ->capture_default_str();
  app.add_option("--idle-timeout-ms", idle_timeout,
                 "Close connections without a registered instance after this long without a "
                 "request; 0 = never")
      ->capture_default_str();
  app.add_option("--protocol-threads", so.worker_threads,
                 "Threads that handle engine requests (connections share them)")
      ->capture_default_str();
  app.add_option("--protocol-spin-us", worker_spin_us,
                 "How long a request thread that just ran a request polls for the next one "
                 "before sleeping (one at a time), and how long the socket loop polls after "
                 "it handled a request or reply before blocking (0: off, at most 1000)")
      ->capture_default_str();
  app.add_option("--checkpoint-dram-percent", o.checkpoint_dram_percent,
                 "Share of the pool (0..100) that hybrid models' written-back recurrent "
                 "checkpoints may hold; the least recently used beyond it stay on SSD only")
      ->capture_default_str();
  app.add_option("--metrics-port", o.metrics_port, "Prometheus /metrics on 127.0.0.1; 0 = off")
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace|debug|info|warn|error")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (out) *out = app.help();
    parsed.exit_now = true;
    return parsed;
  } catch (const CLI::CallForVersion&) {
    if (out) *out = app.version() + "\n";
    parsed.exit_now = true;
    return parsed;
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    // CLI11 messages name the option for conversion errors; keep them on one line.
    for (char& c : msg) {
      if (c == '\n') c = ' ';
    }
    return Status::InvalidArgument(msg);
  }

  auto size_flag = [](const char* flag, const std::string& v, uint64_t* dst) -> Status {
    Result<uint64_t> r = ParseByteSize(v);
    if (!r.ok())
      return Status::InvalidArgument(std::string(flag) + ": " + std::string(r.status().message()));
    *dst = *r;
    return Status::OK();
  };
  ORBITKV_RETURN_IF_ERROR(size_flag("--pool-size", pool, &o.pool_size));
  ORBITKV_RETURN_IF_ERROR(size_flag("--ssd-cache-capacity", capacity, &o.ssd_cache_capacity));
  ORBITKV_RETURN_IF_ERROR(size_flag("--codec-budget", codec_budget, &o.codec_budget));
  ORBITKV_RETURN_IF_ERROR(
      size_flag("--publish-batch-bytes", publish_batch, &o.publish_batch_bytes));
  if (Result<codec::CodecId> c = codec::ParseCodecName(o.storage_codec); !c.ok()) {
    return Status::InvalidArgument("--storage-codec: " + std::string(c.status().message()));
  }
  if (dram_copy == "raw" || dram_copy == "encoded") {
    o.codec_dram_copy_encoded = dram_copy == "encoded";
  } else {
    return Status::InvalidArgument("--codec-dram-copy: '" + dram_copy +
                                   "' is not one of raw, encoded");
  }
  if (staging != "auto")
    ORBITKV_RETURN_IF_ERROR(size_flag("--ssd-read-staging", staging, &o.ssd_read_staging));
  ORBITKV_RETURN_IF_ERROR(size_flag("--ssd-read-run", read_run, &o.ssd_read_run));
  ORBITKV_RETURN_IF_ERROR(
      size_flag("--ssd-uring-gpu-staging", uring_gpu, &o.ssd_uring_gpu_staging));
  if (admission == "all" || admission == "reuse") {
    o.admission_reuse = admission == "reuse";
  } else {
    return Status::InvalidArgument("--admission: '" + admission + "' is not one of all, reuse");
  }
  // Environment switches: read here, once, like the flags.
  if (const char* c = std::getenv(kCostObservationsEnv); c && std::string(c) == "1") {
    o.cost_observations = true;
  }
  if (backend == "auto")
    o.ssd_backend = SsdBackend::kAuto;
  else if (backend == "uring")
    o.ssd_backend = SsdBackend::kUring;
  else if (backend == "cufile")
    o.ssd_backend = SsdBackend::kCufile;
  else
    return Status::InvalidArgument("--ssd-backend: '" + backend +
                                   "' is not one of auto, uring, cufile");
  if (read_path.empty())
    o.ssd_read_path.reset();
  else if (read_path == "uring")
    o.ssd_read_path = SsdReadPath::kUring;
  else if (read_path == "cufile")
    o.ssd_read_path = SsdReadPath::kCufile;
  else
    return Status::InvalidArgument("--ssd-read-path: '" + read_path +
                                   "' is not one of uring, cufile");
  uint64_t frame_bytes = 0;
  ORBITKV_RETURN_IF_ERROR(size_flag("--max-frame-size", frame_size, &frame_bytes));
  if (frame_bytes < 4096 || frame_bytes > (1ull << 30)) {
    return Status::InvalidArgument("--max-frame-size: " + frame_size + " is outside 4kib..1gib");
  }
  so.max_frame_payload = static_cast<uint32_t>(frame_bytes);
  ORBITKV_RETURN_IF_ERROR(
      size_flag("--max-request-buffer", request_buffer, &so.max_buffered_bytes));
  constexpr uint64_t kMaxTimeoutMs = 86'400'000;  // a day
  if (frame_timeout > kMaxTimeoutMs || idle_timeout > kMaxTimeoutMs) {
    return Status::InvalidArgument(
        std::string(frame_timeout > kMaxTimeoutMs ? "--frame-timeout-ms" : "--idle-timeout-ms") +
        ": more than a day");
  }
  so.frame_timeout = std::chrono::milliseconds(frame_timeout);
  so.idle_timeout = std::chrono::milliseconds(idle_timeout);
  if (worker_spin_us > 1000) return Status::InvalidArgument("--protocol-spin-us: more than 1000");
  so.worker_spin = std::chrono::microseconds(worker_spin_us);
  for (auto [flag, v] : {std::pair{"--max-connections", so.max_connections},
                         std::pair{"--max-connections-per-uid", so.max_connections_per_uid},
                         std::pair{"--protocol-threads", so.worker_threads}}) {
    if (v == 0) return Status::InvalidArgument(std::string(flag) + ": must be at least 1");
  }
  if (so.max_buffered_bytes < so.max_frame_payload) {
    return Status::InvalidArgument("--max-request-buffer: " + request_buffer +
                                   " is below --max-frame-size " + frame_size);
  }
  ORBITKV_RETURN_IF_ERROR(o.Validate());
  return parsed;
}

}  // namespace orbitkv
