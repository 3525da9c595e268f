#include "codec/codec_cuda.h"

#include <string>

#include "codec/codec_kernels.h"
#include "gpu/cuda_check.h"

namespace orbitkv::codec {

struct CudaDecoder::Buffers {
  uint32_t max_frames = 0;
  internal::KernelFrame* host_frames = nullptr;  // pinned
  int32_t* host_status = nullptr;                // pinned
  internal::KernelFrame* dev_frames = nullptr;
  int32_t* dev_status = nullptr;
  uint32_t* dev_crc = nullptr;
  Crc32cTables* dev_tables = nullptr;
  uint32_t pending = 0;  // frames of the last DecodeAsync

  ~Buffers() {
    // Teardown: nothing useful to do with a failure here.
    cudaFreeHost(host_frames);
    cudaFreeHost(host_status);
    cudaFree(dev_frames);
    cudaFree(dev_status);
    cudaFree(dev_crc);
    cudaFree(dev_tables);
  }
};

CudaDecoder::CudaDecoder(std::unique_ptr<Buffers> b) : b_(std::move(b)) {}
CudaDecoder::~CudaDecoder() = default;

Result<std::unique_ptr<CudaDecoder>> CudaDecoder::Create(uint32_t max_frames) {
  if (max_frames == 0 || max_frames > 65535) {
    return Status::InvalidArgument("CudaDecoder: max_frames must be in [1, 65535]");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the no-device error
    return Status::Unavailable("CudaDecoder: no usable CUDA device");
  }
  auto b = std::make_unique<Buffers>();
  b->max_frames = max_frames;
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&b->host_frames),
                                              sizeof(internal::KernelFrame) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&b->host_status), sizeof(int32_t) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&b->dev_frames),
                                          sizeof(internal::KernelFrame) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_status), sizeof(int32_t) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_crc), sizeof(uint32_t) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_tables), sizeof(Crc32cTables)));
  const Crc32cTables tables = MakeCrc32cTables();
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(b->dev_tables, &tables, sizeof tables, cudaMemcpyHostToDevice));
  return std::unique_ptr<CudaDecoder>(new CudaDecoder(std::move(b)));
}

Status CudaDecoder::DecodeAsync(CodecId codec, std::span<const DeviceFrame> frames,
                                uint32_t head_dim, cudaStream_t stream) {
  if (codec == CodecId::kNone || static_cast<int>(codec) >= kNumCodecs) {
    return Status::InvalidArgument("CudaDecoder: no decoder for codec " +
                                   std::string(CodecName(codec)));
  }
  if (frames.size() > b_->max_frames) {
    return Status::InvalidArgument("CudaDecoder: " + std::to_string(frames.size()) +
                                   " frames, created for " + std::to_string(b_->max_frames));
  }
  const bool tq = codec == CodecId::kTurboQuant4 || codec == CodecId::kTurboQuant3;
  if (tq && (head_dim < 32 || head_dim > 1024 || (head_dim & (head_dim - 1)) != 0)) {
    return Status::InvalidArgument(
        "CudaDecoder: TurboQuant head_dim must be a power of two in [32, 1024]");
  }
  uint64_t max_frame = 0, max_out = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const DeviceFrame& f = frames[i];
    if (reinterpret_cast<uintptr_t>(f.frame) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(f.out) % 16 != 0) {
      return Status::InvalidArgument("CudaDecoder: frame " + std::to_string(i) +
                                     ": input and output must be 16-byte aligned");
    }
    b_->host_frames[i] = {f.frame, f.frame_size, f.out, f.out_size};
    max_frame = std::max(max_frame, f.frame_size);
    max_out = std::max(max_out, f.out_size);
  }
  b_->pending = static_cast<uint32_t>(frames.size());
  if (frames.empty()) return Status::OK();
  const size_t n = frames.size();
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->dev_frames, b_->host_frames,
                                               sizeof(internal::KernelFrame) * n,
                                               cudaMemcpyHostToDevice, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(internal::LaunchCheckAndDecode(
      static_cast<uint8_t>(codec), CodecFormatVersion(codec), b_->dev_frames,
      static_cast<uint32_t>(n), max_frame, max_out, head_dim, b_->dev_tables, b_->dev_crc,
      b_->dev_status, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->host_status, b_->dev_status, sizeof(int32_t) * n,
                                               cudaMemcpyDeviceToHost, stream));
  return Status::OK();
}

Result<std::vector<Status>> CudaDecoder::Finish(cudaStream_t stream) {
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<Status> out;
  out.reserve(b_->pending);
  for (uint32_t i = 0; i < b_->pending; ++i) {
    const auto what = [&]() -> const char* {
      switch (b_->host_status[i]) {
        case internal::kKernelOk:
          return nullptr;
        case internal::kKernelBadStream:
          return "a chunk stream does not decode";
        case internal::kKernelBadHeader:
          return "codec header out of range";
        case internal::kKernelCrc:
          return "CRC32C mismatch";
        default:
          return "prefix does not match the expected codec and sizes";
      }
    }();
    out.push_back(what == nullptr ? Status::OK()
                                  : Status::Corruption("GPU decode of frame " + std::to_string(i) +
                                                       ": " + what));
  }
  b_->pending = 0;
  return out;
}

}  // namespace orbitkv::codec
