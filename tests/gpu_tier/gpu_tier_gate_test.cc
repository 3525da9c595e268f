// The GPU storage tier's gates (spec "Enable and qualify", issue 4 item 9),
// against an in-process Manager whose GPU platform is wrapped in fault
// injection. Built twice: over FakePlatform (CI, label unit) and over CUDA +
// cuFile (label gpu; compatibility-mode correctness on the CUDA test host,
// never GDS throughput). Every test checks exact page bytes and, at
// teardown, that leases, pins, reservations, workers, staging, mappings and
// platform resources are all released.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "codec/codec.h"
#include "gpu/fault_injecting_platform.h"
#include "gpu_tier/gate_env.h"
#include "manager/gpu_encode_lane.h"
#include "manager/manager.h"
#include "manager/storage_codec.h"
#include "store/object_format.h"
#include "store/shard_file.h"
#include "testing/temp_dir.h"

namespace orbitkv {
namespace {

using gpu::FaultInjectingPlatform;
using IoFault = FaultInjectingPlatform::IoFault;

BlockKey K(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[31] = 0x6b;
  return k;
}

uint8_t Pattern(uint64_t seed, uint32_t slot, uint64_t i) {
  return static_cast<uint8_t>(seed * 131 + slot * 31 + i * 7 + (i >> 9));
}

// A single-slot group whose object fills exactly `extent` bytes on SSD.
uint64_t SlotBytesForExtent(uint64_t extent) { return extent - ObjectHeaderSize(1); }

struct Engine {
  InstanceId id = 0;
  InstanceLayout layout;
  std::vector<testing::GateEnv::Pages> regions;
};

struct Options {
  uint32_t shards = 1;
  uint64_t capacity = 64u << 20;
  uint64_t pool = 32u << 20;
  SsdBackend backend = SsdBackend::kCufile;
  std::optional<SsdReadPath> read_path;
  uint64_t slot_bytes = 4u << 20;
  AdmissionPolicy admission = AdmissionPolicy::kReuse;  // published objects live on SSD
  bool publish_gpu_crc = true;
  bool publish_gather = true;  // --publish-gather
  bool dram_encoded = false;   // --codec-dram-copy encoded
  bool cost_observations = false;
  uint64_t publish_batch_bytes = 16u << 20;  // --publish-batch-bytes
  uint64_t uring_gpu_staging = 32u << 20;    // --ssd-uring-gpu-staging
};

class GpuTierGate : public ::testing::Test {
 protected:
  std::unique_ptr<testing::GateEnv> env;
  std::unique_ptr<FaultInjectingPlatform> faults;
  testing::TempDir dir;
  MetricsRegistry metrics;
  std::unique_ptr<Manager> mgr;
  SessionId session = 0;
  std::vector<Engine> engines;
  // The Manager's pinned arenas (the DRAM pool, read staging) as it registered them.
  std::vector<std::pair<uint8_t*, uint64_t>> arenas;

  void SetUp() override {
    env = testing::CreateGateEnv();
    if (std::string why = env->Unavailable(); !why.empty()) GTEST_SKIP() << why;
    faults = std::make_unique<FaultInjectingPlatform>(env->inner());
    engines.reserve(8);  // tests hold references to engines while registering more
  }

  void TearDown() override {
    if (!mgr) return;
    mgr->Drain();
    for (Engine& e : engines) {
      if (e.id) ASSERT_TRUE(mgr->UnregisterInstance(session, e.id).ok());
    }
    Manager::Gauges g = mgr->gauges();
    EXPECT_EQ(g.ssd_leases, 0u);
    EXPECT_EQ(g.ssd_pinned_bytes, 0u);
    EXPECT_EQ(g.ssd_reservations, 0u);
    EXPECT_EQ(g.dram.pinned_bytes, 0u);
    EXPECT_EQ(g.restores_inflight, 0u);
    EXPECT_EQ(g.queries, 0u);
    EXPECT_EQ(g.query_budget_used, 0u);
    EXPECT_EQ(g.gpu_workers, 0u);
    EXPECT_EQ(g.gpu_ipc_mappings, 0u);
    EXPECT_EQ(Gauge("orbitkv_ssd_gpu_staging_bytes"), 0);
    EXPECT_EQ(Gauge("orbitkv_ssd_cufile_inflight_batches"), 0);
    EXPECT_EQ(Plain("orbitkv_codec_budget_used_bytes"), 0);  // decode lanes gone with workers
    mgr.reset();
    for (Engine& e : engines) {
      for (auto& r : e.regions) env->Free(r);
    }
    EXPECT_EQ(env->Leaks(), "");
  }

  void Start(const Options& o) { StartWithCodecBudget(o, 256u << 20); }
  void StartWithCodecBudget(const Options& o, uint64_t codec_budget) {
    ManagerConfig c;
    c.options.codec_budget = codec_budget;
    c.options.pool_size = o.pool;
    c.options.ssd_cache_path = dir.File("cache.bin");
    c.options.ssd_cache_capacity = o.capacity;
    c.options.ssd_shards = o.shards;
    c.options.ssd_backend = o.backend;
    c.options.ssd_read_path = o.read_path;
    c.options.ssd_queue_depth = 8;
    c.options.ssd_io_workers = 1;
    c.options.admission_reuse = o.admission == AdmissionPolicy::kReuse;
    c.gpu_slot_bytes = o.slot_bytes;
    c.publish_gpu_crc = o.publish_gpu_crc;
    c.options.publish_gather = o.publish_gather;
    c.options.codec_dram_copy_encoded = o.dram_encoded;
    c.options.cost_observations = o.cost_observations;
    c.options.publish_batch_bytes = o.publish_batch_bytes;
    c.options.ssd_uring_gpu_staging = o.uring_gpu_staging;
    c.lock_memory = false;
    c.metrics = &metrics;
    c.gpu = faults.get();
    env->Configure(&c);
    c.register_host_memory = [this, inner = c.register_host_memory](void* base, uint64_t n) {
      arenas.push_back({static_cast<uint8_t*>(base), n});
      return inner ? inner(base, n) : Status::OK();
    };
    auto m = Manager::Create(c);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    mgr = std::move(m).value();
    session = mgr->OpenSession(getpid());
  }

  Engine& Register(const InstanceLayout& layout, const std::string& ns = "model",
                   const StorageCodecRequest& storage = {}) {
    Engine e;
    e.layout = layout;
    RegisterRequest r;
    r.ns = ns;
    r.storage = storage;
    r.device = "cuda:0";
    r.layout = layout;
    for (uint64_t b : layout.region_bytes) {
      e.regions.push_back(env->Allocate(b));
      r.ipc_handles.push_back(e.regions.back().handle);
    }
    auto id = mgr->RegisterInstance(session, r, {});
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    e.id = id.ok() ? *id : 0;
    engines.push_back(std::move(e));
    return engines.back();
  }

  gpu::DevPtr SlotPtr(const Engine& e, const SlotLayout& s, uint64_t page) {
    return e.regions[s.region].base + SlotPageOffset(s, page);
  }
  void Fill(const Engine& e, uint64_t page, uint64_t seed) {
    for (const SlotLayout& s : e.layout.groups[0].slots) {
      std::vector<uint8_t> b(s.bytes_per_page);
      for (uint64_t i = 0; i < b.size(); ++i) b[i] = Pattern(seed, s.slot_id, i);
      env->Write(SlotPtr(e, s, page), b.data(), b.size());
    }
  }
  void Scribble(const Engine& e, uint64_t page) {
    for (const SlotLayout& s : e.layout.groups[0].slots) {
      std::vector<uint8_t> b(s.bytes_per_page, 0xC3);
      env->Write(SlotPtr(e, s, page), b.data(), b.size());
    }
  }
  // Exact bytes of every slot of the page.
  ::testing::AssertionResult Holds(const Engine& e, uint64_t page, uint64_t seed) {
    for (const SlotLayout& s : e.layout.groups[0].slots) {
      std::vector<uint8_t> b(s.bytes_per_page);
      env->Read(b.data(), SlotPtr(e, s, page), b.size());
      for (uint64_t i = 0; i < b.size(); ++i) {
        if (b[i] != Pattern(seed, s.slot_id, i)) {
          return ::testing::AssertionFailure()
                 << "page " << page << " slot " << s.slot_id << " byte " << i << ": got "
                 << int(b[i]) << ", want " << int(Pattern(seed, s.slot_id, i)) << " (seed " << seed
                 << ")";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  PublishResult Publish(const Engine& e, uint64_t first_key, const std::vector<uint64_t>& pages,
                        std::vector<uint32_t> slots = {}) {
    PublishRequest p;
    p.instance = e.id;
    for (size_t i = 0; i < pages.size(); ++i) p.keys.push_back(K(first_key + i));
    p.pages = pages;
    p.slot_ids = std::move(slots);
    auto r = mgr->Publish(session, p);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : PublishResult{};
  }
  // Fills pages [0, n) with seeds first_key.. and publishes them.
  void FillAndPublish(const Engine& e, uint64_t first_key, uint64_t first_page, uint64_t n) {
    std::vector<uint64_t> pages;
    for (uint64_t i = 0; i < n; ++i) {
      Fill(e, first_page + i, first_key + i);
      pages.push_back(first_page + i);
    }
    PublishResult r = Publish(e, first_key, pages);
    EXPECT_EQ(r.sealed, n);
    mgr->Drain();
  }
  QueryResult Query(const Engine& e, uint64_t first_key, uint64_t n) {
    QueryRequest q;
    q.instance = e.id;
    for (uint64_t i = 0; i < n; ++i) q.keys.push_back(K(first_key + i));
    auto r = mgr->Query(session, q);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : QueryResult{};
  }
  // A restore held in the cuFile worker's two staging slots: keys 1..n
  // published from pages 0..n-1 of a fresh engine (on SSD only), restored
  // into pages 8..8+n-1 in batches of one object (64 KiB slots), the reads
  // held at the event level until both slots hold one.
  struct HeldRestore {
    Engine* engine = nullptr;
    RestoreId id = 0;
    std::future<Result<RestoreResult>> done;
  };
  void StartHeldRestore(uint32_t n, HeldRestore* out) {
    Options o;
    o.slot_bytes = 64u << 10;  // one object per batch
    ASSERT_NO_FATAL_FAILURE(Start(o));
    Engine& e = Register(SplitLayout(16, {SlotBytesForExtent(64 << 10)}));
    FillAndPublish(e, 1, 0, n);
    for (uint64_t p = 8; p < 8 + n; ++p) Scribble(e, p);
    QueryResult q = Query(e, 1, n);
    ASSERT_EQ(q.prefix, n);
    faults->HoldReads(true);
    std::vector<uint32_t> blocks(n);
    std::vector<uint64_t> pages(n);
    for (uint32_t b = 0; b < n; ++b) {
      blocks[b] = b;
      pages[b] = 8 + b;
    }
    auto done = std::make_shared<std::promise<Result<RestoreResult>>>();
    out->done = done->get_future();
    auto id = mgr->StartRestore(session, Req(e, q, std::move(blocks), std::move(pages)),
                                [done](Result<RestoreResult> r) { done->set_value(std::move(r)); });
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    out->engine = &e;
    out->id = *id;
    while (faults->held_events() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  RestoreRequest Req(const Engine& e, const QueryResult& q, std::vector<uint32_t> blocks,
                     std::vector<uint64_t> pages) {
    RestoreRequest r;
    r.instance = e.id;
    r.query = q.query;
    r.blocks = std::move(blocks);
    r.pages = std::move(pages);
    return r;
  }
  RestoreResult Restore(const RestoreRequest& r) {
    auto out = mgr->Restore(session, r);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : RestoreResult{};
  }
  // Query keys [first_key, +n) (all on tier `from`), restore them into `pages`,
  // expect exact bytes.
  void RestoreExact(const Engine& e, uint64_t first_key, const std::vector<uint64_t>& pages,
                    Tier from = Tier::kSsd) {
    const uint64_t n = pages.size();
    for (uint64_t p : pages) Scribble(e, p);
    QueryResult q = Query(e, first_key, n);
    ASSERT_EQ(q.prefix, n);
    for (Tier t : q.sources) EXPECT_EQ(t, from);
    std::vector<uint32_t> blocks;
    for (uint32_t i = 0; i < n; ++i) blocks.push_back(i);
    RestoreResult r = Restore(Req(e, q, blocks, pages));
    ASSERT_EQ(r.blocks.size(), n);
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(r.blocks[i].status.ok()) << r.blocks[i].status.ToString();
      EXPECT_TRUE(Holds(e, pages[i], first_key + i));
    }
  }

  // Every byte of every slot of the page is still Scribble's: nothing was scattered.
  ::testing::AssertionResult Untouched(const Engine& e, uint64_t page) {
    for (const SlotLayout& s : e.layout.groups[0].slots) {
      std::vector<uint8_t> b(s.bytes_per_page);
      env->Read(b.data(), SlotPtr(e, s, page), b.size());
      for (uint64_t i = 0; i < b.size(); ++i) {
        if (b[i] != 0xC3) {
          return ::testing::AssertionFailure()
                 << "page " << page << " slot " << s.slot_id << " byte " << i << " was written";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  // Where key v's object lies in the shard files: its header's magic and key.
  struct OnDisk {
    std::string path;
    uint64_t offset = 0;
  };
  OnDisk Find(uint64_t v, uint32_t shards = 1) {
    const BlockKey key = K(v);
    for (const std::string& path : ShardPaths(dir.File("cache.bin"), shards)) {
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) continue;
      for (uint64_t off = kShardHeaderSize; off + 4096 <= static_cast<uint64_t>(st.st_size);
           off += 4096) {
        const std::vector<uint8_t> h = ReadAt(path, off, kObjectHeaderFixedBytes);
        if (std::memcmp(h.data(), kObjectMagic, sizeof kObjectMagic) == 0 &&
            std::memcmp(h.data() + 32, key.data(), key.size()) == 0) {
          return {path, off};
        }
      }
    }
    ADD_FAILURE() << "key " << v << " is not on disk";
    return {};
  }
  // Overwrites bytes of a shard file behind the Manager's back (what a second
  // writer, a misdirected write or a bit flip on the medium would do).
  static void Overwrite(const std::string& path, uint64_t offset, const std::vector<uint8_t>& b) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(b.size()));
    ASSERT_EQ(::fdatasync(fd), 0);
    ::close(fd);
  }
  // Flips the bits `mask` of byte `at` of the object at `obj` on disk.
  static void Flip(const OnDisk& obj, uint64_t at, uint8_t mask) {
    std::vector<uint8_t> b = ReadAt(obj.path, obj.offset + at, 1);
    b[0] ^= mask;
    Overwrite(obj.path, obj.offset + at, b);
  }
  static std::vector<uint8_t> ReadAt(const std::string& path, uint64_t offset, uint64_t n) {
    std::vector<uint8_t> out(n);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    EXPECT_EQ(::pread(fd, out.data(), n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
    ::close(fd);
    return out;
  }
  // Restores key `key` (on SSD) into `page`; expects Corruption containing `why`
  // and, when `untouched`, not a byte scattered into the page. The damaged
  // object then leaves the SSD cache: the key is a miss.
  void ExpectCorruptRestore(const Engine& e, uint64_t key, uint64_t page, const std::string& why,
                            bool untouched = true) {
    const double dropped = Plain("orbitkv_ssd_corrupt_objects_dropped_total");
    Scribble(e, page);
    QueryResult q = Query(e, key, 1);
    ASSERT_EQ(q.prefix, 1u);
    ASSERT_EQ(q.sources[0], Tier::kSsd);
    RestoreResult r = Restore(Req(e, q, {0}, {page}));
    ASSERT_EQ(r.blocks.size(), 1u);
    EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
    EXPECT_NE(r.blocks[0].status.message().find(why), std::string::npos)
        << r.blocks[0].status.ToString();
    if (untouched) {
      EXPECT_TRUE(Untouched(e, page));
    }
    EXPECT_EQ(mgr->gauges().ssd_leases, 0u);
    EXPECT_EQ(Plain("orbitkv_ssd_corrupt_objects_dropped_total"), dropped + 1);
    EXPECT_EQ(Query(e, key, 1).prefix, 0u) << "key " << key << ": the damaged object is served";
  }
  // After ExpectCorruptRestore of the key at `page`: published again it is
  // stored, not skipped as already present (a key seen twice enters DRAM
  // under admission reuse, and its complete group goes to SSD through cuFile
  // as well), and restores exactly.
  void RepublishAndRestore(const Engine& e, uint64_t key, uint64_t page, uint64_t into) {
    const double ssd_objects = Plain("orbitkv_ssd_objects");
    FillAndPublish(e, key, page, 1);  // sealed: stored
    EXPECT_EQ(Plain("orbitkv_ssd_objects"), ssd_objects + 1) << "no new SSD copy of key " << key;
    RestoreExact(e, key, {into}, Tier::kDram);
  }

  double Counter(std::string_view name) { return metrics.Read(name, {{"device", "cuda:0"}}); }
  double Gauge(std::string_view name) { return metrics.Read(name, {{"device", "cuda:0"}}); }
  double Plain(std::string_view name, const Labels& l = {}) { return metrics.Read(name, l); }
  // Publishes `objects` objects of `slots`' bytes under a batch cap, restores
  // them byte for byte and returns the D2H jobs it took (cost observations).
  double PublishBatchesOf(uint64_t cap, uint64_t objects, std::vector<uint64_t> slots) {
    Options o;
    o.pool = 96u << 20;
    o.capacity = 128u << 20;
    o.cost_observations = true;
    o.publish_batch_bytes = cap;
    Start(o);
    Engine& e = Register(SplitLayout(objects, std::move(slots)));
    FillAndPublish(e, 1, 0, objects);
    std::vector<uint64_t> pages(objects);
    std::iota(pages.begin(), pages.end(), uint64_t{0});
    RestoreExact(e, 1, pages);
    // One pool entry per object, inside its assembly.
    EXPECT_EQ(Plain("orbitkv_cost_seconds", {{"path", "publish_pool_begin"}}),
              static_cast<double>(objects));
    EXPECT_EQ(Plain("orbitkv_cost_seconds", {{"path", "publish_assemble"}}),
              static_cast<double>(objects));
    return Plain("orbitkv_cost_seconds", {{"path", "d2h_copy_enqueue"}});
  }
  // Publishes pages [0, 24) as keys 1..24 with the next two D2H copies of
  // slot `slot` of page 20 refused (a batch's job, then that object's own
  // copy): the call fails with that error, and the 20 objects before it are
  // stored and restore exactly.
  void ExpectPage20RefusedKeepsTheObjectsBeforeIt(const Engine& e, size_t slot) {
    std::vector<uint64_t> pages;
    for (uint64_t p = 0; p < 24; ++p) {
      Fill(e, p, 1 + p);
      pages.push_back(p);
    }
    const SlotLayout& s = e.layout.groups[0].slots[slot];
    faults->RefuseCopiesFrom(SlotPtr(e, s, 20), s.bytes_per_page, 2,
                             Status::IOError("injected D2H failure of page 20", EIO));
    PublishRequest p;
    p.instance = e.id;
    for (uint64_t i = 0; i < 24; ++i) p.keys.push_back(K(1 + i));
    p.pages = pages;
    Result<PublishResult> r = mgr->Publish(session, p);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("injected D2H failure of page 20"), std::string::npos)
        << r.status().ToString();
    mgr->Drain();
    EXPECT_EQ(Query(e, 1, 24).prefix, 20u);
    RestoreExact(e, 1, std::vector<uint64_t>(pages.begin(), pages.begin() + 20));
  }
};

std::vector<uint64_t> Range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// ---- layouts and shapes -------------------------------------------------------

TEST_F(GpuTierGate, SplitLayoutWritesAndRestoresThroughCufile) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {3 * 4096, 6000, 4096}));
  FillAndPublish(e, 1, 0, 8);
  EXPECT_GT(Counter("orbitkv_ssd_cufile_write_bytes_total"), 0);
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "writeback_ssd"}}), 0);  // no io_uring copy
  RestoreExact(e, 1, Range(8, 8));
  EXPECT_GT(Counter("orbitkv_ssd_cufile_read_bytes_total"), 0);
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
}

TEST_F(GpuTierGate, PageFirstLayoutRestoresThroughCufile) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(PageFirstLayout(16, {8192, 4096, 2048}));
  FillAndPublish(e, 1, 0, 8);
  RestoreExact(e, 1, Range(8, 8));
  EXPECT_GT(Counter("orbitkv_ssd_cufile_read_bytes_total"), 0);
}

TEST_F(GpuTierGate, UnalignedComponentsScatterOnlyTheirBytes) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(PageFirstLayout(12, {1000, 3001, 77}));
  FillAndPublish(e, 1, 0, 6);
  RestoreExact(e, 1, Range(6, 6));
}

