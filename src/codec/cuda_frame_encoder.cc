#include "codec/cuda_frame_encoder.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "codec/codec_cuda.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_platform.h"

namespace orbitkv::codec {
namespace {

// An estimate for budgets of what CudaEncoder holds on the device for a batch
// of max_segments: per segment its tables, header slot and results (a few
// hundred bytes) and the ans tables it grows to (about 5 KiB per segment),
// plus the ans word counts (4 bytes per chunk and plane) of a few MiB of KV.
constexpr uint64_t kScratchPerSegment = 6u << 10;
constexpr uint64_t kScratchFixed = 1u << 20;

class CudaFrameEncoder final : public gpu::FrameEncoder {
 public:
  CudaFrameEncoder(int ordinal, uint32_t max_segments, std::unique_ptr<CudaEncoder> e)
      : ordinal_(ordinal), max_segments_(max_segments), e_(std::move(e)) {}

  uint64_t scratch_bytes() const override {
    return kScratchFixed + kScratchPerSegment * max_segments_;
  }

  Status EncodeAsync(CodecId codec, const SegmentInfo& info, std::span<const gpu::EncodeOp> ops,
                     gpu::Stream& stream) override {
    cudaStream_t s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Native(stream));
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    segments_.clear();
    for (const gpu::EncodeOp& op : ops) {
      segments_.push_back({reinterpret_cast<const uint8_t*>(op.raw), op.raw_size,
                           reinterpret_cast<uint8_t*>(op.frame), op.frame_capacity});
    }
    return e_->EncodeAsync(codec, info, segments_, s);
  }

  Result<std::vector<uint64_t>> Finish(gpu::Stream& stream) override {
    cudaStream_t s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Native(stream));
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return e_->Finish(s);
  }

 private:
  static Result<cudaStream_t> Native(gpu::Stream& stream) {
    void* s = gpu::CudaStreamHandle(stream);
    if (s == nullptr) return Status::InvalidArgument("FrameEncoder: not a CUDA platform stream");
    return static_cast<cudaStream_t>(s);
  }

  const int ordinal_;
  const uint32_t max_segments_;
  std::unique_ptr<CudaEncoder> e_;
  std::vector<DeviceSegment> segments_;
};

}  // namespace

Result<std::unique_ptr<gpu::FrameEncoder>> CreateCudaFrameEncoder(int ordinal,
                                                                  uint32_t max_segments) {
  if (max_segments == 0) return Status::InvalidArgument("CreateCudaFrameEncoder: 0 segments");
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  std::unique_ptr<CudaEncoder> e;
  ORBITKV_ASSIGN_OR_RETURN(e, CudaEncoder::Create(max_segments));
  return std::unique_ptr<gpu::FrameEncoder>(
      std::make_unique<CudaFrameEncoder>(ordinal, max_segments, std::move(e)));
}

}  // namespace orbitkv::codec
