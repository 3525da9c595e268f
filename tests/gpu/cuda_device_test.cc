// Device smoke tests for the GPU tier: device discovery, a kernel round trip,
// and pinned allocation / host registration while another stream is being
// captured into a CUDA graph. Tests that need a GPU skip without one.
#include <cuda_runtime.h>  // the typed cudaMalloc overload

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fill_pattern.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_device.h"

namespace orbitkv::gpu {
namespace {

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Reads the calling thread's capture mode without changing it.
cudaStreamCaptureMode CurrentCaptureMode() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) return mode;
  cudaStreamCaptureMode restore = mode;
  (void)cudaThreadExchangeStreamCaptureMode(&restore);
  return mode;
}

// These run everywhere, GPU or not.
TEST(CudaCheckTest, DeviceCountNeverFailsWithoutAGpu) {
  auto count = DeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
    std::printf("DeviceCount() = %d\n", *count);
  } else {
    // Only a present-but-broken driver may report an error, never abort.
    EXPECT_EQ(count.status().code(), StatusCode::kUnavailable) << count.status().ToString();
  }
}

TEST(CudaCheckTest, StatusNamesTheCallAndLocation) {
  Status st = ORBITKV_CUDA_STATUS(cudaErrorMemoryAllocation);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(st.message(), "cudaErrorMemoryAllocation")) << st.ToString();
  EXPECT_TRUE(Contains(st.message(), "cuda_device_test.cc:")) << st.ToString();
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaSuccess).ok());
  EXPECT_EQ(ORBITKV_CUDA_STATUS(cudaErrorInvalidValue).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ORBITKV_CUDA_STATUS(cudaErrorStreamCaptureUnsupported).code(),
            StatusCode::kFailedPrecondition);
  Status sticky = ORBITKV_CUDA_STATUS(cudaErrorIllegalAddress);
  EXPECT_TRUE(Contains(sticky.message(), "sticky")) << sticky.ToString();
}

TEST(CudaCheckTest, SyscallRetryAndStatus) {
  int calls = 0;
  auto flaky = [&]() -> int {
    if (++calls < 3) {
      errno = EINTR;
      return -1;
    }
    return 7;
  };
  EXPECT_EQ(ORBITKV_SYSCALL_RETRY(flaky()), 7);
  EXPECT_EQ(calls, 3);
  auto fail = []() -> int {
    errno = ENOSPC;
    return -1;
  };
  Status st = ORBITKV_SYSCALL_STATUS("write /x [0, +4096)", fail());
  EXPECT_EQ(st.code(), StatusCode::kNoSpace);
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto count = DeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA device: " << count.status().ToString();
    if (*count == 0) GTEST_SKIP() << "no CUDA device on this host";
    count_ = *count;
    ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaSetDevice(0)).ok());
  }
  int count_ = 0;
};

TEST_F(CudaDeviceTest, CheckDevice) {
  Status st = CheckDevice(0);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(CheckDevice(count_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckDevice(-1).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, KernelFillsPatternAndCopiesBack) {
  constexpr size_t kWords = (4u << 20) / sizeof(uint32_t) + 13;  // not a multiple of a block
  constexpr uint32_t kSeed = 0x0b17c0deu;
  uint32_t* dev = nullptr;
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaMalloc(&dev, kWords * sizeof(uint32_t))).ok());
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(testing::LaunchFillPattern(dev, kWords, kSeed, nullptr)).ok());
  std::vector<uint32_t> host(kWords, 0);
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(
                  cudaMemcpy(host.data(), dev, kWords * sizeof(uint32_t), cudaMemcpyDeviceToHost))
                  .ok());
  size_t mismatches = 0;
  for (size_t i = 0; i < kWords; ++i) mismatches += host[i] != testing::PatternWord(i, kSeed);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaFree(dev)).ok());
}

TEST_F(CudaDeviceTest, PinnedMemoryDuringGraphCaptureKeepsTheCaptureValid) {
  constexpr size_t kWords = 1 << 16;
  constexpr uint32_t kSeed = 42;
  uint32_t* dev = nullptr;
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaMalloc(&dev, kWords * sizeof(uint32_t))).ok());
  cudaStream_t stream = nullptr;
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)).ok());
  const size_t arena_bytes = 2u << 20;
  void* arena = std::aligned_alloc(4096, arena_bytes);
  ASSERT_NE(arena, nullptr);

  // An engine captures a graph in global mode, the strictest one.
  ASSERT_EQ(CurrentCaptureMode(), cudaStreamCaptureModeGlobal);
  ASSERT_TRUE(
      ORBITKV_CUDA_STATUS(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal)).ok());
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(testing::LaunchFillPattern(dev, kWords, kSeed, stream)).ok());

  // Meanwhile the Manager pins memory.
  auto pinned = PinnedAllocation::Allocate(1 << 20);
  EXPECT_TRUE(pinned.ok()) << pinned.status().ToString();
  Status reg = RegisterHostMemory(arena, arena_bytes);
  EXPECT_TRUE(reg.ok()) << reg.ToString();
  EXPECT_EQ(RegisterHostMemory(arena, arena_bytes).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(CurrentCaptureMode(), cudaStreamCaptureModeGlobal) << "capture mode not restored";

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaStreamIsCapturing(stream, &capture)).ok());
  EXPECT_EQ(capture, cudaStreamCaptureStatusActive) << "the capture was invalidated";

  cudaGraph_t graph = nullptr;
  Status ended = ORBITKV_CUDA_STATUS(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(ended.ok()) << ended.ToString();
  cudaGraphExec_t exec = nullptr;
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0)).ok());
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaGraphLaunch(exec, stream)).ok());
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaStreamSynchronize(stream)).ok());

  // The pinned buffer is usable for DMA: copy the graph's output into it.
  ASSERT_TRUE(pinned.ok());
  auto* host = static_cast<uint32_t*>(pinned->data());
  ASSERT_GE(pinned->size(), kWords * sizeof(uint32_t));
  const size_t words = kWords;
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaMemcpyAsync(host, dev, words * sizeof(uint32_t),
                                                  cudaMemcpyDeviceToHost, stream))
                  .ok());
  ASSERT_TRUE(ORBITKV_CUDA_STATUS(cudaStreamSynchronize(stream)).ok());
  size_t mismatches = 0;
  for (size_t i = 0; i < words; ++i) mismatches += host[i] != testing::PatternWord(i, kSeed);
  EXPECT_EQ(mismatches, 0u);

  EXPECT_TRUE(UnregisterHostMemory(arena).ok());
  EXPECT_EQ(UnregisterHostMemory(arena).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(pinned->Free().ok());
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaGraphExecDestroy(exec)).ok());
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaGraphDestroy(graph)).ok());
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaStreamDestroy(stream)).ok());
  EXPECT_TRUE(ORBITKV_CUDA_STATUS(cudaFree(dev)).ok());
  std::free(arena);
}

TEST_F(CudaDeviceTest, PinnedAllocationIsMoveOnlyAndFreesOnce) {
  auto a = PinnedAllocation::Allocate(4096);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  PinnedAllocation b = std::move(a).value();
  EXPECT_TRUE(b);
  PinnedAllocation c;
  c = std::move(b);
  EXPECT_FALSE(b);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(c.size(), 4096u);
  EXPECT_EQ(PinnedAllocation::Allocate(0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace orbitkv::gpu
