// The CUDA Platform (gpu/cuda_platform.h) on a real GPU: allocation, the
// copy paths (gather/scatter kernel for device-to-device ops of any size and
// alignment, copy engines for pinned host memory), memset, event and host
// function ordering, IPC with a second process, and cuFile stream I/O.
//
// Without a CUDA device every GPU case skips; CreateDefaultPlatform's
// no-device answer is checked everywhere. The storage case skips (naming why)
// when libcufile is absent or refuses the driver or the file; for functional
// runs set CUFILE_ALLOW_COMPAT_MODE=true CUFILE_FORCE_COMPAT_MODE=true and a
// TMPDIR on a mount cuFile accepts (see shared/gpu): results then establish
// compatibility-mode correctness, not native GPUDirect Storage.
// ORBITKV_GPU_TEST_REQUIRE_CUFILE=1 turns the storage skips into failures.
//
// The IPC case re-executes this binary (/proc/self/exe) with a filter that
// selects CudaPlatformIpcChild and kIpcChildEnv set: that child allocates,
// fills and exports device memory, then waits for the parent.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fill_pattern.h"
#include "gpu/copy_kernels.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_platform.h"
#include "gpu/platform_default.h"
#include "store/crc32c.h"
#include "testing/temp_dir.h"

extern char** environ;

namespace orbitkv::gpu {
namespace {

constexpr const char* kIpcChildEnv = "ORBITKV_CUDA_PLATFORM_TEST_IPC_CHILD";
constexpr const char* kIpcChildFilter = "--gtest_filter=CudaPlatformIpcChild.ExportsAnAllocation";
// The child's ends of the two pipes, at fixed descriptor numbers.
constexpr int kChildOutFd = 100;
constexpr int kChildInFd = 101;
constexpr uint64_t kIpcBytes = 8u << 20;  // a multiple of the allocation granularity
constexpr uint32_t kIpcSeed = 0x1bc0ffeeu;
constexpr uint32_t kIpcMagic = 0x4f4b5650u;

// What the child sends: its exported handle, or ok == 0 and a message.
struct IpcMessage {
  uint32_t magic = kIpcMagic;
  uint32_t ok = 0;
  uint64_t bytes = 0;
  uint8_t handle[64] = {};
  char error[256] = {};
};

bool RequireCuFile() {
  const char* v = std::getenv("ORBITKV_GPU_TEST_REQUIRE_CUFILE");
  return v != nullptr && std::string(v) == "1";
}

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Byte i of the pattern seeded with `seed` (PatternWord's bytes, little endian).
uint8_t PatternByte(size_t i, uint32_t seed) {
  return static_cast<uint8_t>(testing::PatternWord(i / 4, seed) >> (8 * (i % 4)));
}

void FillPatternBytes(uint8_t* out, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) out[i] = PatternByte(i, seed);
}

// "first mismatch at byte 17 (expected 0x3a, got 0x00), 5 bytes differ" or "".
std::string CompareBytes(const uint8_t* expected, const uint8_t* got, size_t n) {
  size_t first = n;
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    if (expected[i] != got[i]) {
      if (first == n) first = i;
      ++count;
    }
  }
  if (count == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "first mismatch at byte %zu (expected 0x%02x, got 0x%02x), %zu "
                "bytes differ",
                first, expected[first], got[first], count);
  return buf;
}

// Drains `stream` when it goes out of scope: work enqueued by a test that
// refers to its locals (AsyncIo, captured variables) must finish before they
// go, however the test leaves.
struct SyncOnExit {
  Device* dev;
  Stream* stream;
  ~SyncOnExit() { dev->Synchronize(*stream).IgnoreError("test cleanup"); }
};

// The GPU cases need no device here: this runs everywhere.
TEST(CudaPlatformDefaultTest, DefaultPlatformMatchesTheHost) {
  std::string why;
  std::unique_ptr<Platform> platform = CreateDefaultPlatform(&why);
  Result<int> count = DeviceCount();
  if (count.ok() && *count > 0) {
    ASSERT_NE(platform, nullptr) << why;
    EXPECT_EQ(platform->device_count(), *count);
    EXPECT_TRUE(Contains(platform->Describe(), "CUDA")) << platform->Describe();
    std::printf("default platform: %s\n", platform->Describe().c_str());
  } else {
    EXPECT_EQ(platform, nullptr);
    EXPECT_TRUE(Contains(why, "no CUDA device")) << why;
    Result<std::unique_ptr<Platform>> cuda = CreateCudaPlatform();
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable) << cuda.status().ToString();
    std::printf("no default platform: %s\n", why.c_str());
  }
}

class CudaPlatformTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::unique_ptr<Platform>> platform = CreateCudaPlatform();
    if (!platform.ok()) {
      skip_reason_ = "no CUDA platform: " + platform.status().ToString();
      return;
    }
    platform_ = std::move(platform).value().release();
    std::printf("%s; cudaMemcpyBatchAsync %s\n", platform_->Describe().c_str(),
                EngineBatchCopyAvailable() ? "available" : "not available");
  }

  static void TearDownTestSuite() {
    delete platform_;
    platform_ = nullptr;
  }

  void SetUp() override {
    if (platform_ == nullptr) GTEST_SKIP() << skip_reason_;
    Result<Device*> device = platform_->device(0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    dev_ = *device;
    Result<std::unique_ptr<Stream>> stream = dev_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    stream_ = std::move(stream).value();
    Result<std::unique_ptr<Event>> event = dev_->CreateEvent();
    ASSERT_TRUE(event.ok()) << event.status().ToString();
    event_ = std::move(event).value();
  }

  void TearDown() override {
    if (dev_ != nullptr && stream_ != nullptr) {
      EXPECT_TRUE(dev_->Synchronize(*stream_).ok());
    }
    for (DevPtr p : allocations_) EXPECT_TRUE(dev_->Free(p).ok());
    event_.reset();
    stream_.reset();
  }

  // Device memory freed at TearDown.
  DevPtr Alloc(uint64_t bytes) {
    Result<DevPtr> p = dev_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return 0;
    allocations_.push_back(*p);
    return *p;
  }

  static PinnedAllocation Pinned(size_t bytes) {
    Result<PinnedAllocation> p = PinnedAllocation::Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : PinnedAllocation();
  }

  static DevPtr Addr(const void* host) { return reinterpret_cast<DevPtr>(host); }

  // ScattersAThousandUnalignedOps and ScattersOpsAcrossLaunchBoundaries.
  void ScatterUnalignedOps(int count, bool empties, uint64_t seed);
  void Copy(std::vector<CopyOp> ops) {
    Status st = dev_->CopyAsync(ops, *stream_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  // Records the test's event on its stream and waits for it.
  void Drain() {
    ASSERT_TRUE(dev_->Record(*event_, *stream_).ok());
    Status st = dev_->Wait(*event_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void Upload(DevPtr dst, const uint8_t* host, size_t n) {
    PinnedAllocation staging = Pinned(n);
    ASSERT_TRUE(staging);
    std::memcpy(staging.data(), host, n);
    ASSERT_NO_FATAL_FAILURE(Copy({{dst, Addr(staging.data()), n}}));
    ASSERT_NO_FATAL_FAILURE(Drain());
  }

  std::vector<uint8_t> Download(DevPtr src, size_t n) {
    std::vector<uint8_t> out(n);
    PinnedAllocation staging = Pinned(n);
    EXPECT_TRUE(staging);
    if (!staging) return out;
    EXPECT_TRUE(
        dev_->CopyAsync(std::vector<CopyOp>{{Addr(staging.data()), src, n}}, *stream_).ok());
    Drain();
    std::memcpy(out.data(), staging.data(), n);
    return out;
  }

  static Platform* platform_;
  static std::string skip_reason_;

  Device* dev_ = nullptr;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Event> event_;
  std::vector<DevPtr> allocations_;
};

Platform* CudaPlatformTest::platform_ = nullptr;
std::string CudaPlatformTest::skip_reason_;

TEST_F(CudaPlatformTest, DevicesAndAllocation) {
  EXPECT_TRUE(Contains(platform_->Describe(), "CUDA")) << platform_->Describe();
  Result<Device*> again = platform_->device(0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, dev_);
  EXPECT_EQ(dev_->ordinal(), 0);
  EXPECT_EQ(platform_->device(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(platform_->device(platform_->device_count()).status().code(),
            StatusCode::kInvalidArgument);

  Result<DevPtr> p = dev_->Allocate(1u << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_NE(*p, 0u);
  EXPECT_EQ(*p % 256, 0u);
  EXPECT_TRUE(dev_->Free(*p).ok());
  EXPECT_EQ(dev_->Allocate(0).status().code(), StatusCode::kInvalidArgument);
  Result<DevPtr> huge = dev_->Allocate(uint64_t{1} << 52);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().ToString();
  EXPECT_TRUE(dev_->Free(0).ok());
}

// 1000 ops of odd sizes at random offsets (every alignment class) plus a few
// large and 16-byte aligned ones, in one call: the gather/scatter kernel over
// several launches. Gaps between destinations must stay untouched.
// Device-to-device ops of 1..9001 bytes, some 16-aligned, two of over a MiB,
// and every fifth op of zero bytes when `empties`, scattered with gaps into
// a zeroed buffer; the buffer must then hold them and zeros between.
void CudaPlatformTest::ScatterUnalignedOps(int count, bool empties, uint64_t seed) {
  constexpr size_t kSrcBytes = 8u << 20;
  constexpr size_t kDstBytes = 24u << 20;
  const DevPtr src = Alloc(kSrcBytes);
  const DevPtr dst = Alloc(kDstBytes);
  ASSERT_NE(src, 0u);
  ASSERT_NE(dst, 0u);
  std::vector<uint8_t> src_host(kSrcBytes);
  FillPatternBytes(src_host.data(), kSrcBytes, static_cast<uint32_t>(seed));
  ASSERT_NO_FATAL_FAILURE(Upload(src, src_host.data(), kSrcBytes));
  ASSERT_TRUE(dev_->MemsetAsync(dst, 0, kDstBytes, *stream_).ok());

  std::mt19937_64 rng(seed);
  std::vector<CopyOp> ops;
  std::vector<uint8_t> expected(kDstBytes, 0);
  uint64_t dst_off = 0;
  for (int i = 0; i < count; ++i) {
    if (empties && i % 5 == 4) ops.push_back({dst, src, 0});  // not counted as an op of a launch
    uint64_t size = 1 + rng() % 9001;
    uint64_t src_off = 0;
    if (i % 10 == 3) {  // fully 16-aligned: the vector path without head or tail
      size = 16 * (1 + rng() % 512);
      dst_off = (dst_off + 15) & ~uint64_t{15};
      src_off = 16 * (rng() % ((kSrcBytes - size) / 16));
    } else {
      if (i == count / 2) size = (3u << 20) + 5;  // many blocks for one op
      if (i == count * 7 / 10) size = (1u << 20) + 1;
      src_off = rng() % (kSrcBytes - size);
    }
    ASSERT_LE(dst_off + size, kDstBytes);
    ops.push_back({dst + dst_off, src + src_off, size});
    std::memcpy(&expected[dst_off], &src_host[src_off], size);
    dst_off += size + rng() % 64;  // gaps of 0..63 bytes stay zero
  }
  ops.push_back({dst, src, 0});  // zero-byte ops are no-ops
  ASSERT_NO_FATAL_FAILURE(Copy(ops));
  ASSERT_NO_FATAL_FAILURE(Drain());
  const std::vector<uint8_t> got = Download(dst, kDstBytes);
  EXPECT_EQ(CompareBytes(expected.data(), got.data(), kDstBytes), "") << count << " ops";
}

TEST_F(CudaPlatformTest, ScattersAThousandUnalignedOps) {
  ScatterUnalignedOps(1000, /*empties=*/false, 20261129);
}

// A call's ops go in launches of 128 or of up to 1024 (copy_kernels.h):
// counts at and beyond each size, with zero-byte ops between that no launch
// counts.
TEST_F(CudaPlatformTest, ScattersOpsAcrossLaunchBoundaries) {
  for (int count : {1, 128, 129, 160, 1024, 1025, 2100}) {
    ASSERT_NO_FATAL_FAILURE(ScatterUnalignedOps(count, /*empties=*/true, 7000 + count));
  }
}

// Pinned host memory through the copy engines, in both directions, scattered
// over several ops, and mixed with device-to-device ops in one call.
TEST_F(CudaPlatformTest, CopiesPinnedHostMemoryBothWays) {
  constexpr size_t kBytes = (1u << 20) + 123;
  constexpr uint32_t kSeed = 0x0badf00du;
  PinnedAllocation up = Pinned(kBytes);
  PinnedAllocation down = Pinned(kBytes);
  ASSERT_TRUE(up && down);
  auto* up_bytes = static_cast<uint8_t*>(up.data());
  FillPatternBytes(up_bytes, kBytes, kSeed);
  std::memset(down.data(), 0, kBytes);
  const DevPtr a = Alloc(kBytes);
  const DevPtr b = Alloc(kBytes);
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);

  // H2D in uneven pieces.
  const uint64_t cuts[] = {0, 1, 4097, 65536 + 3, 300001, 777777, kBytes};
  std::vector<CopyOp> h2d;
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    h2d.push_back({a + cuts[i], Addr(up_bytes + cuts[i]), cuts[i + 1] - cuts[i]});
  }
  ASSERT_NO_FATAL_FAILURE(Copy(h2d));
  // D2D (kernel) and D2H (engines) in one call: a -> b, and a -> down.
  std::vector<CopyOp> mixed;
  auto* down_bytes = static_cast<uint8_t*>(down.data());
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    const uint64_t n = cuts[i + 1] - cuts[i];
    mixed.push_back({b + cuts[i], a + cuts[i], n});
    mixed.push_back({Addr(down_bytes + cuts[i]), a + cuts[i], n});
  }
  ASSERT_NO_FATAL_FAILURE(Copy(mixed));
  ASSERT_NO_FATAL_FAILURE(Drain());
  EXPECT_EQ(CompareBytes(up_bytes, down_bytes, kBytes), "") << "H2D then D2H";
  const std::vector<uint8_t> via_kernel = Download(b, kBytes);
  EXPECT_EQ(CompareBytes(up_bytes, via_kernel.data(), kBytes), "") << "H2D then D2D";

  // Pageable host memory is refused before anything is enqueued.
  std::vector<uint8_t> pageable(4096);
  Status st =
      dev_->CopyAsync(std::vector<CopyOp>{{a, Addr(pageable.data()), pageable.size()}}, *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_TRUE(dev_->CopyAsync({}, *stream_).ok());
}

// The device classifies copy addresses from a table of its own allocations
// and the registered host ranges, shared by calls (gpu/address_ranges.h). It
// must follow them: memory freed after a copy is refused by the next one
// (not taken as the device memory it was), and a host range registered or
// unregistered between two copies is seen by the second.
TEST_F(CudaPlatformTest, CopyClassificationFollowsFreesAndHostRegistrations) {
  constexpr size_t kBytes = 1u << 20;
  PinnedAllocation up = Pinned(kBytes);
  ASSERT_TRUE(up);
  FillPatternBytes(static_cast<uint8_t*>(up.data()), kBytes, 0x7a11e5u);
  Result<DevPtr> a = dev_->Allocate(kBytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_NO_FATAL_FAILURE(Copy({{*a, Addr(up.data()), kBytes}}));
  ASSERT_NO_FATAL_FAILURE(Drain());
  ASSERT_TRUE(dev_->Free(*a).ok());
  Status st = dev_->CopyAsync(std::vector<CopyOp>{{*a, Addr(up.data()), kBytes}}, *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "a freed allocation: " << st.ToString();

  // Page-aligned pageable memory, registered after a copy classified the rest.
  const DevPtr b = Alloc(kBytes);
  ASSERT_NE(b, 0u);
  void* raw = nullptr;
  ASSERT_EQ(posix_memalign(&raw, 4096, kBytes), 0);
  std::unique_ptr<void, decltype(&std::free)> host(raw, &std::free);
  FillPatternBytes(static_cast<uint8_t*>(raw), kBytes, 0x5eed5u);
  st = dev_->CopyAsync(std::vector<CopyOp>{{b, Addr(raw), kBytes}}, *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "not yet registered: " << st.ToString();
  ASSERT_TRUE(RegisterHostMemory(raw, kBytes).ok());
  ASSERT_NO_FATAL_FAILURE(Copy({{b, Addr(raw), kBytes}}));
  ASSERT_NO_FATAL_FAILURE(Drain());
  const std::vector<uint8_t> got = Download(b, kBytes);
  EXPECT_EQ(CompareBytes(static_cast<uint8_t*>(raw), got.data(), kBytes), "");
  ASSERT_TRUE(UnregisterHostMemory(raw).ok());
  st = dev_->CopyAsync(std::vector<CopyOp>{{b, Addr(raw), kBytes}}, *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "unregistered: " << st.ToString();
}

// Device::GatherObjectsAsync (Publish's whole-object D2H of small slots):
// every slot of every object byte-exact at its object offset, with the
// CRC32C the CPU computes, the bytes between slots zeros; slots of odd
// sizes and a misaligned one (the kernel's byte path), 70 objects (a large
// launch) into pinned memory and 3 (a small one) into device memory; and
// every refusal made before anything is enqueued.
TEST_F(CudaPlatformTest, GathersWholeObjectsWithTheirSlotCrcs) {
  constexpr uint64_t kPages = 100;
  struct Shape {
    uint64_t bytes, stride, base_skew;
  };
  const Shape shapes[] = {
      {4096, 4096, 0}, {1000, 1024, 8}, {16384, 16384, 0}, {48, 512, 0}, {4112, 8192, 16}};
  std::vector<SlotSpan> spans;
  uint64_t offset = 0;
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint8_t>> page_bytes;  // per slot, the whole region
  for (const Shape& sh : shapes) {
    const uint64_t region = sh.base_skew + sh.stride * kPages;
    const DevPtr base = Alloc(region);
    ASSERT_NE(base, 0u);
    std::vector<uint8_t> b(region);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    ASSERT_NO_FATAL_FAILURE(Upload(base, b.data(), b.size()));
    page_bytes.push_back(std::move(b));
    spans.push_back({base + sh.base_skew, sh.stride, sh.bytes, offset});
    offset = (offset + sh.bytes + 511) / 512 * 512;
  }
  Result<std::unique_ptr<SlotTable>> made = dev_->CreateSlotTable(spans, kPages);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const SlotTable& table = **made;
  ASSERT_EQ(table.slots(), spans.size());
  const uint64_t object_bytes = table.object_bytes();
  EXPECT_EQ(object_bytes, spans.back().offset + spans.back().bytes);
  const uint64_t stride = (object_bytes + 511) / 512 * 512;

  const auto check = [&](const uint8_t* objects, const uint32_t* crcs,
                         const std::vector<ObjectGather>& todo, uint64_t base) {
    for (size_t i = 0; i < todo.size(); ++i) {
      const uint8_t* obj = objects + (todo[i].object - base);
      uint64_t at = 0;
      for (size_t j = 0; j < spans.size(); ++j) {
        const uint8_t* want =
            page_bytes[j].data() + shapes[j].base_skew + todo[i].page * spans[j].stride;
        for (; at < spans[j].offset; ++at) {
          ASSERT_EQ(obj[at], 0) << "object " << i << " byte " << at << " between slots";
        }
        ASSERT_EQ(CompareBytes(want, obj + spans[j].offset, spans[j].bytes), "")
            << "object " << i << " slot " << j;
        EXPECT_EQ(crcs[i * spans.size() + j], Crc32c({want, spans[j].bytes}))
            << "object " << i << " slot " << j;
        at = spans[j].offset + spans[j].bytes;
      }
    }
  };

  // 70 objects into registered host memory (as the Manager's pool is: the
  // staged path, gathered into device staging and moved by the copy
  // engines), CRCs into pinned memory.
  constexpr size_t kObjects = 70;
  const size_t host_bytes = (kObjects * stride + 4095) / 4096 * 4096;
  void* raw = nullptr;
  ASSERT_EQ(posix_memalign(&raw, 4096, host_bytes), 0);
  std::unique_ptr<void, decltype(&std::free)> objects(raw, &std::free);
  ASSERT_TRUE(RegisterHostMemory(raw, host_bytes).ok());
  struct Unregister {
    void* p;
    ~Unregister() { UnregisterHostMemory(p).IgnoreError("test teardown"); }
  } unregister{raw};
  PinnedAllocation crcs = Pinned(kObjects * spans.size() * sizeof(uint32_t));
  ASSERT_TRUE(crcs);
  std::memset(raw, 0xEE, host_bytes);
  auto* obj_bytes = static_cast<uint8_t*>(raw);
  std::vector<ObjectGather> todo;
  for (size_t i = 0; i < kObjects; ++i)
    todo.push_back({rng() % kPages, Addr(obj_bytes + i * stride)});
  auto* crc_out = static_cast<uint32_t*>(crcs.data());
  Status st = dev_->GatherObjectsAsync(table, todo, crc_out, *stream_);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_NO_FATAL_FAILURE(Drain());
  check(obj_bytes, crc_out, todo, Addr(obj_bytes));

  // 5 objects into pinned memory the driver classifies.
  PinnedAllocation pinned = Pinned(5 * stride);
  ASSERT_TRUE(pinned);
  std::memset(pinned.data(), 0xEE, 5 * stride);
  auto* pinned_bytes = static_cast<uint8_t*>(pinned.data());
  std::vector<ObjectGather> five;
  for (size_t i = 0; i < 5; ++i) five.push_back({rng() % kPages, Addr(pinned_bytes + i * stride)});
  st = dev_->GatherObjectsAsync(table, five, crc_out, *stream_);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_NO_FATAL_FAILURE(Drain());
  check(pinned_bytes, crc_out, five, Addr(pinned_bytes));

  // 3 objects into device memory, CRCs into device memory.
  const DevPtr dev_objects = Alloc(3 * stride);
  const DevPtr dev_crcs = Alloc(3 * spans.size() * sizeof(uint32_t));
  ASSERT_TRUE(dev_objects != 0 && dev_crcs != 0);
  ASSERT_TRUE(dev_->MemsetAsync(dev_objects, 0xEE, 3 * stride, *stream_).ok());
  std::vector<ObjectGather> three = {
      {kPages - 1, dev_objects}, {0, dev_objects + stride}, {42, dev_objects + 2 * stride}};
  st = dev_->GatherObjectsAsync(table, three, reinterpret_cast<uint32_t*>(dev_crcs), *stream_);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_NO_FATAL_FAILURE(Drain());
  const std::vector<uint8_t> got = Download(dev_objects, 3 * stride);
  const std::vector<uint8_t> got_crcs = Download(dev_crcs, 3 * spans.size() * sizeof(uint32_t));
  check(got.data(), reinterpret_cast<const uint32_t*>(got_crcs.data()), three, dev_objects);

  // Refusals, nothing enqueued.
  std::vector<uint8_t> pageable(stride);
  const auto code = [&](std::vector<ObjectGather> o, uint32_t* c) {
    return dev_->GatherObjectsAsync(table, o, c, *stream_).code();
  };
  EXPECT_EQ(code({{kPages, Addr(obj_bytes)}}, crc_out), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{0, Addr(pageable.data())}}, crc_out), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{0, Addr(obj_bytes)}}, nullptr), StatusCode::kInvalidArgument);
  std::vector<uint32_t> pageable_crcs(spans.size());
  EXPECT_EQ(code({{0, Addr(obj_bytes)}}, pageable_crcs.data()), StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev_->GatherObjectsAsync(table, {}, nullptr, *stream_).ok());
  const auto table_code = [&](std::vector<SlotSpan> sl, uint64_t pages) {
    return dev_->CreateSlotTable(sl, pages).status().code();
  };
  SlotSpan past = spans[0];
  EXPECT_EQ(table_code({past}, kPages + 1), StatusCode::kInvalidArgument) << "past its allocation";
  SlotSpan host = {Addr(pageable.data()), 0, 64, 0};
  EXPECT_EQ(table_code({host}, 1), StatusCode::kInvalidArgument) << "host memory";
  SlotSpan big = spans[2];
  big.bytes = kGatherSlotMaxBytes + 16;
  EXPECT_EQ(table_code({big}, 1), StatusCode::kInvalidArgument) << "over 16 KiB";
  SlotSpan skewed = spans[0];
  skewed.offset = 8;
  EXPECT_EQ(table_code({skewed}, kPages), StatusCode::kInvalidArgument) << "misaligned offset";
  SlotSpan overlapping = spans[0];
  overlapping.offset = spans[1].offset - 512;  // spans[0] is 4096 bytes at 0: overlaps [1]
  EXPECT_EQ(table_code({spans[0], spans[1], overlapping}, kPages), StatusCode::kInvalidArgument);
  EXPECT_EQ(table_code({}, kPages), StatusCode::kInvalidArgument);
  EXPECT_EQ(table_code({spans[0]}, 0), StatusCode::kInvalidArgument);
}

// Regression (session 19: a gathered 70B publish restored wrong bytes for
// its first block on an H200 beside a busy GPU): CreateSlotTable uploaded its
// table with cudaMemcpy from pageable memory, which may return before the
// DMA reaches the device, and the first gather's kernel, on a non-blocking
// stream, is not ordered after it, so it could read the table before it
// arrived. Here the copy engines are kept busy by 256 MiB host-to-device
// copies queued on another stream when the table is made, and the first
// gather is launched at once: every object must hold its slots' bytes.
TEST_F(CudaPlatformTest, AGatherRightAfterItsTableIsMadeSeesTheWholeTable) {
  constexpr uint64_t kSlot = 4096, kPages = 64, kSlots = 8, kBig = 256u << 20;
  const DevPtr pages = Alloc(kSlots * kPages * kSlot);
  const DevPtr sink = Alloc(kBig);
  ASSERT_TRUE(pages != 0 && sink != 0);
  std::vector<uint8_t> bytes(kSlots * kPages * kSlot);
  std::mt19937_64 rng(19);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  ASSERT_NO_FATAL_FAILURE(Upload(pages, bytes.data(), bytes.size()));
  PinnedAllocation big = Pinned(kBig);
  PinnedAllocation objects = Pinned(kPages * kSlots * kSlot);
  PinnedAllocation crcs = Pinned(kPages * kSlots * sizeof(uint32_t));
  ASSERT_TRUE(big && objects && crcs);
  std::memset(objects.data(), 0xEE, kPages * kSlots * kSlot);
  Result<std::unique_ptr<Stream>> busy = dev_->CreateStream();
  ASSERT_TRUE(busy.ok());
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(dev_->CopyAsync(std::vector<CopyOp>{{sink, Addr(big.data()), kBig}}, **busy).ok());
  }
  std::vector<SlotSpan> spans;
  for (uint64_t j = 0; j < kSlots; ++j) {
    spans.push_back({pages + j * kPages * kSlot, kSlot, kSlot, j * kSlot});
  }
  Result<std::unique_ptr<SlotTable>> table = dev_->CreateSlotTable(spans, kPages);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  auto* obj = static_cast<uint8_t*>(objects.data());
  std::vector<ObjectGather> todo;
  for (uint64_t p = 0; p < kPages; ++p) todo.push_back({p, Addr(obj + p * kSlots * kSlot)});
  Status st =
      dev_->GatherObjectsAsync(**table, todo, static_cast<uint32_t*>(crcs.data()), *stream_);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_NO_FATAL_FAILURE(Drain());
  ASSERT_TRUE(dev_->Synchronize(**busy).ok());
  for (uint64_t p = 0; p < kPages; ++p) {
    for (uint64_t j = 0; j < kSlots; ++j) {
      const uint8_t* want = bytes.data() + (j * kPages + p) * kSlot;
      ASSERT_EQ(CompareBytes(want, obj + (p * kSlots + j) * kSlot, kSlot), "")
          << "page " << p << " slot " << j;
      ASSERT_EQ(static_cast<uint32_t*>(crcs.data())[p * kSlots + j], Crc32c({want, kSlot}));
    }
  }
}

TEST_F(CudaPlatformTest, MemsetsAnUnalignedRange) {
  constexpr size_t kBytes = 1u << 20;
  const DevPtr p = Alloc(kBytes);
  ASSERT_NE(p, 0u);
  ASSERT_TRUE(dev_->MemsetAsync(p, 0, kBytes, *stream_).ok());
  ASSERT_TRUE(dev_->MemsetAsync(p + 7, 0xab, 100003, *stream_).ok());
  ASSERT_TRUE(dev_->MemsetAsync(p, 0xcd, 0, *stream_).ok());
  const std::vector<uint8_t> got = Download(p, kBytes);
  std::vector<uint8_t> expected(kBytes, 0);
  std::memset(&expected[7], 0xab, 100003);
  EXPECT_EQ(CompareBytes(expected.data(), got.data(), kBytes), "");
}

// An event completes only after the work before it: a host function held
// closed keeps a later event (and a later memset) pending.
TEST_F(CudaPlatformTest, EventsCompleteAfterEarlierWork) {
  Result<std::unique_ptr<Event>> fresh = dev_->CreateEvent();
  ASSERT_TRUE(fresh.ok());
  Result<bool> never_recorded = dev_->Poll(**fresh);
  ASSERT_TRUE(never_recorded.ok()) << never_recorded.status().ToString();
  EXPECT_TRUE(*never_recorded) << "an event never recorded is complete";

  const DevPtr p = Alloc(4096);
  ASSERT_NE(p, 0u);
  ASSERT_TRUE(dev_->MemsetAsync(p, 0, 4096, *stream_).ok());
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  bool gate_set = false;
  // Opens the gate however the test leaves, so the stream can drain.
  auto open_gate = [&] {
    if (!gate_set) gate.set_value();
    gate_set = true;
  };
  struct Guard {
    std::function<void()> fn;
    ~Guard() { fn(); }
  } guard{open_gate};

  ASSERT_TRUE(dev_->HostFuncAsync([opened] { opened.wait(); }, *stream_).ok());
  ASSERT_TRUE(dev_->MemsetAsync(p, 0x5a, 4096, *stream_).ok());
  ASSERT_TRUE(dev_->Record(**fresh, *stream_).ok());
  for (int i = 0; i < 5; ++i) {
    Result<bool> done = dev_->Poll(**fresh);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_FALSE(*done) << "the event completed before the held host function returned";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  open_gate();
  Status st = dev_->Wait(**fresh);
  ASSERT_TRUE(st.ok()) << st.ToString();
  Result<bool> done = dev_->Poll(**fresh);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  const std::vector<uint8_t> got = Download(p, 4096);
  EXPECT_EQ(std::count(got.begin(), got.end(), uint8_t{0x5a}), 4096);
}

// Host functions run in stream order, each after the copies before it; one
// that throws does not stop the ones after it.
TEST_F(CudaPlatformTest, HostFunctionsRunInStreamOrder) {
  constexpr int kSteps = 100;
  const DevPtr p = Alloc(kSteps);
  ASSERT_NE(p, 0u);
  PinnedAllocation seen_by_host = Pinned(kSteps);
  ASSERT_TRUE(seen_by_host);
  auto* pinned = static_cast<volatile uint8_t*>(seen_by_host.data());
  std::mutex mu;
  std::vector<int> order;
  std::vector<int> values;
  // The host functions use these locals.
  SyncOnExit sync_on_exit{dev_, stream_.get()};
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(dev_->MemsetAsync(p + i, static_cast<uint8_t>(i + 1), 1, *stream_).ok());
    ASSERT_NO_FATAL_FAILURE(Copy({{Addr(seen_by_host.data()) + i, p + i, 1}}));
    ASSERT_TRUE(dev_->HostFuncAsync(
                        [&, i] {
                          std::lock_guard<std::mutex> lock(mu);
                          order.push_back(i);
                          values.push_back(pinned[i]);
                        },
                        *stream_)
                    .ok());
    if (i == kSteps / 2) {
      ASSERT_TRUE(
          dev_->HostFuncAsync([] { throw std::runtime_error("thrown on purpose"); }, *stream_)
              .ok());
    }
  }
  EXPECT_EQ(dev_->HostFuncAsync(nullptr, *stream_).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(dev_->Synchronize(*stream_).ok());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(order[i], i);
    EXPECT_EQ(values[i], i + 1) << "host function " << i << " ran before its copy";
  }
}

TEST_F(CudaPlatformTest, StorageCallsNeedOpenStorageAndOwnObjects) {
  Result<std::unique_ptr<Platform>> other = CreateCudaPlatform();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  Result<Device*> other_dev = (*other)->device(0);
  ASSERT_TRUE(other_dev.ok());
  EXPECT_EQ((*other)->RegisterFile(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*other_dev)->RegisterBuffer(1, 4096).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*other_dev)->RegisterStream(*stream_).code(), StatusCode::kFailedPrecondition);
  // This suite's stream and event belong to another platform.
  EXPECT_EQ((*other_dev)->Synchronize(*stream_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*other_dev)->Poll(*event_).status().code(), StatusCode::kInvalidArgument);
}

// ---- IPC ---------------------------------------------------------------------

bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ORBITKV_SYSCALL_RETRY(write(fd, p, n));
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes within timeout_ms; false on EOF, error or timeout.
bool ReadAll(int fd, void* data, size_t n, int timeout_ms) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (ORBITKV_SYSCALL_RETRY(poll(&pfd, 1, timeout_ms)) <= 0) return false;
    const ssize_t r = ORBITKV_SYSCALL_RETRY(read(fd, p, n));
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The exporting side, run only in the child process the IPC test starts.
TEST(CudaPlatformIpcChild, ExportsAnAllocation) {
  if (std::getenv(kIpcChildEnv) == nullptr) {
    GTEST_SKIP() << "runs only as the child process of OpensAnAllocationOfAnotherProcess";
  }
  IpcMessage msg;
  void* ptr = nullptr;
  auto fail = [&](const std::string& why) {
    std::snprintf(msg.error, sizeof(msg.error), "%s", why.c_str());
    WriteAll(kChildOutFd, &msg, sizeof(msg));
    FAIL() << why;
  };
  Status st = ORBITKV_CUDA_STATUS(cudaSetDevice(0));
  if (!st.ok()) return fail(st.ToString());
  st = ORBITKV_CUDA_STATUS(cudaMalloc(&ptr, kIpcBytes));
  if (!st.ok()) return fail(st.ToString());
  st = ORBITKV_CUDA_STATUS(
      testing::LaunchFillPattern(static_cast<uint32_t*>(ptr), kIpcBytes / 4, kIpcSeed, nullptr));
  if (st.ok()) st = ORBITKV_CUDA_STATUS(cudaDeviceSynchronize());
  cudaIpcMemHandle_t handle;
  if (st.ok()) st = ORBITKV_CUDA_STATUS(cudaIpcGetMemHandle(&handle, ptr));
  if (!st.ok()) {
    cudaFree(ptr);
    return fail(st.ToString());
  }
  static_assert(sizeof(handle) == sizeof(msg.handle));
  std::memcpy(msg.handle, &handle, sizeof(handle));
  msg.ok = 1;
  msg.bytes = kIpcBytes;
  ASSERT_TRUE(WriteAll(kChildOutFd, &msg, sizeof(msg)));
  // Keep the allocation alive until the parent is done (a byte, or EOF if it
  // died).
  char ack = 0;
  (void)ORBITKV_SYSCALL_RETRY(read(kChildInFd, &ack, 1));
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaFree(ptr)).ok());
}

TEST_F(CudaPlatformTest, OpensAnAllocationOfAnotherProcess) {
  // A handle that names nothing does not open.
  IpcHandle garbage{};
  Result<IpcMapping> bad = dev_->OpenIpc(garbage);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();

  int to_parent[2];
  int to_child[2];
  ASSERT_EQ(pipe2(to_parent, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(to_child, O_CLOEXEC), 0);
  char exe[4096];
  const ssize_t exe_len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(exe_len, 0);
  exe[exe_len] = '\0';

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_parent[1], kChildOutFd);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], kChildInFd);
  std::string child_env = std::string(kIpcChildEnv) + "=1";
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(child_env.data());
  envp.push_back(nullptr);
  std::string filter = kIpcChildFilter;
  char* argv[] = {exe, filter.data(), nullptr};
  pid_t pid = -1;
  const int spawn_rc = posix_spawn(&pid, exe, &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(to_parent[1]);
  close(to_child[0]);
  ASSERT_EQ(spawn_rc, 0) << std::strerror(spawn_rc);

  // However the test ends: release the child and reap it.
  struct Child {
    pid_t pid;
    int in;
    int out;
    int status = -1;
    void Finish() {
      if (in >= 0) {
        const char ack = 1;
        WriteAll(in, &ack, 1);
        close(in);
        in = -1;
      }
      if (pid > 0) {
        waitpid(pid, &status, 0);
        pid = -1;
      }
      if (out >= 0) close(out);
      out = -1;
    }
    ~Child() { Finish(); }
  } child{pid, to_child[1], to_parent[0]};

  IpcMessage msg;
  ASSERT_TRUE(ReadAll(child.out, &msg, sizeof(msg), 120000))
      << "the child sent no handle (see its output above)";
  ASSERT_EQ(msg.magic, kIpcMagic);
  ASSERT_EQ(msg.ok, 1u) << "child: " << msg.error;

  IpcHandle handle;
  std::memcpy(handle.data(), msg.handle, handle.size());
  Result<IpcMapping> mapping = dev_->OpenIpc(handle);
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  EXPECT_NE(mapping->base, 0u);
  EXPECT_EQ(mapping->bytes, kIpcBytes);

  std::vector<uint8_t> expected(kIpcBytes);
  FillPatternBytes(expected.data(), kIpcBytes, kIpcSeed);
  // Through the copy engines (D2H) and through the kernel (D2D, then D2H).
  const std::vector<uint8_t> direct = Download(mapping->base, kIpcBytes);
  EXPECT_EQ(CompareBytes(expected.data(), direct.data(), kIpcBytes), "") << "mapping -> host";
  const DevPtr local = Alloc(kIpcBytes);
  ASSERT_NE(local, 0u);
  ASSERT_NO_FATAL_FAILURE(Copy({{local + 1, mapping->base + 1, kIpcBytes - 2}}));
  ASSERT_NO_FATAL_FAILURE(Drain());
  std::vector<uint8_t> via_kernel = Download(local, kIpcBytes);
  via_kernel.front() = expected.front();
  via_kernel.back() = expected.back();
  EXPECT_EQ(CompareBytes(expected.data(), via_kernel.data(), kIpcBytes), "") << "mapping -> device";

  Status st = dev_->CloseIpc(mapping->base);
  EXPECT_TRUE(st.ok()) << st.ToString();
  child.Finish();
  ASSERT_TRUE(WIFEXITED(child.status)) << "child status " << child.status;
  EXPECT_EQ(WEXITSTATUS(child.status), 0);
}