TEST_F(GpuTierGate, CheckpointLargerThanStagingIsSplitAcrossIt) {
  Options o;
  o.slot_bytes = 64u << 10;  // staging smaller than one object
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(4, {150001, 70001}));
  FillAndPublish(e, 1, 0, 2);
  RestoreExact(e, 1, {2, 3});
  EXPECT_GE(Counter("orbitkv_ssd_cufile_read_bytes_total"), 2 * 220000);
}

// ---- integrity (issue 10): never a wrong byte in a page ---------------------

TEST_F(GpuTierGate, CufileReadOfAnExtentHoldingAnotherKeysObjectIsCorruption) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {8192, 3000}));
  FillAndPublish(e, 1, 0, 2);
  const OnDisk one = Find(1), two = Find(2);
  const uint64_t extent = AlignUp(ObjectSize({8192, 3000}), 4096);
  Overwrite(one.path, one.offset, ReadAt(two.path, two.offset, extent));
  ExpectCorruptRestore(e, 1, 8, "object holds");
  RestoreExact(e, 2, {9});  // the other key is intact
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
}

TEST_F(GpuTierGate, CufileReadOfAFlippedPayloadByteIsCorruptionBeforeAnyScatter) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {8192, 3000}));
  FillAndPublish(e, 1, 0, 2);
  Flip(Find(1), SegmentLayout({8192, 3000})[1].offset + 1234, 0x04);
  ExpectCorruptRestore(e, 1, 8, "slot 1");
  RestoreExact(e, 2, {9});
}

TEST_F(GpuTierGate, CufileReadCorruptedInStagingIsCaughtByTheGpuCrc) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 1);
  // The read "completes" in full, but byte 100 of the payload came back wrong.
  faults->CorruptReads(1, ObjectHeaderSize(1) + 100, Pattern(1, 0, 100) ^ 0xFF);
  ExpectCorruptRestore(e, 1, 8, "payload CRC32C");
  RepublishAndRestore(e, 1, 0, 9);
}

TEST_F(GpuTierGate, WrongGpuCrcResultFailsTheBlock) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 1);
  faults->CorruptCrcs(1);
  ExpectCorruptRestore(e, 1, 8, "payload CRC32C");
  RepublishAndRestore(e, 1, 0, 9);
}

// A cuFile read that finds the object damaged on the medium drops it. Before,
// the damaged extent stayed in the SSD directory, so the next publish of the
// key was skipped as "already present" and the key was never cached again.
TEST_F(GpuTierGate, KeyRepublishedAfterACorruptCufileReadIsStoredAndRestoresExactly) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {8192, 3000}));
  FillAndPublish(e, 1, 0, 1);
  Flip(Find(1), SegmentLayout({8192, 3000})[0].offset + 10, 0x40);
  ExpectCorruptRestore(e, 1, 8, "slot 0");
  RepublishAndRestore(e, 1, 0, 9);
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
}

TEST_F(GpuTierGate, ObjectLargerThanStagingIsHeaderCheckedBeforeItsFirstScatter) {
  Options o;
  o.slot_bytes = 64u << 10;  // the objects span four staging slots
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(4, {150001, 70001}));
  FillAndPublish(e, 1, 0, 2);
  const OnDisk one = Find(1), two = Find(2);
  // Key 2's header over key 1's: the first piece fails, nothing is scattered.
  Overwrite(one.path, one.offset, ReadAt(two.path, two.offset, ObjectHeaderSize(2)));
  ExpectCorruptRestore(e, 1, 2, "object holds");
  // A flipped byte in key 2's last piece fails the block at that piece.
  Flip(two, ObjectSize({150001, 70001}) - 10, 0x80);
  ExpectCorruptRestore(e, 2, 3, "slot 1", /*untouched=*/false);
}

TEST_F(GpuTierGate, UringRouteRefusesAFlippedPayloadByteOfCudaPages) {
  Options o;
  o.read_path = SsdReadPath::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 2);
  Flip(Find(1), ObjectHeaderSize(1) + 7, 0x01);
  ExpectCorruptRestore(e, 1, 8, "payload CRC32C");
  RestoreExact(e, 2, {9});
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total"), 0);
}

// ---- io_uring restores into CUDA pages: the payload CRC32C on the GPU
// (issue 18: the CPU CRC was half of the route's Manager CPU per GB) ----------------

class UringGpuCheck : public GpuTierGate {
 protected:
  // A Manager with --ssd-backend uring and --ssd-uring-gpu-staging
  // `staging`, and one instance; null when the Manager did not start.
  Engine* Begin(const InstanceLayout& layout, uint64_t staging = 32u << 20) {
    Options o;
    o.backend = SsdBackend::kUring;
    o.uring_gpu_staging = staging;
    Start(o);
    return mgr ? &Register(layout) : nullptr;
  }
  double CrcBytes(const char* where) {
    return Plain("orbitkv_ssd_uring_crc_bytes_total", {{"where", where}});
  }
  // Objects larger than a GPU staging buffer (a 512 KiB and an 8 KiB slot;
  // 1 MiB of staging: two buffers of 512 KiB), keys 1 and 2 published.
  Engine* BeginWithObjectsLargerThanABuffer() {
    Engine* e = Begin(SplitLayout(16, {524288, 8192}), /*staging=*/1u << 20);
    if (e != nullptr) FillAndPublish(*e, 1, 0, 2);
    return e;
  }
  static double LargeObject() { return ObjectHeaderSize(2) + 524288 + 8192; }
  // The next CopyAsync with a source in any of the Manager's pinned arenas
  // (the read staging among them) is refused: "injected H2D refusal".
  void RefuseNextCopyFromTheArenas() {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& [base, bytes] : arenas) {
      lo = std::min(lo, reinterpret_cast<uint64_t>(base));
      hi = std::max(hi, reinterpret_cast<uint64_t>(base) + bytes);
    }
    faults->RefuseCopiesFrom(lo, hi - lo, 1, Status::Internal("injected H2D refusal"));
  }
};

// --ssd-read-path uring: a run's objects go H2D into GPU staging, the GPU
// checks every segment's CRC32C there, and only then are they scattered into
// the pages: exact bytes, every object byte counted as checked on the GPU,
// none on the CPU, one staging buffer (half of --ssd-uring-gpu-staging) held.
TEST_F(UringGpuCheck, UringRestoreIntoCudaPagesChecksTheCrcsOnTheGpu) {
  Engine* started = Begin(SplitLayout(16, {65536, 8192, 4096}));
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  FillAndPublish(e, 1, 0, 6);
  RestoreExact(e, 1, {8, 9, 10, 11, 12, 13});
  const double object = ObjectHeaderSize(3) + 65536 + 8192 + 4096;  // 512-aligned slots
  EXPECT_EQ(CrcBytes("gpu"), 6 * object);
  EXPECT_EQ(CrcBytes("cpu"), 0);
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_declined_total"), 0);
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_staging_bytes"), 16u << 20);
}

// Two runs of two objects (ReadStaging::Runs splits a restore of two objects
// or more), the second object of the first run damaged on disk: the GPU's
// CRCs catch it before the scatter, so its page keeps every byte it had and
// the object is dropped; the one beside it (same run, same H2D and CRC
// launch) and the next run restore exactly.
TEST_F(UringGpuCheck, UringGpuCheckScattersOnlyTheObjectsThatMatch) {
  Engine* started = Begin(SplitLayout(16, {65536, 8192}));
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  FillAndPublish(e, 1, 0, 4);
  Flip(Find(2), ObjectHeaderSize(2) + 65536 + 100, 0x40);  // slot 1's payload
  const std::vector<uint64_t> pages = {8, 9, 10, 11};
  for (uint64_t p : pages) Scribble(e, p);
  const double dropped = Plain("orbitkv_ssd_corrupt_objects_dropped_total");
  QueryResult q = Query(e, 1, 4);
  ASSERT_EQ(q.prefix, 4u);
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3}, pages));
  ASSERT_EQ(r.blocks.size(), 4u);
  for (size_t i : {0, 2, 3}) {
    EXPECT_TRUE(r.blocks[i].status.ok()) << i << ": " << r.blocks[i].status.ToString();
    EXPECT_TRUE(Holds(e, pages[i], 1 + i));
  }
  EXPECT_EQ(r.blocks[1].status.code(), StatusCode::kCorruption) << r.blocks[1].status.ToString();
  EXPECT_NE(r.blocks[1].status.message().find("payload CRC32C"), std::string::npos)
      << r.blocks[1].status.ToString();
  EXPECT_TRUE(Untouched(e, 9));
  EXPECT_EQ(Plain("orbitkv_ssd_corrupt_objects_dropped_total"), dropped + 1);
  EXPECT_EQ(Query(e, 2, 1).prefix, 0u) << "the damaged object is served";
  EXPECT_EQ(CrcBytes("cpu"), 0);
}

