#include "server/flags.h"

#include <gtest/gtest.h>

namespace orbitkv {
namespace {

Result<ParsedFlags> Parse(std::vector<const char*> args, std::string* out = nullptr) {
  args.insert(args.begin(), "orbitkv-cache-manager");
  return ParseFlags(static_cast<int>(args.size()), args.data(), out);
}

TEST(Flags, DefaultsMatchTheSpec) {
  auto p = Parse({});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->options.ssd_backend, SsdBackend::kAuto);
  EXPECT_FALSE(p->options.ssd_read_path.has_value());
  EXPECT_EQ(p->options.ssd_cache_capacity, 512ull * 1000 * 1000 * 1000);
  EXPECT_TRUE(p->options.ssd_cache_path.empty());
  EXPECT_EQ(p->options.max_query_ttl_ms, 60000u);
  EXPECT_EQ(p->options.storage_codec, "none");  // compression is off by default
  EXPECT_EQ(p->options.codec_budget, 256ull << 20);
  EXPECT_EQ(p->options.publish_batch_bytes, 16ull << 20);
  EXPECT_EQ(p->options.publish_depth, 2u);
  EXPECT_TRUE(p->options.publish_gather);
  EXPECT_EQ(p->options.writeback_yield_ms, 20u);
  EXPECT_EQ(p->options.ssd_uring_gpu_staging, 32ull << 20);
  EXPECT_FALSE(p->options.codec_dram_copy_encoded);  // DRAM keeps raw copies
}

TEST(Flags, HelpListsEveryFlagWithItsDefault) {
  std::string help;
  auto p = Parse({"--help"}, &help);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->exit_now);
  for (const char* want : {"--pool-size",
                           "--ssd-cache-path",
                           "--ssd-cache-capacity",
                           "512gb",
                           "--ssd-backend",
                           "auto",
                           "--ssd-read-path",
                           "unset",
                           "--metrics-port",
                           "9464",
                           "--ssd-shards",
                           "--ssd-queue-depth",
                           "--ssd-io-workers",
                           "--ssd-read-staging",
                           "--ssd-read-run",
                           "8mib",
                           "--socket",
                           "--admission",
                           "--max-query-ttl-ms",
                           "60000",
                           "--storage-codec",
                           "none",
                           "--codec-budget",
                           "--codec-dram-copy",
                           "--publish-batch-bytes",
                           "--publish-depth",
                           "--publish-gather",
                           "--protocol-spin-us",
                           "16mib",
                           "256mib"}) {
    EXPECT_NE(help.find(want), std::string::npos) << want << "\n" << help;
  }
}

