// The GPU CRC32C (Device::Crc32cAsync, gpu/crc32c_kernel.cu) against ISA-L's
// (store/crc32c.h) on random data: random sizes from 0 bytes to tens of MiB,
// every start alignment, more ops than one launch carries, results in pinned
// host and in device memory; and its throughput, printed (the cuFile read
// route runs it over every segment before scattering). Skips without a GPU.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/crc32c_kernel.h"
#include "gpu/cuda_platform.h"
#include "store/crc32c.h"

namespace orbitkv::gpu {
namespace {

class Crc32cKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Platform>> p = CreateCudaPlatform();
    if (!p.ok()) GTEST_SKIP() << "no CUDA platform: " << p.status().ToString();
    platform_ = std::move(p).value();
    Result<Device*> d = platform_->device(0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    device_ = *d;
    auto s = device_->CreateStream();
    ASSERT_TRUE(s.ok());
    stream_ = std::move(s).value();
  }
  void TearDown() override {
    if (device_ == nullptr) return;
    for (DevPtr p : dev_) EXPECT_TRUE(device_->Free(p).ok());
    for (uint8_t* h : host_) EXPECT_TRUE(device_->FreeHost(h).ok());
    stream_.reset();
  }
  DevPtr Dev(uint64_t n) {
    auto p = device_->Allocate(n);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    dev_.push_back(p.ok() ? *p : 0);
    return dev_.back();
  }
  uint8_t* Host(uint64_t n) {
    auto p = device_->AllocateHost(n);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    host_.push_back(p.ok() ? *p : nullptr);
    return host_.back();
  }
  void Sync() {
    auto ev = device_->CreateEvent();
    ASSERT_TRUE(ev.ok());
    ASSERT_TRUE(device_->Record(**ev, *stream_).ok());
    ASSERT_TRUE(device_->Wait(**ev).ok());
  }
  // Random bytes at device address `dst` (staged through pinned memory).
  std::vector<uint8_t> Upload(DevPtr dst, uint64_t n, std::mt19937_64& rng) {
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    uint8_t* h = Host(n);
    std::memcpy(h, bytes.data(), n);
    const CopyOp op{dst, reinterpret_cast<DevPtr>(h), n};
    EXPECT_TRUE(device_->CopyAsync({&op, 1}, *stream_).ok());
    Sync();
    return bytes;
  }

  std::unique_ptr<Platform> platform_;
  Device* device_ = nullptr;
  std::unique_ptr<Stream> stream_;
  std::vector<DevPtr> dev_;
  std::vector<uint8_t*> host_;
};

TEST_F(Crc32cKernelTest, EqualsIsalOnRandomSizesAndAlignments) {
  std::mt19937_64 rng(20261201);
  constexpr uint64_t kBuffer = 48u << 20;
  const DevPtr buf = Dev(kBuffer);
  const std::vector<uint8_t> bytes = Upload(buf, kBuffer, rng);
  // Edge sizes, then random ones (mostly small, some up to 40 MiB), each at a
  // random start: more ops than one launch (kCrcOpsPerLaunch) carries.
  std::vector<CrcOp> ops;
  for (uint64_t n : {0ul, 1ul, 2ul, 3ul, 4ul, 5ul, 15ul, 16ul, 17ul, 255ul, 256ul, 4095ul, 4096ul,
                     4097ul, 65536ul + 3, (1ul << 20) + 1, 4ul << 20, 40ul << 20}) {
    for (uint64_t align = 0; align < 4; ++align) ops.push_back({buf + 1000 + align, n});
  }
  for (int i = 0; i < 300; ++i) {
    const uint64_t n = i % 50 == 0 ? rng() % (40u << 20) : rng() % 70000;
    ops.push_back({buf + rng() % (kBuffer - n), n});
  }
  ASSERT_GT(ops.size(), 2 * kCrcOpsPerLaunch);
  auto* out = reinterpret_cast<uint32_t*>(Host(4 * ops.size()));
  ASSERT_TRUE(device_->Crc32cAsync(ops, out, *stream_).ok());
  Sync();
  for (size_t i = 0; i < ops.size(); ++i) {
    const uint64_t at = ops[i].data - buf;
    ASSERT_EQ(out[i], Crc32c({bytes.data() + at, ops[i].bytes}))
        << "op " << i << ": " << ops[i].bytes << " bytes at offset " << at;
  }
  // Results into device memory work too.
  const DevPtr dev_out = Dev(4 * ops.size());
  ASSERT_TRUE(device_->Crc32cAsync(ops, reinterpret_cast<uint32_t*>(dev_out), *stream_).ok());
  auto* back = reinterpret_cast<uint32_t*>(Host(4 * ops.size()));
  const CopyOp op{reinterpret_cast<DevPtr>(back), dev_out, 4 * ops.size()};
  ASSERT_TRUE(device_->CopyAsync({&op, 1}, *stream_).ok());
  Sync();
  EXPECT_EQ(std::memcmp(back, out, 4 * ops.size()), 0);
}

TEST_F(Crc32cKernelTest, CheckValueAndRefusedInput) {
  const DevPtr buf = Dev(16);
  uint8_t* h = Host(16);
  std::memcpy(h, "123456789", 9);
  const CopyOp op{buf, reinterpret_cast<DevPtr>(h), 9};
  ASSERT_TRUE(device_->CopyAsync({&op, 1}, *stream_).ok());
  auto* out = reinterpret_cast<uint32_t*>(Host(4));
  const CrcOp crc{buf, 9};
  ASSERT_TRUE(device_->Crc32cAsync({&crc, 1}, out, *stream_).ok());
  Sync();
  EXPECT_EQ(*out, 0xE3069283u);
  EXPECT_EQ(device_->Crc32cAsync({&crc, 1}, nullptr, *stream_).code(),
            StatusCode::kInvalidArgument);
  const CrcOp null_op{0, 5};
  EXPECT_EQ(device_->Crc32cAsync({&null_op, 1}, out, *stream_).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(Crc32cKernelTest, ThroughputOfSegmentsOfOneStagingSlot) {
  // What the cuFile read route verifies per batch: a 4 MiB slot of 64 KiB to
  // 2 MiB segments.
  std::mt19937_64 rng(7);
  const DevPtr buf = Dev(4u << 20);
  Upload(buf, 4u << 20, rng);
  auto* out = reinterpret_cast<uint32_t*>(Host(4 * 64));
  for (uint64_t seg : {64u << 10, 512u << 10, 2u << 20}) {
    std::vector<CrcOp> ops;
    for (uint64_t at = 0; at + seg <= (4u << 20); at += seg) ops.push_back({buf + at, seg});
    for (int warm = 0; warm < 3; ++warm) ASSERT_TRUE(device_->Crc32cAsync(ops, out, *stream_).ok());
    Sync();
    constexpr int kIters = 50;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) ASSERT_TRUE(device_->Crc32cAsync(ops, out, *stream_).ok());
    Sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("GPU CRC32C over a 4 MiB slot of %llu KiB segments: %.1f GB/s\n",
                static_cast<unsigned long long>(seg >> 10), kIters * double(4u << 20) / s / 1e9);
  }
}

}  // namespace
}  // namespace orbitkv::gpu