// --ssd-uring-gpu-staging 0: the CPU checks (one H2D job per block), no GPU
// staging is held; the same bytes.
TEST_F(UringGpuCheck, UringGpuStagingZeroChecksOnTheCpu) {
  Engine* started = Begin(SplitLayout(16, {65536, 8192}), /*staging=*/0);
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  FillAndPublish(e, 1, 0, 2);
  RestoreExact(e, 1, {8, 9});
  EXPECT_GT(CrcBytes("cpu"), 2 * (65536 + 8192));
  EXPECT_EQ(CrcBytes("gpu"), 0);
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_staging_bytes"), 0);
  Flip(Find(1), ObjectHeaderSize(2) + 7, 0x01);
  ExpectCorruptRestore(e, 1, 8, "payload CRC32C");
}

// An object larger than a staging buffer (1 MiB of staging: two of 512 KiB),
// a hybrid model's checkpoint in kind, is checked in place: the GPU reads the
// pinned read staging for its CRCs, then its slots go H2D into the pages.
// Exact bytes, every object byte counted on the GPU, nothing declined; a
// small one beside it goes through the staging as before.
TEST_F(UringGpuCheck, AnObjectLargerThanAGpuBufferIsCheckedInPlaceOnTheGpu) {
  Engine* started = BeginWithObjectsLargerThanABuffer();
  ASSERT_NE(started, nullptr);
  Engine& big = *started;
  Engine& small = Register(SplitLayout(16, {8192}), "small");
  FillAndPublish(small, 1, 0, 2);
  RestoreExact(big, 1, {8, 9});
  const double object = LargeObject();
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_declined_total"), 0);
  EXPECT_EQ(CrcBytes("cpu"), 0);
  EXPECT_EQ(CrcBytes("gpu"), 2 * object);
  RestoreExact(small, 1, {8, 9});
  EXPECT_EQ(CrcBytes("gpu"), 2 * object + 2 * (ObjectHeaderSize(1) + 8192));
  EXPECT_EQ(CrcBytes("cpu"), 0);
}

// A damaged object larger than a buffer: the in-place CRCs catch it before a
// byte is copied, so its page keeps every byte it had and the object is
// dropped; the one after it in the same restore is exact.
TEST_F(UringGpuCheck, ADamagedObjectLargerThanAGpuBufferFailsInPlaceUntouched) {
  Engine* started = BeginWithObjectsLargerThanABuffer();
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  Flip(Find(1), ObjectHeaderSize(2) + 524288 + 9, 0x08);  // slot 1's payload
  const std::vector<uint64_t> pages = {8, 9};
  for (uint64_t p : pages) Scribble(e, p);
  const double dropped = Plain("orbitkv_ssd_corrupt_objects_dropped_total");
  QueryResult q = Query(e, 1, 2);
  ASSERT_EQ(q.prefix, 2u);
  RestoreResult r = Restore(Req(e, q, {0, 1}, pages));
  ASSERT_EQ(r.blocks.size(), 2u);
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
  EXPECT_NE(r.blocks[0].status.message().find("payload CRC32C"), std::string::npos)
      << r.blocks[0].status.ToString();
  EXPECT_TRUE(Untouched(e, 8));
  EXPECT_TRUE(r.blocks[1].status.ok()) << r.blocks[1].status.ToString();
  EXPECT_TRUE(Holds(e, 9, 2));
  EXPECT_EQ(Plain("orbitkv_ssd_corrupt_objects_dropped_total"), dropped + 1);
  EXPECT_EQ(CrcBytes("cpu"), 0);
}

// An object checked in place whose H2D into the pages is refused (copies
// from the Manager's pinned arenas: the read staging it is read from): that
// block fails with the error and its page keeps every byte it had; the
// object is not corrupt, so it stays, and a second restore is exact.
TEST_F(UringGpuCheck, ARefusedCopyOfAnObjectCheckedInPlaceFailsItsBlockUntouched) {
  Engine* started = BeginWithObjectsLargerThanABuffer();
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  Scribble(e, 8);
  ASSERT_FALSE(arenas.empty());
  RefuseNextCopyFromTheArenas();
  QueryResult q = Query(e, 1, 1);
  ASSERT_EQ(q.prefix, 1u);
  RestoreResult r = Restore(Req(e, q, {0}, {8}));
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kInternal) << r.blocks[0].status.ToString();
  EXPECT_NE(r.blocks[0].status.message().find("injected H2D refusal"), std::string::npos);
  EXPECT_TRUE(Untouched(e, 8));
  EXPECT_EQ(Plain("orbitkv_ssd_corrupt_objects_dropped_total"), 0);
  RestoreExact(e, 1, {8, 9});
}

// Where the device cannot read the host copy (DenyKernelHostReads), or the
// in-place CRC launch fails, the large object is declined before any page
// byte is written and the CPU checks it: exact bytes either way.
TEST_F(UringGpuCheck, ALargeObjectTheGpuCannotCheckInPlaceIsCheckedOnTheCpu) {
  Engine* started = BeginWithObjectsLargerThanABuffer();
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  faults->DenyKernelHostReads(true);
  RestoreExact(e, 1, {8, 9});
  faults->DenyKernelHostReads(false);
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_declined_total"), 2);
  EXPECT_GT(CrcBytes("cpu"), 2 * 524288);
  EXPECT_EQ(CrcBytes("gpu"), 0);
  faults->RefuseCrcs(1, Status::Internal("injected CRC launch failure"));
  RestoreExact(e, 1, {8, 9});  // the first object declined, the second checked in place
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_declined_total"), 3);
  EXPECT_EQ(CrcBytes("gpu"), LargeObject());
}

// No device memory for the staging (its first Allocate refused): the
// restore is exact through the CPU check, every block counted as declined,
// nothing held; the buffer is not asked for again (a second restore stays on
// the CPU, no second Allocate is attempted: the knob's second refusal is
// left over).
TEST_F(UringGpuCheck, NoDeviceMemoryForTheStagingKeepsTheCpuCheck) {
  Engine* started = Begin(SplitLayout(16, {65536, 8192}));
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  FillAndPublish(e, 1, 0, 4);
  faults->FailAllocations(2, Status::ResourceExhausted("injected: device memory full"));
  RestoreExact(e, 1, {8, 9, 10, 11});
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_declined_total"), 4);
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_staging_bytes"), 0);
  EXPECT_EQ(CrcBytes("gpu"), 0);
  RestoreExact(e, 1, {8, 9, 10, 11});
  EXPECT_EQ(Plain("orbitkv_ssd_uring_gpu_declined_total"), 8);
  EXPECT_EQ(CrcBytes("gpu"), 0);
  // The second refusal was never consumed: this Allocate gets it.
  EXPECT_FALSE(faults->device(0).value()->Allocate(4096).ok());
  faults->FailAllocations(0, Status::OK());
}

// The H2D into GPU staging refused (the copy of the read staging's bytes)
// for the first of a restore's two runs: both of its blocks fail with that
// error and neither page is written; the second run restores exactly; the
// objects are not corrupt, so they stay and a second restore is exact.
TEST_F(UringGpuCheck, AFailedCopyIntoGpuStagingFailsTheRunAndTouchesNoPage) {
  Engine* started = Begin(SplitLayout(16, {65536, 8192}));
  ASSERT_NE(started, nullptr);
  Engine& e = *started;
  FillAndPublish(e, 1, 0, 4);
  const std::vector<uint64_t> pages = {8, 9, 10, 11};
  for (uint64_t p : pages) Scribble(e, p);
  // Copies from any of the Manager's pinned arenas (the read staging among
  // them): the restore's first CopyAsync is the first run's H2D.
  ASSERT_FALSE(arenas.empty());
  RefuseNextCopyFromTheArenas();
  QueryResult q = Query(e, 1, 4);
  ASSERT_EQ(q.prefix, 4u);
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3}, pages));
  ASSERT_EQ(r.blocks.size(), 4u);
  for (size_t i : {0, 1}) {
    EXPECT_EQ(r.blocks[i].status.code(), StatusCode::kInternal) << r.blocks[i].status.ToString();
    EXPECT_NE(r.blocks[i].status.message().find("injected H2D refusal"), std::string::npos);
    EXPECT_TRUE(Untouched(e, pages[i]));
  }
  for (size_t i : {2, 3}) {
    EXPECT_TRUE(r.blocks[i].status.ok()) << i << ": " << r.blocks[i].status.ToString();
    EXPECT_TRUE(Holds(e, pages[i], 1 + i));
  }
  EXPECT_EQ(Plain("orbitkv_ssd_corrupt_objects_dropped_total"), 0);
  RestoreExact(e, 1, pages);
}

// ---- Publish's segment CRCs on the GPU (issue 18: the CPU CRC of every
// published byte capped HBM -> DRAM publish at about 10 GB/s) ----------------------

// --ssd-backend uring: CUDA pages go D2H into the pool and io_uring writes
// them back; the segment CRCs in the object header come from the GPU's CRC32C
// kernel over the pages, and the SSD restore (which checks every segment's
// CRC before a byte is copied) is exact.
TEST_F(GpuTierGate, UringPublishOfCudaPagesTakesItsSegmentCrcsFromTheGpu) {
  Options o;
  o.backend = SsdBackend::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {65536, 8192, 4096}));
  FillAndPublish(e, 1, 0, 6);
  RestoreExact(e, 1, {8, 9, 10, 11, 12, 13});
  const double gpu = Plain("orbitkv_publish_crc_bytes_total", {{"where", "gpu"}});
  EXPECT_EQ(gpu, 6.0 * (65536 + 8192 + 4096));
  EXPECT_EQ(Plain("orbitkv_publish_crc_bytes_total", {{"where", "cpu"}}), 0);
}

// The GPU's CRCs are the CPU's: the same pages published with the CRC on
// either side leave identical object headers on SSD.
TEST_F(GpuTierGate, GpuAndCpuPublishCrcsWriteIdenticalHeaders) {
  std::vector<uint8_t> headers[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    Options o;
    o.backend = SsdBackend::kUring;
    o.publish_gpu_crc = gpu == 1;
    ASSERT_NO_FATAL_FAILURE(Start(o));
    Engine& e = Register(SplitLayout(16, {65536, 8192}));
    FillAndPublish(e, 1, 0, 1);
    const OnDisk d = Find(1);
    headers[gpu] = ReadAt(d.path, d.offset, ObjectHeaderSize(2));
    EXPECT_GT(Plain("orbitkv_publish_crc_bytes_total", {{"where", gpu ? "gpu" : "cpu"}}), 0);
    RestoreExact(e, 1, {8});
    mgr->Drain();
    ASSERT_TRUE(mgr->UnregisterInstance(session, e.id).ok());
    e.id = 0;
    for (auto& r : e.regions) env->Free(r);  // TearDown frees only with a Manager left
    e.regions.clear();
    mgr.reset();
    for (const std::string& path : ShardPaths(dir.File("cache.bin"), 1)) ::unlink(path.c_str());
  }
  EXPECT_EQ(headers[0], headers[1]);
}

// A wrong CRC from the GPU at publish is caught where it matters: the SSD
// restore refuses the object (Corruption, the page untouched), never wrong bytes.
TEST_F(GpuTierGate, AWrongGpuCrcAtPublishIsCorruptionOnTheSsdRestore) {
  Options o;
  o.backend = SsdBackend::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {8192}));
  faults->CorruptCrcs(1);
  FillAndPublish(e, 1, 0, 1);
  ExpectCorruptRestore(e, 1, 8, "payload CRC32C");
}

// ---- whole-object gathers of small slots (issue 18: the 70B TP=8 publish) --------

// Slots of 16 KiB or less (odd sizes among them) publish as whole-object
// gathers with their CRCs from the same kernel: 70 objects in a few batches,
// each one gather, leave on SSD exactly the objects (headers and payloads)
// that --publish-gather=false's slot-by-slot copies and CRC kernels leave,
// and restore byte-exact from SSD (every segment CRC checked).
TEST_F(GpuTierGate, GatheredPublishWritesTheObjectsSlotBySlotCopiesWrite) {
  const std::vector<uint64_t> slots = {4096, 1000, 16384, 48, 4112};
  constexpr uint64_t kObjects = 70;
  const uint64_t object = ObjectSize(slots);
  std::vector<uint8_t> written[2];
  for (int gather = 0; gather < 2; ++gather) {
    Options o;
    o.backend = SsdBackend::kUring;
    o.publish_gather = gather == 1;
    o.publish_batch_bytes = 1u << 20;  // several batches
    ASSERT_NO_FATAL_FAILURE(Start(o));
    faults->ResetCalls();
    Engine& e = Register(SplitLayout(kObjects + 8, slots));
    FillAndPublish(e, 1, 0, kObjects);
    EXPECT_EQ(faults->calls().gathered_objects, gather ? kObjects : 0u);
    EXPECT_EQ(faults->calls().gathers > 1, gather == 1) << faults->calls().gathers << " gathers";
    EXPECT_EQ(Plain("orbitkv_publish_crc_bytes_total", {{"where", "cpu"}}), 0);
    for (uint64_t k = 1; k <= kObjects; ++k) {
      const OnDisk d = Find(k);
      const std::vector<uint8_t> b = ReadAt(d.path, d.offset, object);
      written[gather].insert(written[gather].end(), b.begin(), b.end());
    }
    RestoreExact(e, 1, Range(8, kObjects));
    if (gather == 1) break;  // TearDown checks and releases everything
    mgr->Drain();
    ASSERT_TRUE(mgr->UnregisterInstance(session, e.id).ok());
    e.id = 0;  // its regions stay allocated until TearDown: the next ones differ in size
    mgr.reset();
    for (const std::string& path : ShardPaths(dir.File("cache.bin"), 1)) ::unlink(path.c_str());
  }
  EXPECT_TRUE(written[0] == written[1]) << "gathered objects differ from slot-by-slot ones";
}

// A gather refused for one object's page (a failed D2H of those pages): its
// batch is redone object by object, so the objects before the failing one are
// stored exactly and the call returns the error.
TEST_F(GpuTierGate, ARefusedGatherRedoesItsBatchObjectByObject) {
  Options o;
  o.backend = SsdBackend::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(32, {4096, 4096, 2048}));
  ExpectPage20RefusedKeepsTheObjectsBeforeIt(e, 1);
}