// ---- cuFile ------------------------------------------------------------------

TEST_F(CudaPlatformTest, StorageStreamWriteThenRead) {
  Result<std::string> opened = platform_->OpenStorage(StoragePolicy::kExplicit);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kUnavailable && !RequireCuFile()) {
      GTEST_SKIP() << "cuFile not usable here: " << opened.status().ToString();
    }
    FAIL() << opened.status().ToString();
  }
  std::printf("%s\n", opened->c_str());
  Result<std::string> again = platform_->OpenStorage(StoragePolicy::kExplicit);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *opened);
  EXPECT_EQ(platform_->OpenStorage(StoragePolicy::kAutoNativeOnly).status().code(),
            StatusCode::kFailedPrecondition);

  orbitkv::testing::TempDir dir;
  const std::string path = dir.File("cuda-platform.bin");
  const int fd = open(path.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) GTEST_SKIP() << "O_DIRECT unsupported under " << dir.path();
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  struct CloseFd {
    int fd;
    ~CloseFd() { close(fd); }
  } close_fd{fd};
  Result<std::unique_ptr<StorageFile>> file = platform_->RegisterFile(fd);
  if (!file.ok()) {
    if (file.status().code() == StatusCode::kUnavailable && !RequireCuFile()) {
      GTEST_SKIP() << "cuFile refuses files under " << dir.path() << " (set TMPDIR to a mount it "
                   << "accepts): " << file.status().ToString();
    }
    FAIL() << file.status().ToString();
  }
  EXPECT_EQ((*file)->fd(), fd);

  constexpr uint64_t kBuffer = 4u << 20;
  constexpr size_t kIo = 1u << 20;
  constexpr off_t kFileOffset = 4096;
  constexpr off_t kReadInto = 2u << 20;
  constexpr uint32_t kSeed = 0xf11e0001u;
  const DevPtr buffer = Alloc(kBuffer);
  ASSERT_NE(buffer, 0u);
  ASSERT_TRUE(dev_->MemsetAsync(buffer, 0, kBuffer, *stream_).ok());
  ASSERT_NO_FATAL_FAILURE(Drain());
  Status st = dev_->RegisterBuffer(buffer, kBuffer);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = dev_->RegisterStream(*stream_);
  if (!st.ok()) {
    EXPECT_TRUE(dev_->DeregisterBuffer(buffer).ok());
    if (st.code() == StatusCode::kUnavailable && !RequireCuFile()) GTEST_SKIP() << st.ToString();
    FAIL() << st.ToString();
  }

  PinnedAllocation pattern = Pinned(kIo);
  ASSERT_TRUE(pattern);
  FillPatternBytes(static_cast<uint8_t*>(pattern.data()), kIo, kSeed);
  ASSERT_NO_FATAL_FAILURE(Copy({{buffer, Addr(pattern.data()), kIo}}));
  // Address-stable until the event after them completes.
  AsyncIo write_io;
  AsyncIo read_io;
  SyncOnExit sync_on_exit{dev_, stream_.get()};
  write_io.size = kIo;
  write_io.file_offset = kFileOffset;
  write_io.buf_offset = 0;
  write_io.bytes_done = -1;
  read_io.size = kIo;
  read_io.file_offset = kFileOffset;
  read_io.buf_offset = kReadInto;
  read_io.bytes_done = -1;
  st = dev_->WriteAsync(**file, buffer, &write_io, *stream_);
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = dev_->ReadAsync(**file, buffer, &read_io, *stream_);
  EXPECT_TRUE(st.ok()) << st.ToString();
  ASSERT_NO_FATAL_FAILURE(Drain());
  EXPECT_EQ(write_io.bytes_done, static_cast<ssize_t>(kIo));
  EXPECT_EQ(read_io.bytes_done, static_cast<ssize_t>(kIo));

  const std::vector<uint8_t> got = Download(buffer + kReadInto, kIo);
  EXPECT_EQ(CompareBytes(static_cast<const uint8_t*>(pattern.data()), got.data(), kIo), "")
      << "read back into the buffer";
  // The file's bytes, through the page cache rather than cuFile.
  std::vector<uint8_t> on_disk(kIo);
  const int plain = open(path.c_str(), O_RDONLY);
  ASSERT_GE(plain, 0);
  const ssize_t n = ORBITKV_SYSCALL_RETRY(pread(plain, on_disk.data(), kIo, kFileOffset));
  close(plain);
  ASSERT_EQ(n, static_cast<ssize_t>(kIo));
  EXPECT_EQ(CompareBytes(static_cast<const uint8_t*>(pattern.data()), on_disk.data(), kIo), "")
      << "file bytes";

  st = dev_->DeregisterStream(*stream_);
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = dev_->DeregisterBuffer(buffer);
  EXPECT_TRUE(st.ok()) << st.ToString();
  file->reset();
}

}  // namespace
}  // namespace orbitkv::gpu