TEST(Flags, ParsesValues) {
  auto p = Parse({"--pool-size",          "8gb",   "--ssd-cache-path",      "/x/cache.bin",
                  "--ssd-cache-capacity", "100gb", "--ssd-backend",         "cufile",
                  "--ssd-read-path",      "uring", "--ssd-shards",          "8",
                  "--ssd-queue-depth",    "128",   "--metrics-port",        "0",
                  "--max-query-ttl-ms",   "5000",  "--storage-codec",       "turboquant-3",
                  "--codec-budget",       "1gib",  "--publish-batch-bytes", "4mib"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->options.pool_size, 8ull * 1000 * 1000 * 1000);
  EXPECT_EQ(p->options.ssd_cache_capacity, 100ull * 1000 * 1000 * 1000);
  EXPECT_EQ(p->options.ssd_backend, SsdBackend::kCufile);
  EXPECT_EQ(p->options.ssd_read_path, SsdReadPath::kUring);
  EXPECT_EQ(p->options.ssd_shards, 8u);
  EXPECT_EQ(p->options.ssd_queue_depth, 128u);
  EXPECT_EQ(p->options.metrics_port, 0);
  EXPECT_EQ(p->options.max_query_ttl_ms, 5000u);
  EXPECT_EQ(p->options.storage_codec, "turboquant-3");
  EXPECT_EQ(p->options.codec_budget, 1ull << 30);
  EXPECT_EQ(p->options.publish_batch_bytes, 4ull << 20);
  for (auto [v, want] : {std::pair{"0", uint64_t{0}}, std::pair{"1mib", uint64_t{1} << 20},
                         std::pair{"4gib", uint64_t{4} << 30}}) {
    auto g = Parse({"--ssd-uring-gpu-staging", v});
    ASSERT_TRUE(g.ok()) << v << ": " << g.status().ToString();
    EXPECT_EQ(g->options.ssd_uring_gpu_staging, want) << v;
  }
  auto yield = Parse({"--writeback-yield-ms", "0"});
  ASSERT_TRUE(yield.ok()) << yield.status().ToString();
  EXPECT_EQ(yield->options.writeback_yield_ms, 0u);
  EXPECT_FALSE(Parse({"--writeback-yield-ms", "1001"}).ok());
  auto depth = Parse({"--publish-depth", "4"});
  ASSERT_TRUE(depth.ok()) << depth.status().ToString();
  EXPECT_EQ(depth->options.publish_depth, 4u);
  auto gather = Parse({"--publish-gather", "false"});
  ASSERT_TRUE(gather.ok()) << gather.status().ToString();
  EXPECT_FALSE(gather->options.publish_gather);
  EXPECT_FALSE(Parse({"--publish-gather", "maybe"}).ok());
  EXPECT_EQ(Parse({})->options.host_copy_threads, 0u);
  auto helpers = Parse({"--host-copy-threads", "3"});
  ASSERT_TRUE(helpers.ok()) << helpers.status().ToString();
  EXPECT_EQ(helpers->options.host_copy_threads, 3u);
  EXPECT_FALSE(Parse({"--host-copy-threads", "65"}).ok());
  auto e = Parse({"--codec-dram-copy", "encoded"});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e->options.codec_dram_copy_encoded);
}

// The 64 MiB read staging of before capped the io_uring route (issue 18): it
// now follows the I/O workers' queue depth unless set.
TEST(Flags, SsdReadStagingIsAutoFromTheQueueDepthOrASize) {
  auto d = Parse({"--pool-size", "4gib"});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->options.ssd_read_staging, 0u);
  EXPECT_EQ(d->options.ReadStagingBytes(), 2ull * 2 * 64 << 20);  // 2 x workers x depth x 1 MiB
  auto small = Parse({"--pool-size", "128mib"});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->options.ReadStagingBytes(), 32u << 20);  // within a quarter of the pool
  auto deep = Parse({"--pool-size", "64gib", "--ssd-queue-depth", "256", "--ssd-io-workers", "4"});
  ASSERT_TRUE(deep.ok());
  EXPECT_EQ(deep->options.ReadStagingBytes(), 2ull * 4 * 256 << 20);
  auto set = Parse({"--ssd-cache-path", "/x", "--ssd-read-staging", "96mib"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->options.ReadStagingBytes(), 96u << 20);
}

// A restore's run of SSD reads before its copy-out starts: 8 MiB unless set.
TEST(Flags, SsdReadRunIsEightMibOrASize) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->options.ssd_read_run, 8u << 20);
  auto set = Parse({"--ssd-read-run", "32mib"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->options.ssd_read_run, 32u << 20);
}

