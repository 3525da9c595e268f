#include "codec/cuda_frame_decoder.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "codec/codec_cuda.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_platform.h"

namespace orbitkv::codec {
namespace {

class CudaFrameDecoder final : public gpu::FrameDecoder {
 public:
  CudaFrameDecoder(int ordinal, std::unique_ptr<CudaDecoder> d)
      : ordinal_(ordinal), d_(std::move(d)) {}

  uint64_t scratch_bytes() const override { return d_->device_scratch_bytes(); }

  Status DecodeAsync(CodecId codec, uint32_t head_dim, std::span<const gpu::DecodeOp> ops,
                     gpu::Stream& stream) override {
    cudaStream_t s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Native(stream));
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    frames_.clear();
    for (const gpu::DecodeOp& op : ops) {
      DeviceFrame& f = frames_.emplace_back();
      f.frame = reinterpret_cast<const uint8_t*>(op.frame);
      f.frame_size = op.frame_size;
      f.out = reinterpret_cast<uint8_t*>(op.out);
      f.out_size = op.out_size;
      f.segment_crc = op.segment_crc;
      f.dtype = op.dtype;
      f.param = op.param;
      f.check_only = op.check_only;
      f.group = op.group;
    }
    return d_->DecodeAsync(codec, frames_, head_dim, s);
  }

  Result<std::vector<gpu::DecodeResult>> Finish(gpu::Stream& stream) override {
    cudaStream_t s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Native(stream));
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    return d_->Finish(s);
  }

 private:
  static Result<cudaStream_t> Native(gpu::Stream& stream) {
    void* s = gpu::CudaStreamHandle(stream);
    if (s == nullptr) return Status::InvalidArgument("FrameDecoder: not a CUDA platform stream");
    return static_cast<cudaStream_t>(s);
  }

  const int ordinal_;
  std::unique_ptr<CudaDecoder> d_;
  std::vector<DeviceFrame> frames_;
};

}  // namespace

Result<std::unique_ptr<gpu::FrameDecoder>> CreateCudaFrameDecoder(int ordinal,
                                                                  uint32_t max_frames) {
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  std::unique_ptr<CudaDecoder> d;
  ORBITKV_ASSIGN_OR_RETURN(d, CudaDecoder::Create(max_frames));
  return std::unique_ptr<gpu::FrameDecoder>(
      std::make_unique<CudaFrameDecoder>(ordinal, std::move(d)));
}

}  // namespace orbitkv::codec