// A gather whose CRC launch fails: the batch is redone object by object with
// the CRCs on the CPU, every object stored exactly (the SSD restore checks
// them), and the next batches gather again.
TEST_F(GpuTierGate, AFailedGatherStoresItsBatchWithCpuCrcs) {
  Options o;
  o.backend = SsdBackend::kUring;
  o.publish_batch_bytes = 256u << 10;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(48, {8192, 8192, 8192}));
  faults->ResetCalls();
  faults->RefuseCrcs(1, Status::Internal("injected gather launch failure"));
  FillAndPublish(e, 1, 0, 40);
  EXPECT_GT(Plain("orbitkv_publish_crc_bytes_total", {{"where", "cpu"}}), 0);
  EXPECT_GT(Plain("orbitkv_publish_crc_bytes_total", {{"where", "gpu"}}), 0);
  EXPECT_GT(faults->calls().gathers, 0u);
  RestoreExact(e, 1, Range(0, 40));
}

// A device that does not gather (CreateSlotTable Unavailable): the same
// small slots publish slot by slot with GPU CRCs, exactly.
TEST_F(GpuTierGate, ADeviceThatDoesNotGatherPublishesSlotBySlot) {
  Options o;
  o.backend = SsdBackend::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  faults->DenySlotTables(true);
  faults->ResetCalls();
  Engine& e = Register(SplitLayout(16, {4096, 4096}));
  FillAndPublish(e, 1, 0, 8);
  EXPECT_EQ(faults->calls().gathers, 0u);
  EXPECT_EQ(Plain("orbitkv_publish_crc_bytes_total", {{"where", "gpu"}}), 8.0 * 8192);
  RestoreExact(e, 1, Range(8, 8));
}

// Two writers of one group (each holding two of its four 4 KiB slots,
// interleaved) publish the same key: the object is assembled from both
// parts. A gather writes an object's span from its first slot to its last
// and zeros between its slots, which for a writer of some of the slots
// would cover the other writer's slots: such an instance copies slot by
// slot. Both parts restore exactly, whichever writer publishes first.
TEST_F(GpuTierGate, TwoWritersOfOneGroupKeepEachOthersSlots) {
  Options o;
  o.backend = SsdBackend::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  auto half = [](std::vector<uint32_t> held) {
    InstanceLayout l;
    l.num_pages = 16;
    GroupLayout g;
    g.num_slots = 4;
    g.slot_bytes = {4096, 4096, 4096, 4096};
    for (uint32_t r = 0; r < held.size(); ++r) {
      l.region_bytes.push_back(16 * 4096);
      g.slots.push_back({held[r], r, 0, 4096, 4096});
    }
    l.groups.push_back(std::move(g));
    return l;
  };
  Engine& a = Register(half({0, 2}));
  Engine& b = Register(half({1, 3}));
  for (uint64_t key : {1, 2}) {
    Fill(a, key, key);
    Fill(b, key, key);
  }
  // Key 1: a first; key 2: b first.
  EXPECT_EQ(Publish(a, 1, {1}).sealed, 0u);
  EXPECT_EQ(Publish(b, 1, {1}).sealed, 1u);
  EXPECT_EQ(Publish(b, 2, {2}).sealed, 0u);
  EXPECT_EQ(Publish(a, 2, {2}).sealed, 1u);
  mgr->Drain();
  RestoreExact(a, 1, {8, 9});  // from SSD: every segment CRC checked
  RestoreExact(b, 1, {8, 9});
}

// ---- storage codecs (issue 17): encoded namespaces of CUDA pages ------------------

// KV-like bf16 (a normal distribution; the codecs code it rather than store
// it) for key `seed`'s slot `slot`.
std::vector<uint8_t> KvBytes(uint64_t seed, uint32_t slot, uint64_t bytes) {
  std::mt19937_64 rng(seed * 1000003 + slot);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> out(bytes);
  for (uint64_t i = 0; i + 1 < bytes; i += 2) {
    float f = normal(rng) * (slot + 1) * 0.5f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t b = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    std::memcpy(&out[i], &b, 2);
  }
  return out;
}

struct CodecCase {
  const char* name;
  uint32_t head_dim;  // 0: ans
  double max_rel_mse;
  friend void PrintTo(const CodecCase& c, std::ostream* os) { *os << c.name; }
};

// An encoded namespace of CUDA pages (two slots of bf16 KV, head_dim 128 for
// the lossy codecs). What a restore must give: for ans the published bytes,
// for the lossy codecs exactly the CPU codec's round trip (the GPU decoder's
// bytes are the CPU's), itself within the codec's known error.
class EncodedGate : public GpuTierGate {
 protected:
  static constexpr uint64_t kSlot0 = 65536, kSlot1 = 16384;
  CodecCase cc{"ans", 0, 0};
  codec::SegmentInfo info;

  Engine& RegisterEncoded(const CodecCase& c, const std::string& ns = "model") {
    cc = c;
    info.dtype = codec::DType::kBf16;
    info.head_dim = c.head_dim ? c.head_dim : 128;
    return Register(SplitLayout(16, {kSlot0, kSlot1}), ns, {c.name, "bf16", c.head_dim});
  }
  codec::CodecId id() const { return *codec::ParseCodecName(cc.name); }
  void FillKv(const Engine& e, uint64_t page, uint64_t seed) {
    for (const SlotLayout& s : e.layout.groups[0].slots) {
      const std::vector<uint8_t> b = KvBytes(seed, s.slot_id, s.bytes_per_page);
      env->Write(SlotPtr(e, s, page), b.data(), b.size());
    }
  }
  void FillKvAndPublish(const Engine& e, uint64_t first_key, uint64_t first_page, uint64_t n) {
    std::vector<uint64_t> pages;
    for (uint64_t i = 0; i < n; ++i) {
      FillKv(e, first_page + i, first_key + i);
      pages.push_back(first_page + i);
    }
    EXPECT_EQ(Publish(e, first_key, pages).sealed, n);
    mgr->Drain();
  }
  std::vector<uint8_t> Expected(uint64_t seed, uint32_t slot, uint64_t bytes) {
    std::vector<uint8_t> raw = KvBytes(seed, slot, bytes);
    if (codec::CodecIsLossless(id())) return raw;
    std::vector<uint8_t> frame(codec::MaxEncodedSize(id(), info, bytes)), out(bytes);
    Result<size_t> n = codec::Encode(id(), info, raw, frame);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_TRUE(codec::Decode({frame.data(), *n}, out).ok());
    return out;
  }
  static double Bf16(const uint8_t* p) {
    uint32_t u = uint32_t{uint16_t(p[0] | p[1] << 8)} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // The page holds Expected(seed) in every slot, and (lossy) that is within
  // the codec's error of the published KV.
  ::testing::AssertionResult HoldsKv(const Engine& e, uint64_t page, uint64_t seed) {
    for (const SlotLayout& s : e.layout.groups[0].slots) {
      std::vector<uint8_t> got(s.bytes_per_page);
      env->Read(got.data(), SlotPtr(e, s, page), got.size());
      const std::vector<uint8_t> want = Expected(seed, s.slot_id, got.size());
      if (got != want) {
        size_t i = 0;
        while (got[i] == want[i]) ++i;
        return ::testing::AssertionFailure()
               << cc.name << ": page " << page << " slot " << s.slot_id << " byte " << i
               << " differs from the CPU codec's round trip";
      }
      if (cc.max_rel_mse > 0) {
        const std::vector<uint8_t> raw = KvBytes(seed, s.slot_id, got.size());
        double err = 0, ref = 0;
        for (size_t i = 0; i + 1 < raw.size(); i += 2) {
          const double x = Bf16(&raw[i]), y = Bf16(&got[i]);
          err += (x - y) * (x - y);
          ref += x * x;
        }
        if (err / ref > cc.max_rel_mse) {
          return ::testing::AssertionFailure() << cc.name << ": relative MSE " << err / ref;
        }
      }
    }
    return ::testing::AssertionSuccess();
  }
  void RestoreKv(const Engine& e, uint64_t first_key, const std::vector<uint64_t>& pages) {
    for (uint64_t p : pages) Scribble(e, p);
    QueryResult q = Query(e, first_key, pages.size());
    ASSERT_EQ(q.prefix, pages.size());
    std::vector<uint32_t> blocks;
    for (uint32_t i = 0; i < pages.size(); ++i) blocks.push_back(i);
    RestoreResult r = Restore(Req(e, q, blocks, pages));
    ASSERT_EQ(r.blocks.size(), pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      ASSERT_TRUE(r.blocks[i].status.ok()) << r.blocks[i].status.ToString();
      EXPECT_TRUE(HoldsKv(e, pages[i], first_key + i));
    }
  }
  double CufileReads() { return Counter("orbitkv_ssd_cufile_read_bytes_total"); }
  // Polls `done` for at most 20 s.
  static void WaitUntil(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  double CufileWrites() { return Counter("orbitkv_ssd_cufile_write_bytes_total"); }
  double UringWriteback() { return Plain("orbitkv_bytes_total", {{"route", "writeback_ssd"}}); }
  double EncodeFallbacks(const std::string& reason) {
    return Plain("orbitkv_ssd_gpu_encode_fallbacks_total",
                 {{"device", "cuda:0"}, {"reason", reason}});
  }
  double Encoded() {
    return Plain("orbitkv_codec_bytes_out_total", {{"codec", cc.name}, {"op", "encode"}});
  }
  // Every SSD object so far was encoded on the GPU and written through cuFile.
  ::testing::AssertionResult AllGpuEncoded() {
    if (CufileWrites() == 0) return ::testing::AssertionFailure() << "no cuFile writes";
    if (UringWriteback() != 0) {
      return ::testing::AssertionFailure() << UringWriteback() << " bytes written by io_uring";
    }
    if (Gauge("orbitkv_ssd_gpu_encode_pending") != 0) {
      return ::testing::AssertionFailure() << "GPU encodes still pending";
    }
    return ::testing::AssertionSuccess();
  }
  // Key v's object on disk: its parsed header and its bytes, 4 KiB aligned.
  std::pair<ParsedHeader, std::vector<uint8_t>> ObjectOnDisk(uint64_t v) {
    const OnDisk d = Find(v);
    Result<ParsedHeader> h = ParseObjectHeader(ReadAt(d.path, d.offset, 4096), 1 << 20);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return {};
    const SegmentPos& last = h->segments.back();
    return {*h, ReadAt(d.path, d.offset, AlignUp(last.offset + last.size, 4096))};
  }
  double UringReads() { return Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}); }
  double Decoded() {
    return Plain("orbitkv_codec_bytes_out_total", {{"codec", cc.name}, {"op", "decode"}});
  }
};

// An encoded prefix read back from SSD stays in DRAM encoded; restoring it
// again into CUDA pages decodes every block into pinned pool scratch before
// the H2D copy. All of it at once did not fit a pool that holds the encoded
// copies: the later blocks failed with ResourceExhausted (the real-model gate's
// 4096-token prefix on the H200). The copies now run, and give their scratch
// back, whenever a block finds no room.
TEST_F(EncodedGate, EncodedDramPrefixLargerThanThePoolsFreeRoomRestoresIntoCudaPages) {
  Options o;
  o.pool = 24u << 20;  // 6 MiB of it read staging
  o.backend = SsdBackend::kUring;
  o.admission = AdmissionPolicy::kAll;  // restores promote what they read into DRAM
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(128, {256 << 10}), "model", {"ans", "bf16", 0});
  // 40 blocks (10 MiB), then 80 others that push them out of DRAM.
  constexpr uint64_t kBlocks = 40;
  FillAndPublish(e, 1, 0, kBlocks);
  FillAndPublish(e, 1001, kBlocks, 80);
  RestoreExact(e, 1, Range(0, kBlocks));  // from SSD: the encoded copies enter DRAM
  // Pinned encoded copies plus their decoded scratch (20 MiB) exceed the pool's 18.
  RestoreExact(e, 1, Range(0, kBlocks), Tier::kDram);
  EXPECT_EQ(mgr->gauges().dram.scratch_bytes, 0u);
}

const CodecCase kAns{"ans", 0, 0};
const CodecCase kFp8{"fp8", 128, 1e-3};
const CodecCase kTq4{"turboquant-4", 128, 0.015};
const CodecCase kTq3{"turboquant-3", 128, 0.045};

class EncodedCodecs : public EncodedGate, public ::testing::WithParamInterface<CodecCase> {};

// The GPU decode path: the encoded object is read by cuFile into the slots,
// assembled in the decode lane's arena, CRC-checked on the GPU and decoded
// straight into the pages. Before, encoded namespaces never took cuFile reads.
TEST_P(EncodedCodecs, EncodedObjectsRestoreThroughCufileDecodedOnTheGpu) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = RegisterEncoded(GetParam());
  FillKvAndPublish(e, 1, 0, 4);
  const OnDisk d = Find(1);
  auto parsed = ParseObjectHeader(ReadAt(d.path, d.offset, 1024), 1 << 20);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->codec, static_cast<uint8_t>(id())) << "not encoded on SSD";
  EXPECT_LT(parsed->segments[0].size, kSlot0) << "the KV was stored, not coded";
  EXPECT_TRUE(AllGpuEncoded());
  RestoreKv(e, 1, {8, 9, 10, 11});
  EXPECT_GT(CufileReads(), 0);
  EXPECT_EQ(UringReads(), 0);
  EXPECT_GT(Decoded(), 0);
  // The encode and decode lanes' arenas and scratch are held on the codec
  // budget, a share each, and the DRAM decode lane's (made at register).
  EXPECT_EQ(Plain("orbitkv_codec_budget_used_bytes"),
            3 * GpuCodecShare(256u << 20, 3 * faults->device_count()));
}

// The io_uring route reads the same objects and decodes them on the CPU: the
// same bytes as the GPU route.
TEST_P(EncodedCodecs, IoUringRouteGivesTheSameBytes) {
  Options o;
  o.read_path = SsdReadPath::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = RegisterEncoded(GetParam());
  FillKvAndPublish(e, 1, 0, 3);
  EXPECT_TRUE(AllGpuEncoded());  // the read route does not change the write path
  RestoreKv(e, 1, {8, 9, 10});
  EXPECT_EQ(CufileReads(), 0);
  EXPECT_GT(UringReads(), 0);
}