TEST(Flags, ProtocolLimits) {
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->server.max_connections, 1024u);
  EXPECT_EQ(d->server.max_buffered_bytes, 256ull << 20);
  EXPECT_EQ(d->server.max_frame_payload, 64u << 20);
  EXPECT_EQ(d->server.idle_timeout, std::chrono::milliseconds(60000));
  EXPECT_EQ(d->server.worker_spin, std::chrono::microseconds(50));
  auto p = Parse({"--max-connections", "4096", "--max-connections-per-uid", "100",
                  "--max-frame-size", "1mib", "--max-fds-per-frame", "8", "--max-request-buffer",
                  "2mib", "--frame-timeout-ms", "500", "--idle-timeout-ms", "0",
                  "--protocol-threads", "2", "--protocol-spin-us", "0"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->server.max_connections, 4096u);
  EXPECT_EQ(p->server.max_connections_per_uid, 100u);
  EXPECT_EQ(p->server.max_frame_payload, 1u << 20);
  EXPECT_EQ(p->server.max_fds_per_frame, 8u);
  EXPECT_EQ(p->server.max_buffered_bytes, 2u << 20);
  EXPECT_EQ(p->server.frame_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(p->server.idle_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(p->server.worker_threads, 2u);
  EXPECT_EQ(p->server.worker_spin, std::chrono::microseconds(0));
  EXPECT_TRUE(p->server.path.empty());
}

TEST(Flags, BadValuesNameTheFlagOnOneLine) {
  struct Case {
    std::vector<const char*> args;
    const char* flag;
  };
  for (const Case& c : std::vector<Case>{
           {{"--pool-size", "8 gb"}, "--pool-size"},
           {{"--pool-size", "-1gb"}, "--pool-size"},
           {{"--ssd-cache-capacity", "1.5.gb"}, "--ssd-cache-capacity"},
           {{"--ssd-cache-capacity", "12zb"}, "--ssd-cache-capacity"},
           {{"--ssd-backend", "spdk"}, "--ssd-backend"},
           {{"--admission", "lru"}, "--admission"},
           {{"--storage-codec", "zstd"}, "--storage-codec"},
           {{"--storage-codec", ""}, "--storage-codec"},
           {{"--codec-budget", "lots"}, "--codec-budget"},
           {{"--codec-budget", "0"}, "--codec-budget"},
           {{"--publish-batch-bytes", "32kib"}, "--publish-batch-bytes"},
           {{"--publish-batch-bytes", "2gib"}, "--publish-batch-bytes"},
           {{"--publish-batch-bytes", "lots"}, "--publish-batch-bytes"},
           {{"--publish-depth", "0"}, "--publish-depth"},
           {{"--ssd-uring-gpu-staging", "512kib"}, "--ssd-uring-gpu-staging"},
           {{"--ssd-uring-gpu-staging", "5gib"}, "--ssd-uring-gpu-staging"},
           {{"--ssd-uring-gpu-staging", "lots"}, "--ssd-uring-gpu-staging"},
           {{"--publish-depth", "9"}, "--publish-depth"},
           {{"--protocol-spin-us", "1001"}, "--protocol-spin-us"},
           {{"--codec-dram-copy", "compressed"}, "--codec-dram-copy"},
           {{"--ssd-read-path", "auto"}, "--ssd-read-path"},
           {{"--ssd-queue-depth", "0"}, "--ssd-queue-depth"},
           {{"--ssd-queue-depth", "lots"}, "--ssd-queue-depth"},
           {{"--ssd-read-staging", "lots"}, "--ssd-read-staging"},
           {{"--ssd-cache-path", "/x", "--ssd-read-staging", "4kib"}, "--ssd-read-staging"},
           {{"--ssd-cache-path", "/x", "--pool-size", "1gib", "--ssd-read-staging", "600mib"},
            "--ssd-read-staging"},
           {{"--ssd-read-run", "32kib"}, "--ssd-read-run"},
           {{"--ssd-read-run", "2gib"}, "--ssd-read-run"},
           {{"--ssd-read-run", "10000"}, "--ssd-read-run"},
           {{"--ssd-read-run", "lots"}, "--ssd-read-run"},
           {{"--metrics-port", "70000"}, "--metrics-port"},
           {{"--max-query-ttl-ms", "0"}, "--max-query-ttl-ms"},
           {{"--max-query-ttl-ms", "3600001"}, "--max-query-ttl-ms"},
           {{"--ssd-cache-path", "/x", "--ssd-shards", "0"}, "--ssd-shards"},
           {{"--no-such-flag"}, "--no-such-flag"},
           {{"--max-connections", "0"}, "--max-connections"},
           {{"--max-connections-per-uid", "0"}, "--max-connections-per-uid"},
           {{"--protocol-threads", "0"}, "--protocol-threads"},
           {{"--max-frame-size", "2gib"}, "--max-frame-size"},
           {{"--max-request-buffer", "1mib"}, "--max-request-buffer"},
           {{"--max-request-buffer", "lots"}, "--max-request-buffer"},
           {{"--idle-timeout-ms", "999999999999"}, "--idle-timeout-ms"},
       }) {
    auto p = Parse(c.args);
    ASSERT_FALSE(p.ok()) << c.flag;
    const std::string msg(p.status().message());
    EXPECT_NE(msg.find(c.flag), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace orbitkv
