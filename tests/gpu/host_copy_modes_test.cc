// The CUDA platform's host<->device movers (ORBITKV_GPU_COPY: staged, engines,
// kernel; gpu/copy_options.h) on a real GPU: many small copies between objects
// laid out as the pinned pool holds them (a header, then 512-byte aligned
// segments) and pages in random order, some copies large enough to go direct,
// both ways, every byte checked (to the host: bytes outside the copies stay as
// they were), and several threads on their own streams at once through one
// device's movers; the copy engines also in ramped batches
// (ORBITKV_GPU_COPY_FIRST_BATCH; 0: flat batches of 128). Skips without a CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/copy_options.h"
#include "gpu/cuda_platform.h"

namespace orbitkv::gpu {
namespace {

struct Scene {
  std::vector<CopyOp> to_device;  // object segment -> page
  uint64_t host_bytes = 0, device_bytes = 0;
};

// Objects of `slots` segments of varied sizes (and one 1.5 MiB segment every
// seventh object: a direct copy), each copied to its own page slot.
Scene MakeScene(std::mt19937_64& rng, DevPtr host, DevPtr dev, uint32_t objects, uint32_t slots) {
  Scene s;
  std::vector<uint64_t> sizes;
  uint64_t h = 0;
  for (uint32_t o = 0; o < objects; ++o) {
    h += 512;  // header
    for (uint32_t k = 0; k < slots; ++k) {
      const uint64_t n = (o % 7 == 3 && k == 0) ? (3u << 19) : 1 + rng() % 40000;
      sizes.push_back(n);
      s.to_device.push_back({0, host + h, n});
      h += (n + 511) / 512 * 512;
    }
  }
  s.host_bytes = h;
  std::vector<size_t> order(s.to_device.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  uint64_t d = 0;
  for (size_t i : order) {
    s.to_device[i].dst = dev + d;
    d += (s.to_device[i].bytes + 255) / 256 * 256;
  }
  s.device_bytes = d;
  return s;
}

class HostCopyModesTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HostCopyModesTest, ByteExactBothWaysAndConcurrent) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device";
  }
  // "MODE" or "MODE:N": N is ORBITKV_GPU_COPY_FIRST_BATCH (copy-engine
  // batches of N, 2N, 4N ... ops).
  const std::string param = GetParam();
  const size_t colon = param.find(':');
  ::setenv(kGpuCopyEnv, param.substr(0, colon).c_str(), 1);
  if (colon != std::string::npos) ::setenv(kGpuFirstBatchEnv, param.c_str() + colon + 1, 1);
  ::setenv(kGpuCopyStagingEnv, "1mib", 1);  // many chunks: both buffers reused often
  Result<std::unique_ptr<Platform>> platform = CreateCudaPlatform();
  ::unsetenv(kGpuCopyEnv);
  ::unsetenv(kGpuFirstBatchEnv);
  ::unsetenv(kGpuCopyStagingEnv);
  ASSERT_TRUE(platform.ok()) << platform.status().ToString();
  Result<Device*> dev = (*platform)->device(0);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  constexpr int kThreads = 4;
  constexpr uint64_t kHost = 48u << 20, kDev = 48u << 20;
  std::vector<void*> hosts(kThreads), devs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(cudaHostAlloc(&hosts[t], kHost, cudaHostAllocPortable), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&devs[t], kDev), cudaSuccess);
  }
  std::vector<std::string> failures(kThreads);
  auto work = [&](int t) {
    std::mt19937_64 rng(100 + t);
    auto* host = static_cast<uint8_t*>(hosts[t]);
    const auto h = reinterpret_cast<DevPtr>(host);
    const auto d = reinterpret_cast<DevPtr>(devs[t]);
    Result<std::unique_ptr<Stream>> stream = (*dev)->CreateStream();
    Result<std::unique_ptr<Event>> event = (*dev)->CreateEvent();
    if (!stream.ok() || !event.ok()) {
      failures[t] = "stream/event";
      return;
    }
    std::vector<uint8_t> page(kDev), back(kDev);
    for (int round = 0; round < 6 && failures[t].empty(); ++round) {
      Scene s = MakeScene(rng, h, d, 4 + rng() % 16, 8 + rng() % 64);
      if (s.host_bytes > kHost || s.device_bytes > kDev) continue;
      for (uint64_t i = 0; i < s.host_bytes; ++i) host[i] = static_cast<uint8_t>(rng());
      cudaMemset(devs[t], 0x5A, s.device_bytes);
      cudaDeviceSynchronize();
      // To the device.
      Status st = (*dev)->CopyAsync(s.to_device, **stream);
      if (st.ok()) st = (*dev)->Record(**event, **stream);
      if (st.ok()) st = (*dev)->Wait(**event);
      if (!st.ok()) {
        failures[t] = st.ToString();
        return;
      }
      cudaMemcpy(page.data(), devs[t], s.device_bytes, cudaMemcpyDeviceToHost);
      for (const CopyOp& op : s.to_device) {
        if (std::memcmp(page.data() + (op.dst - d), host + (op.src - h), op.bytes) != 0) {
          failures[t] = "to the device: wrong bytes in a " + std::to_string(op.bytes) + "-byte op";
          return;
        }
      }
      // To the host: new page bytes into the objects; the rest stays.
      for (uint64_t i = 0; i < s.device_bytes; ++i) page[i] = static_cast<uint8_t>(rng());
      cudaMemcpy(devs[t], page.data(), s.device_bytes, cudaMemcpyHostToDevice);
      std::vector<uint8_t> want(host, host + s.host_bytes);
      std::vector<CopyOp> ops;
      for (const CopyOp& op : s.to_device) {
        ops.push_back({op.src, op.dst, op.bytes});
        std::memcpy(want.data() + (op.src - h), page.data() + (op.dst - d), op.bytes);
      }
      st = (*dev)->CopyAsync(ops, **stream);
      if (st.ok()) st = (*dev)->Record(**event, **stream);
      if (st.ok()) st = (*dev)->Wait(**event);
      if (!st.ok()) {
        failures[t] = st.ToString();
        return;
      }
      if (std::memcmp(want.data(), host, s.host_bytes) != 0) {
        failures[t] = "to the host: wrong bytes (or bytes outside the copies written)";
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], "") << "thread " << t << ", mode " << GetParam();
    cudaFreeHost(hosts[t]);
    cudaFree(devs[t]);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, HostCopyModesTest,
                         ::testing::Values("staged", "engines", "kernel", "engines:0", "engines:3",
                                           "staged:1"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ':', '_');
                           return name;
                         });

}  // namespace
}  // namespace orbitkv::gpu