// Recovery after DRAM eviction: objects first restored from DRAM (raw copy)
// leave it under a raw namespace's publishes, then come back through cuFile.
TEST_P(EncodedCodecs, RecoversThroughCufileAfterDramEviction) {
  Options o;
  o.admission = AdmissionPolicy::kAll;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = RegisterEncoded(GetParam());
  FillKvAndPublish(e, 1, 0, 2);
  const std::vector<Tier> on_ssd{Tier::kSsd, Tier::kSsd};
  auto sources = [&] {
    QueryResult q = Query(e, 1, 2);
    EXPECT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
    return q.sources;
  };
  ASSERT_EQ(sources(), (std::vector<Tier>{Tier::kDram, Tier::kDram}));
  Engine& filler = Register(SplitLayout(4, {1u << 20}), "filler");
  // More than the pool of other objects (a query would touch keys 1 and 2).
  for (uint64_t k = 100; k < 100 + 48; ++k) {
    Fill(filler, k % 4, k);
    Publish(filler, k, {k % 4});
    mgr->Drain();
  }
  ASSERT_EQ(sources(), on_ssd) << "never evicted from DRAM";
  RestoreKv(e, 1, {8, 9});
  EXPECT_GT(CufileReads(), 0);
  EXPECT_GT(Encoded(), 0);
  EXPECT_EQ(EncodeFallbacks("failed") + EncodeFallbacks("lane_full"), 0);
}

// Recovery after re-registration: the namespace's objects (same codec) are
// served to the new instance through cuFile.
TEST_P(EncodedCodecs, RecoversThroughCufileAfterReRegistration) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& first = RegisterEncoded(GetParam());
  FillKvAndPublish(first, 1, 0, 2);
  ASSERT_TRUE(mgr->UnregisterInstance(session, first.id).ok());
  first.id = 0;
  Engine& again = RegisterEncoded(GetParam());
  RestoreKv(again, 1, {4, 5});
  EXPECT_GT(CufileReads(), 0);
  EXPECT_EQ(UringReads(), 0);
  EXPECT_TRUE(AllGpuEncoded());
}

// GPU encode on cuFile writeback: the same pages published as a complete
// group (GPU encode, cuFile write) and slot by slot (assembled in DRAM,
// encoded on the CPU, io_uring writeback) give the same object bytes after
// the header (frames and padding) and the same segment table.
TEST_P(EncodedCodecs, GpuEncodedObjectIsTheCpuWritebacksBytes) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& gpu = RegisterEncoded(GetParam(), "gpu");
  Engine& cpu = RegisterEncoded(GetParam(), "cpu");
  FillKv(gpu, 0, 7);
  FillKv(cpu, 0, 7);
  EXPECT_EQ(Publish(gpu, 1, {0}).sealed, 1u);
  mgr->Drain();
  EXPECT_TRUE(AllGpuEncoded());
  EXPECT_EQ(Publish(cpu, 2, {0}, {0}).sealed, 0u);
  EXPECT_EQ(Publish(cpu, 2, {0}, {1}).sealed, 1u);
  mgr->Drain();
  EXPECT_GT(UringWriteback(), 0);
  EXPECT_EQ(EncodeFallbacks("fragmented"), 2);  // one per part
  auto [gh, gb] = ObjectOnDisk(1);
  auto [ch, cb] = ObjectOnDisk(2);
  EXPECT_EQ(gh.codec, static_cast<uint8_t>(id()));
  EXPECT_EQ(gh.codec, ch.codec);
  EXPECT_EQ(gh.codec_version, ch.codec_version);
  EXPECT_EQ(gh.segments, ch.segments);
  EXPECT_EQ(gh.crcs, ch.crcs);
  ASSERT_EQ(gb.size(), cb.size());
  EXPECT_TRUE(std::equal(gb.begin() + gh.header_size, gb.end(), cb.begin() + ch.header_size))
      << "GPU and CPU encoders wrote different frames";
  for (auto [e, key] : {std::pair<Engine*, uint64_t>{&gpu, 1}, {&cpu, 2}}) {
    Scribble(*e, 8);
    QueryResult q = Query(*e, key, 1);
    ASSERT_EQ(q.prefix, 1u);
    RestoreResult r = Restore(Req(*e, q, {0}, {8}));
    ASSERT_EQ(r.blocks.size(), 1u);
    EXPECT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
    EXPECT_TRUE(HoldsKv(*e, 8, 7));
  }
}

// The compressed DRAM copy for hot reuse: the GPU-encoded object also goes
// into the pool (D2H of the encoded bytes), smaller than the raw group, and
// restores from there through the CPU decode of encoded DRAM entries.
TEST_P(EncodedCodecs, GpuEncodedWriteKeepsACompressedDramCopy) {
  Options o;
  o.admission = AdmissionPolicy::kAll;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = RegisterEncoded(GetParam());
  FillKvAndPublish(e, 1, 0, 2);
  EXPECT_TRUE(AllGpuEncoded());
  QueryResult q = Query(e, 1, 2);
  EXPECT_EQ(q.sources, (std::vector<Tier>{Tier::kDram, Tier::kDram}));
  ASSERT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  const uint64_t raw = AlignUp(ObjectSize({kSlot0, kSlot1}), 4096);
  EXPECT_LT(mgr->gauges().dram.used_bytes, 2 * raw) << "the DRAM copies are not encoded";
  const double decoded = Decoded();
  RestoreKv(e, 1, {8, 9});
  EXPECT_GT(Decoded(), decoded) << "restored from a raw DRAM copy";
  EXPECT_EQ(CufileReads(), 0);
}

INSTANTIATE_TEST_SUITE_P(Codecs, EncodedCodecs, ::testing::Values(kAns, kFp8, kTq4, kTq3),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// GPU encode admission saturation: while the first cuFile write is held, the
// eight write permits stay taken by groups encoded or encoding, and the last
// four groups of the call fall back to the CPU path (raw DRAM copy, CPU
// encode, io_uring writeback); every group is stored and restores.
TEST_F(EncodedGate, GpuEncodeAdmissionSaturationFallsBackToTheCpuWriteback) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = RegisterEncoded(kAns);
  for (uint64_t p = 0; p < 12; ++p) FillKv(e, p, 1 + p);
  faults->HoldWrites(true);
  auto publish = std::async(std::launch::async, [&] { return Publish(e, 1, Range(0, 12)); });
  WaitUntil([&] { return EncodeFallbacks("lane_full") >= 4 && faults->held_events() >= 1; });
  EXPECT_EQ(mgr->gauges().gpu_write_jobs, 8u);
  EXPECT_EQ(Gauge("orbitkv_ssd_gpu_encode_pending"), 8);
  faults->HoldWrites(false);
  faults->ReleaseHeld();
  EXPECT_EQ(publish.get().sealed, 12u);
  mgr->Drain();
  EXPECT_EQ(EncodeFallbacks("lane_full"), 4);
  EXPECT_GT(CufileWrites(), 0);
  EXPECT_GT(UringWriteback(), 0);
  EXPECT_EQ(mgr->gauges().gpu_write_jobs, 0u);
  EXPECT_EQ(Gauge("orbitkv_ssd_gpu_encode_pending"), 0);
  RestoreKv(e, 1, Range(0, 12));
}

// A full encode arena (a small codec budget) is admission saturation too:
// the groups it cannot hold take the CPU path; all are stored.
TEST_F(EncodedGate, FullEncodeArenaFallsBackToTheCpuWriteback) {
  // An encode share that leaves an arena of three groups of this shape after
  // the platform's encoder scratch (the budget is split over the device's
  // three GPU codec lanes: cuFile decode and encode, DRAM decode; with two,
  // the share on CUDA, whose encoder scratch is 4 MiB, held no encode lane).
  auto probe = faults->device(0);
  ASSERT_TRUE(probe.ok());
  auto encoder = (*probe)->CreateFrameEncoder(GpuEncodeLane::kMaxSegments);
  ASSERT_TRUE(encoder.ok()) << encoder.status().ToString();
  const NamespaceCodec fp8{codec::CodecId::kFp8, {codec::DType::kBf16, 128}};
  const uint64_t share =
      (*encoder)->scratch_bytes() + 3 * GpuEncodeLane::Bound(fp8, {kSlot0, kSlot1}) + 4096;
  encoder->reset();
  ASSERT_NO_FATAL_FAILURE(StartWithCodecBudget({}, 3 * share));
  Engine& e = RegisterEncoded(kFp8);
  for (uint64_t p = 0; p < 12; ++p) FillKv(e, p, 1 + p);
  faults->HoldWrites(true);
  auto publish = std::async(std::launch::async, [&] { return Publish(e, 1, Range(0, 12)); });
  WaitUntil([&] { return EncodeFallbacks("arena_full") >= 1; });
  faults->HoldWrites(false);
  faults->ReleaseHeld();
  EXPECT_EQ(publish.get().sealed, 12u);
  mgr->Drain();
  EXPECT_GT(EncodeFallbacks("arena_full"), 0);
  EXPECT_GT(CufileWrites(), 0);
  EXPECT_GT(UringWriteback(), 0);
  RestoreKv(e, 1, Range(0, 12));
}

// A failed GPU encode is counted (orbitkv_codec_failures_total{op="encode"})
// and writes nothing wrong: the group goes again through the CPU path.
TEST_F(EncodedGate, AFailedGpuEncodeIsCountedAndTheCpuPathStoresTheGroup) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = RegisterEncoded(kAns);
  FillKv(e, 0, 1);
  FillKv(e, 1, 2);
  faults->FailEncodes(1, Status::Internal("injected GPU encode failure"));
  EXPECT_EQ(Publish(e, 1, {0, 1}).sealed, 2u);
  mgr->Drain();
  EXPECT_EQ(Plain("orbitkv_codec_failures_total", {{"codec", "ans"}, {"op", "encode"}}), 1);
  EXPECT_EQ(EncodeFallbacks("failed"), 1);
  EXPECT_GT(CufileWrites(), 0);    // the other group
  EXPECT_GT(UringWriteback(), 0);  // the failed one, encoded on the CPU
  RestoreKv(e, 1, {8, 9});
}

// A failed cuFile write of a GPU-encoded group: its encoded DRAM copy is
// written back through io_uring as it is (no second encode), and restores.
TEST_F(EncodedGate, AFailedGpuEncodedWriteGoesToIoUringFromTheEncodedDramCopy) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = RegisterEncoded(kTq4);
  FillKv(e, 0, 1);
  FillKv(e, 1, 2);
  faults->FailWrites(1, FaultInjectingPlatform::IoFault::kError);
  EXPECT_EQ(Publish(e, 1, {0, 1}).sealed, 2u);
  mgr->Drain();
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_write_failures_total"), 1);
  EXPECT_EQ(Plain("orbitkv_codec_failures_total", {{"codec", cc.name}, {"op", "encode"}}), 0);
  EXPECT_GT(UringWriteback(), 0);
  const double encoded = Encoded();
  RestoreKv(e, 1, {8, 9});
  EXPECT_EQ(Encoded(), encoded);
  auto [h, bytes] = ObjectOnDisk(1);
  EXPECT_EQ(h.codec, static_cast<uint8_t>(id()));
}

// A GPU-encoded group with an encoded DRAM copy: Publish returns once the
// group is encoded, while its cuFile write is still held, so the engine may
// reuse the pages at once; the write then finishes from the encode arena and
// the object on disk restores with the published bytes.
TEST_F(EncodedGate, PublishReturnsAtTheEncodeWhileItsWriteGoesOn) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = RegisterEncoded(kAns);
  FillKv(e, 0, 1);
  FillKv(e, 1, 2);
  faults->HoldWrites(true);
  auto publish = std::async(std::launch::async, [&] { return Publish(e, 1, {0, 1}); });
  ASSERT_EQ(publish.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "Publish waited for its held cuFile writes";
  EXPECT_EQ(publish.get().sealed, 2u);
  Scribble(e, 0);  // the engine reuses its pages
  Scribble(e, 1);
  WaitUntil([&] { return faults->held_events() >= 1; });
  EXPECT_EQ(Gauge("orbitkv_ssd_gpu_encode_pending"), 2) << "the writes are still on their way";
  EXPECT_EQ(mgr->gauges().dram.writeback_pending, 2u);
  faults->HoldWrites(false);
  faults->ReleaseHeld();
  mgr->Drain();  // waits for the detached writes
  EXPECT_TRUE(AllGpuEncoded());
  EXPECT_EQ(mgr->gauges().dram.writeback_pending, 0u);
  EXPECT_EQ(ObjectOnDisk(1).first.codec, static_cast<uint8_t>(id()));
  RestoreKv(e, 1, {8, 9});
}

// Unregister after GPU-encoded writes: the worker's encode and decode lanes
// go with it, their arenas and budget shares released (TearDown checks the
// budget gauge is back to 0 with the workers gone).
TEST_F(EncodedGate, UnregisterReleasesTheEncodeArenaAndItsBudget) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = RegisterEncoded(kAns);
  FillKvAndPublish(e, 1, 0, 3);
  // The encode lane's and the DRAM decode lane's (made at register).
  EXPECT_EQ(Plain("orbitkv_codec_budget_used_bytes"),
            2 * GpuCodecShare(256u << 20, 3 * faults->device_count()));
  ASSERT_TRUE(mgr->UnregisterInstance(session, e.id).ok());
  e.id = 0;
  EXPECT_EQ(Plain("orbitkv_codec_budget_used_bytes"), 0);
  EXPECT_EQ(Gauge("orbitkv_ssd_gpu_encode_pending"), 0);
}

// A codec budget whose share cannot stage one object selects the host reader
// (io_uring, CPU decode), with the same bytes.
TEST_F(EncodedGate, CodecBudgetTooSmallForAnObjectTakesTheHostReader) {
  ASSERT_NO_FATAL_FAILURE(StartWithCodecBudget({}, 16u << 10));
  Engine& e = RegisterEncoded(kAns);
  FillKvAndPublish(e, 1, 0, 2);
  RestoreKv(e, 1, {8, 9});
  EXPECT_EQ(CufileReads(), 0);
  EXPECT_GT(UringReads(), 0);
  EXPECT_GT(Decoded(), 0);
}

// More objects than the arena holds at once: the queue waits for ranges the
// decode lane gives back, and every block arrives.
TEST_F(EncodedGate, ArenaSmallerThanARestoreDecodesItInTurns) {
  ASSERT_NO_FATAL_FAILURE(StartWithCodecBudget({}, 1u << 20));  // a few objects at a time
  Engine& e = RegisterEncoded(kTq4);
  FillKvAndPublish(e, 1, 0, 16);
  RestoreKv(e, 1, Range(0, 16));
  EXPECT_GT(CufileReads(), 0);
  EXPECT_EQ(UringReads(), 0);
}

// One flipped bit of an encoded object on disk, restored into CUDA pages
// through cuFile (GPU CRC, then the GPU decoder) and through io_uring (CPU):
// payload -> its segment CRC; a segment's CRC or size -> the header CRC; the
// same two with the header resealed -> the segment CRC over the stored
// bytes; a payload change whose segment CRC is resealed -> the frame's own
// CRC in the decoder. Each is Corruption with no byte written into the page,
// the damaged object dropped.
class EncodedCorruption : public EncodedGate,
                          public ::testing::WithParamInterface<std::optional<SsdReadPath>> {
 protected:
  void Reseal(const OnDisk& d, const std::function<void(std::vector<uint8_t>&)>& edit) {
    std::vector<uint8_t> h = ReadAt(d.path, d.offset, ObjectHeaderSize(2));
    edit(h);
    SealObjectHeader(h);
    Overwrite(d.path, d.offset, h);
  }
};

TEST_P(EncodedCorruption, EveryDamagedEncodedObjectIsCorruptionNeverWrongBytes) {
  Options o;
  o.read_path = GetParam();
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = RegisterEncoded(kAns);
  FillKvAndPublish(e, 1, 0, 7);
  const uint64_t entry0 = kObjectHeaderFixedBytes, entry1 = entry0 + kObjectSlotEntryBytes;
  auto seg = [&](uint64_t key, uint32_t slot) {
    const OnDisk d = Find(key);
    return ParseObjectHeader(ReadAt(d.path, d.offset, ObjectHeaderSize(2)), 1 << 20)
        ->segments[slot];
  };
  Flip(Find(1), seg(1, 0).offset + 100, 0x04);
  ExpectCorruptRestore(e, 1, 8, "payload CRC32C");
  EXPECT_EQ(Plain("orbitkv_codec_crc_failures_total", {{"codec", "ans"}}), 1);
  Flip(Find(2), entry0 + 16, 0x01);  // slot 0's CRC
  ExpectCorruptRestore(e, 2, 8, "crc mismatch");
  Flip(Find(3), entry1 + 8, 0x01);  // slot 1's size
  ExpectCorruptRestore(e, 3, 8, "crc mismatch");
  Reseal(Find(4), [&](std::vector<uint8_t>& h) { h[entry1 + 16] ^= 0x10; });
  ExpectCorruptRestore(e, 4, 8, "payload CRC32C");
  Reseal(Find(5), [&](std::vector<uint8_t>& h) { h[entry0 + 8] ^= 0x02; });  // size - 2
  ExpectCorruptRestore(e, 5, 8, "payload CRC32C");
  EXPECT_EQ(Plain("orbitkv_codec_crc_failures_total", {{"codec", "ans"}}), 3);
  {
    // A payload byte changed and its segment CRC made to match: the frame's
    // own CRC32C (checked by the decoder before it writes) fails.
    const OnDisk d = Find(6);
    const SegmentPos s1 = seg(6, 1);
    Flip(d, s1.offset + s1.size - 3, 0x20);
    const std::vector<uint8_t> frame = ReadAt(d.path, d.offset + s1.offset, s1.size);
    Reseal(d, [&](std::vector<uint8_t>& h) {
      const uint32_t crc = codec::Crc32c(frame);
      std::memcpy(&h[entry1 + 16], &crc, 4);
    });
  }
  // The other slot's valid frame may decode (its bytes are the published
  // ones); the damaged slot is never written.
  ExpectCorruptRestore(e, 6, 8, "slot 1", /*untouched=*/GetParam() == SsdReadPath::kUring);
  {
    const SlotLayout& s1 = e.layout.groups[0].slots[1];
    std::vector<uint8_t> b(s1.bytes_per_page);
    env->Read(b.data(), SlotPtr(e, s1, 8), b.size());
    EXPECT_EQ(std::count(b.begin(), b.end(), 0xC3), static_cast<ptrdiff_t>(b.size()));
  }
  EXPECT_GE(Plain("orbitkv_codec_failures_total", {{"codec", "ans"}, {"op", "decode"}}), 1);
  RestoreKv(e, 7, {9});  // an intact object of the same namespace
  if (GetParam() == SsdReadPath::kUring) {
    EXPECT_EQ(CufileReads(), 0);
  } else {
    EXPECT_EQ(UringReads(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Routes, EncodedCorruption,
                         ::testing::Values(std::nullopt, SsdReadPath::kUring),
                         [](const auto& info) { return info.param ? "IoUring" : "Cufile"; });

// ---- encoded DRAM entries into CUDA pages -----------------------------------

// With --codec-dram-copy encoded the writeback's encoded object replaces the
// raw DRAM entry; restoring it into CUDA pages copies the encoded bytes H2D
// into the DRAM decode lane's arena, checks the segment CRCs on the GPU and
// decodes into the pages. Before, such entries decoded on the CPU into pinned
// scratch (0.6 GB/s for fp8), far below the raw route.
class EncodedDram : public EncodedGate {
 protected:
  Options Encoded(uint64_t pool = 32u << 20) {
    Options o;
    o.pool = pool;
    o.backend = SsdBackend::kUring;       // restores here come from DRAM
    o.admission = AdmissionPolicy::kAll;  // published objects stay in DRAM
    o.dram_encoded = true;
    return o;
  }
  double DramRestores(const char* where) {
    return Plain("orbitkv_codec_dram_restores_total", {{"codec", cc.name}, {"where", where}});
  }
  double DramCopies() { return Plain("orbitkv_codec_dram_copies_total", {{"codec", cc.name}}); }
  // Restores keys [first_key, +n) from DRAM into `pages`: the encoded copies.
  void RestoreKvFromDram(const Engine& e, uint64_t first_key, const std::vector<uint64_t>& pages) {
    QueryResult q = Query(e, first_key, pages.size());
    for (Tier t : q.sources) EXPECT_EQ(t, Tier::kDram);
    ASSERT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
    RestoreKv(e, first_key, pages);
  }
  // The encoded object of key `v` in the DRAM pool (its header's magic, key
  // and a codec id), behind the Manager's back: null if none.
  uint8_t* EncodedInPool(uint64_t v) {
    const BlockKey key = K(v);
    for (auto [base, bytes] : arenas) {
      for (uint64_t off = 0; off + 4096 <= bytes; off += 4096) {
        uint8_t* h = base + off;
        if (std::memcmp(h, kObjectMagic, sizeof kObjectMagic) != 0 ||
            std::memcmp(h + 32, key.data(), key.size()) != 0) {
          continue;
        }
        auto parsed = ParseObjectHeader({h, ObjectHeaderSize(2)}, bytes - off);
        if (parsed.ok() && parsed->codec == static_cast<uint8_t>(id())) return h;
      }
    }
    return nullptr;
  }
};

class EncodedDramCodecs : public EncodedDram, public ::testing::WithParamInterface<CodecCase> {};

TEST_P(EncodedDramCodecs, EncodedDramCopiesRestoreIntoCudaPagesDecodedOnTheGpu) {
  ASSERT_NO_FATAL_FAILURE(Start(Encoded()));
  Engine& e = RegisterEncoded(GetParam());
  FillKvAndPublish(e, 1, 0, 4);  // Drain: written back, then replaced
  EXPECT_EQ(DramCopies(), 4) << "the raw DRAM entries were not replaced";
  EXPECT_GT(Plain("orbitkv_codec_dram_bytes_saved_total", {{"codec", cc.name}}), 0);
  const double decoded = Decoded();
  RestoreKvFromDram(e, 1, {8, 9, 10, 11});
  EXPECT_EQ(DramRestores("gpu"), 4);
  EXPECT_EQ(DramRestores("cpu"), 0);
  EXPECT_GT(Decoded(), decoded);
  EXPECT_EQ(UringReads(), 0);
  // The lane's arena and scratch are held on the codec budget while the
  // instance lives (TearDown: released with its last instance).
  EXPECT_EQ(Plain("orbitkv_codec_budget_used_bytes"),
            GpuCodecShare(256u << 20, faults->device_count()));
  EXPECT_EQ(mgr->gauges().dram.scratch_bytes, 0u);
}

// Without the flag DRAM keeps the raw copy: restores are exact copies, even
// for lossy codecs, and nothing decodes.
TEST_P(EncodedDramCodecs, RawDramCopiesStayByDefault) {
  Options o = Encoded();
  o.dram_encoded = false;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = RegisterEncoded(GetParam());
  FillAndPublish(e, 1, 0, 2);
  EXPECT_EQ(DramCopies(), 0);
  RestoreExact(e, 1, {8, 9}, Tier::kDram);
  EXPECT_EQ(DramRestores("gpu") + DramRestores("cpu"), 0);
}

INSTANTIATE_TEST_SUITE_P(Codecs, EncodedDramCodecs, ::testing::Values(kAns, kFp8, kTq4),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A flipped payload bit of the encoded DRAM copy: the GPU CRC check fails the
// block with Corruption before any frame decodes (the page keeps its bytes),
// counted; the damaged copy leaves DRAM and the SSD copy serves next.
TEST_F(EncodedDram, AFlippedBitInAnEncodedDramCopyIsCorruptionWithThePageUntouched) {
  ASSERT_NO_FATAL_FAILURE(Start(Encoded()));
  Engine& e = RegisterEncoded(kFp8);
  FillKvAndPublish(e, 1, 0, 2);
  uint8_t* obj = EncodedInPool(1);
  ASSERT_NE(obj, nullptr) << "no encoded DRAM copy of key 1";
  auto h = ParseObjectHeader({obj, ObjectHeaderSize(2)}, 1 << 20);
  ASSERT_TRUE(h.ok());
  obj[h->segments[0].offset + h->segments[0].size / 2] ^= 0x08;
  Scribble(e, 8);
  Scribble(e, 9);
  QueryResult q = Query(e, 1, 2);
  ASSERT_EQ(q.prefix, 2u);
  RestoreResult r = Restore(Req(e, q, {0, 1}, {8, 9}));
  ASSERT_EQ(r.blocks.size(), 2u);
  EXPECT_EQ(r.blocks[0].status.code(), StatusCode::kCorruption) << r.blocks[0].status.ToString();
  EXPECT_NE(r.blocks[0].status.message().find("payload CRC32C"), std::string::npos)
      << r.blocks[0].status.ToString();
  EXPECT_TRUE(Untouched(e, 8));
  ASSERT_TRUE(r.blocks[1].status.ok()) << r.blocks[1].status.ToString();
  EXPECT_TRUE(HoldsKv(e, 9, 2));  // the intact neighbour of the same batch
  EXPECT_EQ(Plain("orbitkv_codec_crc_failures_total", {{"codec", "fp8"}}), 1);
  EXPECT_EQ(DramRestores("gpu"), 2);
  // The damaged copy is gone from DRAM: the SSD's serves.
  QueryResult again = Query(e, 1, 1);
  ASSERT_EQ(again.prefix, 1u);
  EXPECT_EQ(again.sources[0], Tier::kSsd);
  ASSERT_TRUE(mgr->ReleaseQuery(session, again.query).ok());
  RestoreKv(e, 1, {10});
}

// A codec budget too small for the DRAM decode lane: the encoded entries
// decode on the CPU (into pinned scratch, then H2D), counted, with the same
// bytes (the CPU codec's round trip). A long encoded prefix needs more scratch
// than the pool has free; its copies run, and give their scratch back, in
// turns (before: ResourceExhausted part way, the real-model gate on the H200).
TEST_F(EncodedDram, CodecBudgetTooSmallDecodesOnTheCpuWithTheSameBytes) {
  ASSERT_NO_FATAL_FAILURE(StartWithCodecBudget(Encoded(), 16u << 10));
  Engine& e = RegisterEncoded(kFp8);
  FillKvAndPublish(e, 1, 0, 4);
  EXPECT_EQ(DramCopies(), 4);
  RestoreKvFromDram(e, 1, {8, 9, 10, 11});
  EXPECT_EQ(DramRestores("gpu"), 0);
  EXPECT_EQ(DramRestores("cpu"), 4);
  EXPECT_EQ(mgr->gauges().dram.scratch_bytes, 0u);
}

// More encoded DRAM blocks than the lane's arena holds: the restore submits
// what it holds and takes ranges again as the lane gives them back.
TEST_F(EncodedDram, ArenaSmallerThanAnEncodedDramRestoreDecodesItInTurns) {
  // 16 x 48 KiB: more than the arena (512 KiB less the decoder's scratch).
  ASSERT_NO_FATAL_FAILURE(StartWithCodecBudget(Encoded(), 512u << 10));
  Engine& e = RegisterEncoded(kFp8);
  FillKvAndPublish(e, 1, 0, 16);
  RestoreKvFromDram(e, 1, Range(0, 16));
  EXPECT_EQ(DramRestores("gpu"), 16);
  EXPECT_EQ(DramRestores("cpu"), 0);
}

TEST_F(GpuTierGate, PublishWaitsForItsCufileWritesWhenALaterGroupFails) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {16384}));
  Fill(e, 0, 1);
  Fill(e, 1, 2);
  const SlotLayout& s = e.layout.groups[0].slots[0];
  faults->HoldWrites(true);
  // Page 1 cannot be copied (a batch's D2H job fails, and so does its copy
  // redone alone): the first group is stored, the call fails with the error.
  faults->RefuseCopiesFrom(SlotPtr(e, s, 1), s.bytes_per_page, 2,
                           Status::IOError("injected D2H failure of page 1", EIO));
  auto publish = std::async(std::launch::async, [&] {
    PublishRequest p;
    p.instance = e.id;
    p.keys = {K(1), K(2)};
    p.pages = {0, 1};
    return mgr->Publish(session, p);
  });
  while (faults->held_events() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(publish.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "Publish returned while the GPU still gathers from page 0 for its cuFile write";
  faults->HoldWrites(false);
  faults->ReleaseHeld();
  Result<PublishResult> r = publish.get();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected D2H failure"), std::string::npos)
      << r.status().ToString();
  mgr->Drain();
  EXPECT_EQ(mgr->gauges().dram.writeback_pending, 0u);  // the first group's entry was finished
  EXPECT_EQ(mgr->gauges().gpu_write_jobs, 0u);
  RestoreExact(e, 1, {8});  // the first group reached SSD
}

// A Publish of more than one 16 MiB batch pipelines them (the next batch's
// D2H job is enqueued before the one before it is waited for and sealed):
// every object is stored with its own bytes.
TEST_F(GpuTierGate, PublishOfSeveralPipelinedBatchesStoresEveryObjectExactly) {
  Options o;
  o.pool = 96u << 20;
  o.capacity = 128u << 20;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(40, {512u << 10, 512u << 10}));
  FillAndPublish(e, 1, 0, 40);  // 40 MiB: three batches
  EXPECT_EQ(Plain("orbitkv_publish_crc_bytes_total", {{"where", "gpu"}}), 40.0 * (1u << 20));
  RestoreExact(e, 1, Range(0, 40));
}

// A batch's segment CRCs run on a stream of their own beside its copies; a
// CRC launch that fails fails the batch's job (both streams drained), and the
// batch is redone object by object with the CRCs on the CPU: every object is
// stored with its own bytes and headers that the SSD restore accepts, and
// the batches after it take the GPU again.
TEST_F(GpuTierGate, AFailedCrcLaunchOfAPublishBatchStoresItWithCpuCrcs) {
  Options o;
  o.pool = 96u << 20;
  o.capacity = 128u << 20;
  o.backend = SsdBackend::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(40, {512u << 10, 512u << 10}));
  faults->RefuseCrcs(1, Status::Internal("injected CRC launch failure"));
  FillAndPublish(e, 1, 0, 40);  // 40 MiB: six batches, the first one refused
  const double gpu = Plain("orbitkv_publish_crc_bytes_total", {{"where", "gpu"}});
  const double cpu = Plain("orbitkv_publish_crc_bytes_total", {{"where", "cpu"}});
  EXPECT_EQ(gpu + cpu, 40.0 * (1u << 20));
  EXPECT_GT(cpu, 0);
  EXPECT_GT(gpu, 0);
  RestoreExact(e, 1, Range(0, 40));  // from SSD: every segment CRC checked
}

// A Publish's batches shrink towards its end (PublishBatchTarget), so the
// copy left after its last enqueue is short: 40 objects of 1 MiB under the
// 16 MiB cap are six D2H jobs of 16, 12, 6, 3, 2 and 1 objects (before, three
// of 16, 16 and 8, the last 8 MiB copied with nothing beside it), each
// object stored with its own bytes.
TEST_F(GpuTierGate, PublishLastBatchesShrinkAndStoreEveryObjectExactly) {
  EXPECT_EQ(PublishBatchesOf(16u << 20, 40, {512u << 10, 512u << 10}), 6.0);
}

// --publish-batch-bytes caps every batch: 4 MiB takes 12 objects of 1 MiB in
// batches of 4, 4, 2, 1 and 1 (the floor is a half-MiB, so one object).
TEST_F(GpuTierGate, PublishBatchBytesCapsEveryBatch) {
  EXPECT_EQ(PublishBatchesOf(4u << 20, 12, {1u << 20}), 5.0);
}

// A batch's D2H job that fails, and its copies redone one object at a time:
// the batch before it (already landed) and the objects of the failing batch
// before the failing one are stored; the call returns the error.
TEST_F(GpuTierGate, AFailedCopyInAPipelinedBatchKeepsTheBatchesBeforeIt) {
  Options o;
  o.pool = 96u << 20;
  o.capacity = 128u << 20;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(24, {1u << 20}));
  ExpectPage20RefusedKeepsTheObjectsBeforeIt(e, 0);
}

TEST_F(GpuTierGate, AutoFallbackPartWayThroughAPublishSendsTheLaterGroupsToIoUring) {
  Options o;
  o.backend = SsdBackend::kAuto;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  ASSERT_TRUE(mgr->gauges().cufile_selected);
  Engine& e = Register(SplitLayout(16, {8192}));
  for (uint64_t p = 0; p < 4; ++p) Fill(e, p, 1 + p);
  // The first group's cuFile worker cannot register its staging: auto falls back.
  faults->FailRegisterBuffer(1, Status::Unavailable("cuFileBufRegister: injected"));
  EXPECT_EQ(Publish(e, 1, Range(0, 4)).sealed, 4u);
  mgr->Drain();
  EXPECT_EQ(Plain("orbitkv_ssd_backend_fallbacks_total"), 1);
  EXPECT_FALSE(mgr->gauges().cufile_admitting);
  EXPECT_EQ(mgr->gauges().gpu_workers, 0u) << "a later group of the call started a cuFile worker";
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_write_bytes_total"), 0);
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "writeback_ssd"}}), 4 * ObjectSize({8192}));
  RestoreExact(e, 1, Range(8, 4));
}

TEST_F(GpuTierGate, SsdOnlyCufileWriteCountsAsStoredOnlyOnceItFinished) {
  Options o;
  o.pool = 1u << 20;  // 768 KiB of DRAM after read staging: twelve 64 KiB objects
  o.admission = AdmissionPolicy::kAll;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(32, {SlotBytesForExtent(64 << 10)}));
  FillAndPublish(e, 100, 0, 12);
  QueryResult pin = Query(e, 100, 12);  // pins what DRAM holds: no room for another object
  Manager::Gauges g = mgr->gauges();
  ASSERT_GT(g.dram.used_bytes + (64u << 10), g.dram.capacity) << "DRAM is not full";
  Fill(e, 20, 1);
  Fill(e, 21, 2);
  faults->FailWrites(1, IoFault::kError);
  PublishResult bad = Publish(e, 1, {20});
  EXPECT_EQ(bad.stored, 0u);
  EXPECT_EQ(bad.sealed, 0u);
  EXPECT_EQ(bad.dropped, 1u);
  PublishResult good = Publish(e, 2, {21});
  EXPECT_EQ(good.stored, 1u);
  EXPECT_EQ(good.sealed, 1u);
  EXPECT_EQ(good.dropped, 0u);
  ASSERT_TRUE(mgr->ReleaseQuery(session, pin.query).ok());
  mgr->Drain();
  EXPECT_EQ(Query(e, 1, 1).prefix, 0u);
  RestoreExact(e, 2, {22});  // its payload CRCs were computed on the GPU from the pages
}

TEST_F(GpuTierGate, CufileWriteSecondsExcludeTheWaitForASlot) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {16384}));
  Fill(e, 0, 1);
  Fill(e, 1, 2);
  faults->HoldWrites(true);
  auto publish = std::async(std::launch::async, [&] { return Publish(e, 1, {0, 1}); });
  while (faults->held_events() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  faults->HoldWrites(false);  // the second write, waiting for the slot, is not held
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  faults->ReleaseHeld();
  EXPECT_EQ(publish.get().sealed, 2u);
  mgr->Drain();
  Histogram* h = metrics.GetHistogram("orbitkv_ssd_cufile_write_seconds", "", LatencyBuckets(),
                                      {{"device", "cuda:0"}});
  const Histogram::Snapshot snap = h->Snap();
  EXPECT_EQ(snap.count, 2u);
  // The held write took >= 0.4 s; the other waited as long for the slot, which is not counted.
  EXPECT_GE(snap.sum, 0.4);
  EXPECT_LT(snap.sum, 0.7) << "the second write's wait for a slot was counted";
}

// ---- rings and shards -----------------------------------------------------------

TEST_F(GpuTierGate, LeasedExtentIsNotOverwrittenByWrappingWrites) {
  Options o;
  o.capacity = 1u << 20;  // sixteen 64 KiB extents
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(48, {SlotBytesForExtent(64 << 10)}));
  FillAndPublish(e, 1, 0, 1);
  QueryResult held = Query(e, 1, 1);  // leases key 1's extent
  ASSERT_EQ(held.prefix, 1u);
  for (uint64_t k = 2; k < 40; k += 4) FillAndPublish(e, k, k, 4);  // wraps the ring
  EXPECT_GT(Plain("orbitkv_ssd_pinned_write_skips_total"), 0);
  Scribble(e, 0);
  RestoreResult r = Restore(Req(e, held, {0}, {0}));
  ASSERT_TRUE(r.blocks[0].status.ok()) << r.blocks[0].status.ToString();
  EXPECT_TRUE(Holds(e, 0, 1));
}

TEST_F(GpuTierGate, WritesProgressOnTheOtherShardWhenOneIsPinned) {
  Options o;
  o.shards = 2;
  o.capacity = 2u << 20;  // 1 MiB per shard: sixteen 64 KiB extents each
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(64, {SlotBytesForExtent(64 << 10)}));
  FillAndPublish(e, 1, 0, 2);         // one object on each shard
  QueryResult held = Query(e, 1, 1);  // pins shard of key 1
  ASSERT_EQ(held.prefix, 1u);
  for (uint64_t k = 3; k < 59; k += 8) FillAndPublish(e, k, k, 8);
  // The newest objects are all on SSD although one shard's ring head is pinned.
  RestoreExact(e, 51, Range(51, 8));
  Scribble(e, 0);
  RestoreResult r = Restore(Req(e, held, {0}, {0}));
  ASSERT_TRUE(r.blocks[0].status.ok());
  EXPECT_TRUE(Holds(e, 0, 1));
}

// ---- cancellation and failures --------------------------------------------------

TEST_F(GpuTierGate, CancelWithBothReadSlotsOccupiedReleasesTheRest) {
  HeldRestore held;
  ASSERT_NO_FATAL_FAILURE(StartHeldRestore(6, &held));
  Engine& e = *held.engine;
  EXPECT_EQ(mgr->gauges().gpu_inflight_batches, 2u);
  auto released = mgr->CancelRestore(session, held.id);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(*released, 4u);  // two are in the slots; their leases stay until GPU completion
  EXPECT_GT(mgr->gauges().ssd_leases, 0u);
  faults->HoldReads(false);
  faults->ReleaseHeld();
  Result<RestoreResult> r = held.done.get();
  ASSERT_TRUE(r.ok());
  int ok = 0, cancelled = 0;
  for (const BlockResult& b : r->blocks) {
    if (b.status.ok()) {
      ++ok;
      EXPECT_TRUE(Holds(e, 8 + b.block, 1 + b.block));
    } else {
      EXPECT_EQ(b.status.code(), StatusCode::kCancelled) << b.status.ToString();
      ++cancelled;
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(cancelled, 4);
  EXPECT_EQ(mgr->gauges().ssd_restore_reads, 0u);  // a cancelled job's too
}

// Issue 18: the cuFile worker slept 20 us between polls of its slots while
// any was busy, 79% of the Manager's CPU on the hybrid ssd-auto run. Each
// event it records is now followed on its stream by a host function that
// wakes it; while both slots wait on reads held at the event level (their
// host functions have run, their events stay pending) it polls only on its
// 2 ms safety net. With the old loop this window saw thousands of polls.
TEST_F(GpuTierGate, TheCufileWorkerSleepsWhileItsReadsAreInFlightInsteadOfPolling) {
  HeldRestore held;
  ASSERT_NO_FATAL_FAILURE(StartHeldRestore(4, &held));
  Engine& e = *held.engine;
  faults->ResetCalls();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t polls = faults->calls().polls;
  EXPECT_EQ(mgr->gauges().ssd_restore_reads, 1u);  // the writeback yields to it meanwhile
  // Two slots, one poll each per 2 ms wait: about 200; the old loop made
  // one per 20 us sleep and slot, 20000 and more.
  EXPECT_LE(polls, 600u);
  faults->HoldReads(false);
  faults->ReleaseHeld();
  Result<RestoreResult> r = held.done.get();
  ASSERT_TRUE(r.ok());
  for (const BlockResult& b : r->blocks) {
    ASSERT_TRUE(b.status.ok()) << b.status.ToString();
    EXPECT_TRUE(Holds(e, 8 + b.block, 1 + b.block));
  }
  EXPECT_EQ(mgr->gauges().ssd_restore_reads, 0u);  // released with the job's last item
}

// A slot whose wake-up host function cannot be queued is polled instead (the
// old 20 us poll): every restore still completes, byte-exact.
TEST_F(GpuTierGate, CufileWorkerWithoutItsWakeUpsPollsAndRestoresExactly) {
  Options o;
  o.slot_bytes = 64u << 10;  // one object per batch: several batches
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {SlotBytesForExtent(64 << 10)}));
  FillAndPublish(e, 1, 0, 6);
  for (uint64_t p = 8; p < 14; ++p) Scribble(e, p);
  QueryResult q = Query(e, 1, 6);
  ASSERT_EQ(q.prefix, 6u);
  faults->ResetCalls();
  faults->RefuseHostFuncs(1000, Status::Internal("injected: cudaLaunchHostFunc refused"));
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3, 4, 5}, Range(8, 6)));
  faults->RefuseHostFuncs(0, Status::OK());
  for (const BlockResult& b : r.blocks) {
    ASSERT_TRUE(b.status.ok()) << b.status.ToString();
    EXPECT_TRUE(Holds(e, 8 + b.block, 1 + b.block));
  }
  EXPECT_GT(faults->calls().polls, 6u);  // it polled: no wake-up was queued
  EXPECT_EQ(mgr->gauges().ssd_restore_reads, 0u);
}

// The worker thread calls cuFile with its mutex released: while it is inside
// a cuFileReadAsync that does not return, gauges (the worker's stats) and a
// cancellation of the restore's unsubmitted reads still answer.
TEST_F(GpuTierGate, StatsAndCancelDoNotWaitBehindABlockedCufileSubmission) {
  Options o;
  o.slot_bytes = 64u << 10;  // one object per batch
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {SlotBytesForExtent(64 << 10)}));
  FillAndPublish(e, 1, 0, 4);
  QueryResult q = Query(e, 1, 4);
  ASSERT_EQ(q.prefix, 4u);
  faults->StallReadSubmits(true);
  std::promise<Result<RestoreResult>> done;
  auto id = mgr->StartRestore(session, Req(e, q, {0, 1, 2, 3}, Range(8, 4)),
                              [&](Result<RestoreResult> r) { done.set_value(std::move(r)); });
  ASSERT_TRUE(id.ok());
  while (faults->stalled_read_submits() < 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Unstalls before failing, so that a worker holding its mutex cannot hang the test.
  auto answers = [&](auto& f) {
    const bool ready = f.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
    if (!ready) faults->StallReadSubmits(false);
    return ready;
  };
  auto gauges = std::async(std::launch::async, [&] { return mgr->gauges(); });
  ASSERT_TRUE(answers(gauges)) << "the worker's stats() waited behind cuFileReadAsync";
  EXPECT_EQ(gauges.get().gpu_workers, 1u);
  auto cancel = std::async(std::launch::async, [&] { return mgr->CancelRestore(session, *id); });
  ASSERT_TRUE(answers(cancel)) << "CancelRead waited behind cuFileReadAsync";
  Result<uint32_t> released = cancel.get();
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(*released, 3u);  // block 0 is in the blocked submission
  faults->StallReadSubmits(false);
  Result<RestoreResult> r = done.get_future().get();
  ASSERT_TRUE(r.ok());
  for (const BlockResult& b : r->blocks) {
    if (b.block == 0) {
      EXPECT_TRUE(b.status.ok()) << b.status.ToString();
      EXPECT_TRUE(Holds(e, 8, 1));
    } else {
      EXPECT_EQ(b.status.code(), StatusCode::kCancelled) << b.status.ToString();
    }
  }
}

TEST_F(GpuTierGate, ClosingTheSessionStopsUnsubmittedReadsAndDrainsSubmittedOnes) {
  Options o;
  o.slot_bytes = 64u << 10;  // one object per batch
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {SlotBytesForExtent(64 << 10)}));
  FillAndPublish(e, 1, 0, 6);
  QueryResult q = Query(e, 1, 6);
  ASSERT_EQ(q.prefix, 6u);
  faults->HoldReads(true);
  std::promise<Result<RestoreResult>> done;
  std::future<Result<RestoreResult>> f = done.get_future();
  auto id = mgr->StartRestore(session, Req(e, q, {0, 1, 2, 3, 4, 5}, Range(8, 6)),
                              [&](Result<RestoreResult> r) { done.set_value(std::move(r)); });
  ASSERT_TRUE(id.ok());
  while (faults->held_events() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The consumer goes away: unsubmitted reads stop, submitted batches keep
  // their leases and pages until they complete, then everything is released.
  auto closing = std::async(std::launch::async, [&] { mgr->CloseSession(session); });
  EXPECT_EQ(closing.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_GT(mgr->gauges().ssd_leases, 0u);
  faults->HoldReads(false);
  faults->ReleaseHeld();
  closing.get();
  Result<RestoreResult> r = f.get();
  ASSERT_TRUE(r.ok());
  int ok = 0;
  for (const BlockResult& b : r->blocks) {
    if (b.status.ok()) {
      ++ok;
      EXPECT_TRUE(Holds(e, 8 + b.block, 1 + b.block));
    } else {
      EXPECT_EQ(b.status.code(), StatusCode::kCancelled);
    }
  }
  EXPECT_EQ(ok, 2);
  e.id = 0;  // unregistered with its session
  Manager::Gauges g = mgr->gauges();
  EXPECT_EQ(g.instances, 0u);
  EXPECT_EQ(g.ssd_leases, 0u);
  EXPECT_EQ(g.gpu_workers, 0u);
  session = mgr->OpenSession(getpid());
}

TEST_F(GpuTierGate, RefusedSubmissionFailsItsBlocksAndReleasesTheirLeases) {
  ASSERT_NO_FATAL_FAILURE(Start({}));  // explicit cufile: no fallback
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 4);
  faults->RefuseReadSubmits(1, Status::Unavailable("cuFileReadAsync: 5011 injected"));
  QueryResult q = Query(e, 1, 4);
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3}, Range(8, 4)));
  for (const BlockResult& b : r.blocks) {
    EXPECT_FALSE(b.status.ok());
    EXPECT_NE(b.status.message().find("partial submission"), std::string::npos)
        << b.status.ToString();
  }
  EXPECT_EQ(mgr->gauges().ssd_leases, 0u);
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_failures_total"), 1);
  RestoreExact(e, 1, Range(8, 4));
}

TEST_F(GpuTierGate, ShortReadFailsTheRestoreAndTheNextOneSucceeds) {
  ASSERT_NO_FATAL_FAILURE(Start({}));  // explicit cufile: no fallback
  Engine& e = Register(SplitLayout(16, {8192, 4096}));
  FillAndPublish(e, 1, 0, 4);
  faults->FailReads(1, IoFault::kShort);
  QueryResult q = Query(e, 1, 4);
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3}, Range(8, 4)));
  for (const BlockResult& b : r.blocks) {
    EXPECT_EQ(b.status.code(), StatusCode::kIOError) << b.status.ToString();
    EXPECT_NE(b.status.message().find("short"), std::string::npos) << b.status.ToString();
  }
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_failures_total"), 1);
  EXPECT_EQ(Plain("orbitkv_ssd_backend_fallbacks_total"), 0);  // explicit backend
  EXPECT_EQ(mgr->gauges().ssd_leases, 0u);
  RestoreExact(e, 1, Range(8, 4));
}

TEST_F(GpuTierGate, ReadsProceedWhileAWriteCompletionIsHeld) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {16384}));
  FillAndPublish(e, 1, 0, 4);
  Fill(e, 4, 100);
  faults->HoldWrites(true);
  auto publish = std::async(std::launch::async, [&] { return Publish(e, 100, {4}); });
  while (faults->held_events() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double read_before = Counter("orbitkv_ssd_cufile_read_bytes_total");
  RestoreExact(e, 1, Range(8, 4));  // the other slot serves reads
  EXPECT_GT(Counter("orbitkv_ssd_cufile_read_bytes_total"), read_before);
  EXPECT_EQ(publish.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  faults->HoldWrites(false);
  faults->ReleaseHeld();
  EXPECT_EQ(publish.get().sealed, 1u);
  mgr->Drain();
  RestoreExact(e, 100, {12});
}

TEST_F(GpuTierGate, WriteAdmissionSaturationFallsBackToHostWriteback) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(32, {SlotBytesForExtent(64 << 10)}));
  for (uint64_t p = 0; p < 12; ++p) Fill(e, p, 1 + p);
  faults->HoldWrites(true);
  auto publish = std::async(std::launch::async, [&] { return Publish(e, 1, Range(0, 12)); });
  // The first write is held, so the eight permits stay taken: the last four
  // groups of the call find admission full and fall back.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Plain("orbitkv_ssd_gpu_write_fallbacks_total") < 4 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(mgr->gauges().gpu_write_jobs, 8u);  // eight admitted, one of them held
  faults->HoldWrites(false);
  faults->ReleaseHeld();
  EXPECT_EQ(publish.get().sealed, 12u);
  mgr->Drain();
  EXPECT_EQ(Plain("orbitkv_ssd_gpu_write_fallbacks_total"), 4);
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_write_bytes_total"), 8 * (64 << 10));
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "writeback_ssd"}}), 4 * (64 << 10));
  EXPECT_EQ(mgr->gauges().gpu_write_jobs, 0u);
  RestoreExact(e, 1, Range(16, 12));  // all twelve on SSD, whichever way they got there
}

TEST_F(GpuTierGate, FragmentedPublicationSealsInDramAndRestoresThroughCufile) {
  ASSERT_NO_FATAL_FAILURE(Start({}));
  Engine& e = Register(SplitLayout(16, {8192, 12288}));
  for (uint64_t p = 0; p < 4; ++p) Fill(e, p, 1 + p);
  EXPECT_EQ(Publish(e, 1, Range(0, 4), {0}).sealed, 0u);
  EXPECT_EQ(Publish(e, 1, Range(0, 4), {1}).sealed, 4u);
  mgr->Drain();
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_write_bytes_total"), 0);  // assembled: io_uring writes
  EXPECT_GT(Plain("orbitkv_bytes_total", {{"route", "writeback_ssd"}}), 0);
  RestoreExact(e, 1, Range(8, 4));
  EXPECT_GT(Counter("orbitkv_ssd_cufile_read_bytes_total"), 0);
}

TEST_F(GpuTierGate, AutoFallsBackToUringAfterAnInjectedCufileFailure) {
  Options o;
  o.backend = SsdBackend::kAuto;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  ASSERT_TRUE(mgr->gauges().cufile_selected);
  Engine& e = Register(SplitLayout(32, {8192}));
  FillAndPublish(e, 1, 0, 4);
  faults->FailReads(1, IoFault::kError);
  QueryResult q = Query(e, 1, 4);
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3}, Range(8, 4)));
  for (const BlockResult& b : r.blocks) EXPECT_FALSE(b.status.ok());  // the failing op errs
  EXPECT_EQ(Plain("orbitkv_ssd_backend_fallbacks_total"), 1);
  EXPECT_FALSE(mgr->gauges().cufile_admitting);
  const double cufile_read = Counter("orbitkv_ssd_cufile_read_bytes_total");
  const double cufile_write = Counter("orbitkv_ssd_cufile_write_bytes_total");
  FillAndPublish(e, 20, 16, 4);  // new writes: D2H + io_uring
  RestoreExact(e, 20, Range(24, 4));
  RestoreExact(e, 1, Range(8, 4));
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total"), cufile_read);
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_write_bytes_total"), cufile_write);
  EXPECT_GT(Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
  EXPECT_EQ(Plain("orbitkv_ssd_backend_fallbacks_total"), 1);  // one transition
  if (std::getenv("ORBITKV_GATE_PRINT_METRICS")) {
    // What /metrics serves from this registry, for the issue note.
    std::istringstream lines(metrics.RenderPrometheus());
    for (std::string l; std::getline(lines, l);) {
      if (l[0] != '#' &&
          (l.find("cufile") != std::string::npos || l.find("fallbacks") != std::string::npos ||
           l.find("orbitkv_bytes_total") != std::string::npos) &&
          l.find("_bucket") == std::string::npos) {
        std::printf("  /metrics: %s\n", l.c_str());
      }
    }
  }
}

TEST_F(GpuTierGate, ExplicitReadRouteIsNotSwitchedAfterAFailure) {
  Options o;
  o.backend = SsdBackend::kAuto;
  o.read_path = SsdReadPath::kCufile;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 4);
  faults->FailReads(1, IoFault::kError);
  QueryResult q = Query(e, 1, 4);
  RestoreResult r = Restore(Req(e, q, {0, 1, 2, 3}, Range(8, 4)));
  for (const BlockResult& b : r.blocks) EXPECT_FALSE(b.status.ok());
  const double cufile_read = Counter("orbitkv_ssd_cufile_read_bytes_total");
  RestoreExact(e, 1, Range(8, 4));
  EXPECT_GT(Counter("orbitkv_ssd_cufile_read_bytes_total"), cufile_read);
  EXPECT_EQ(Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
}

TEST_F(GpuTierGate, ExplicitUringReadRouteKeepsCufileForWritesOnly) {
  Options o;
  o.read_path = SsdReadPath::kUring;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 4);
  EXPECT_GT(Counter("orbitkv_ssd_cufile_write_bytes_total"), 0);
  RestoreExact(e, 1, Range(8, 4));
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total"), 0);
  EXPECT_GT(Plain("orbitkv_bytes_total", {{"route", "restore_ssd_uring"}}), 0);
}

// ---- transfer shape ---------------------------------------------------------------

class TransferShape : public GpuTierGate {
 protected:
  Engine* eng = nullptr;
  void Prepare(uint32_t shards) {
    Options o;
    o.shards = shards;
    ASSERT_NO_FATAL_FAILURE(Start(o));
    eng = &Register(SplitLayout(16, {SlotBytesForExtent(64 << 10)}));
    FillAndPublish(*eng, 1, 0, 4);  // four adjacent 64 KiB extents (per shard: round robin)
    faults->ResetCalls();
  }
};

TEST_F(TransferShape, FourAdjacentPagesAreOne256KiBRead) {
  Prepare(1);
  const double before = Counter("orbitkv_ssd_cufile_read_bytes_total");
  RestoreExact(*eng, 1, Range(8, 4));
  FaultInjectingPlatform::Calls c = faults->calls();
  EXPECT_EQ(c.reads, 1u);
  EXPECT_EQ(c.read_sizes, std::vector<uint64_t>({256u << 10}));
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total") - before, 256 << 10);
}

TEST_F(TransferShape, TwoFilesNeedTwoReads) {
  Prepare(2);
  const double before = Counter("orbitkv_ssd_cufile_read_bytes_total");
  RestoreExact(*eng, 1, Range(8, 4));
  FaultInjectingPlatform::Calls c = faults->calls();
  EXPECT_EQ(c.reads, 2u);
  EXPECT_EQ(c.read_sizes, std::vector<uint64_t>({128u << 10, 128u << 10}));
  ASSERT_EQ(c.read_fds.size(), 2u);
  EXPECT_NE(c.read_fds[0], c.read_fds[1]);
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total") - before, 256 << 10);
}

TEST_F(TransferShape, AlternatingPagesRead128KiBInTwoOperations) {
  Prepare(1);
  const double before = Counter("orbitkv_ssd_cufile_read_bytes_total");
  Scribble(*eng, 8);
  Scribble(*eng, 10);
  QueryResult q = Query(*eng, 1, 4);
  RestoreResult r = Restore(Req(*eng, q, {0, 2}, {8, 10}));
  for (const BlockResult& b : r.blocks) ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_TRUE(Holds(*eng, 8, 1));
  EXPECT_TRUE(Holds(*eng, 10, 3));
  ASSERT_TRUE(mgr->ReleaseQuery(session, q.query).ok());
  FaultInjectingPlatform::Calls c = faults->calls();
  EXPECT_EQ(c.reads, 2u);
  EXPECT_EQ(c.read_sizes, std::vector<uint64_t>({64u << 10, 64u << 10}));
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total") - before, 128 << 10);
}

// ---- selection ----------------------------------------------------------------------

TEST_F(GpuTierGate, AutoSelectsUringWhenTheDriverDoesNotOpen) {
  faults->FailOpenStorage(
      Status::Unavailable("cuFileDriverOpen: 5001 CU_FILE_DRIVER_NOT_INITIALIZED"));
  Options o;
  o.backend = SsdBackend::kAuto;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  EXPECT_FALSE(mgr->gauges().cufile_selected);
  Engine& e = Register(SplitLayout(16, {8192}));
  FillAndPublish(e, 1, 0, 2);
  RestoreExact(e, 1, {8, 9});
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_read_bytes_total"), 0);
  EXPECT_EQ(Counter("orbitkv_ssd_cufile_write_bytes_total"), 0);
}

TEST_F(GpuTierGate, ExplicitCufileFailsStartupOnDriverOrFileRegistrationErrors) {
  ManagerConfig c;
  c.options.pool_size = 32u << 20;
  c.options.ssd_cache_path = dir.File("cache.bin");
  c.options.ssd_cache_capacity = 8u << 20;
  c.options.ssd_backend = SsdBackend::kCufile;
  c.lock_memory = false;
  c.metrics = &metrics;
  c.gpu = faults.get();
  faults->FailRegisterFile(Status::Unavailable("cuFileHandleRegister: 5027 not supported"));
  auto m = Manager::Create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("cuFile"), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("5027"), std::string::npos) << m.status().ToString();
  faults->FailRegisterFile(Status::OK());
  c.gpu = nullptr;
  c.gpu_unavailable = "no CUDA device";
  m = Manager::Create(c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("cuFile"), std::string::npos) << m.status().ToString();
}

TEST_F(GpuTierGate, CufileSelectionReservesTheCapacityUpFront) {
  Options o;
  o.capacity = 8u << 20;
  o.shards = 2;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  struct stat st {};
  ASSERT_EQ(::stat(dir.File("cache.bin").c_str(), &st), 0);
  EXPECT_GE(uint64_t(st.st_blocks) * 512, (4u << 20));  // allocated, not sparse
}

}  // namespace
}  // namespace orbitkv
