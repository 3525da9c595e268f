#include "codec/codec_cuda.h"

#include <string>
#include <utility>

#include "codec/codec_internal.h"
#include "codec/codec_kernels.h"
#include "codec/frame_layout.h"
#include "gpu/cuda_check.h"

namespace orbitkv::codec {

struct CudaDecoder::Buffers {
  uint32_t max_frames = 0;
  internal::KernelFrame* host_frames = nullptr;  // pinned
  int32_t* host_status = nullptr;                // pinned
  internal::KernelFrame* dev_frames = nullptr;
  int32_t* dev_status = nullptr;
  int32_t* dev_verdicts = nullptr;
  uint32_t* dev_crc = nullptr;
  Crc32cTables* dev_tables = nullptr;
  uint32_t pending = 0;          // frames of the last DecodeAsync
  std::vector<uint32_t> groups;  // and each one's verdict index

  ~Buffers() {
    // Teardown: nothing useful to do with a failure here.
    cudaFreeHost(host_frames);
    cudaFreeHost(host_status);
    cudaFree(dev_frames);
    cudaFree(dev_status);
    cudaFree(dev_verdicts);
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
      cudaMalloc(reinterpret_cast<void**>(&b->dev_verdicts), sizeof(int32_t) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_crc), sizeof(uint32_t) * max_frames));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_tables), sizeof(Crc32cTables)));
  const Crc32cTables tables = MakeCrc32cTables();
  ORBITKV_CUDA_RETURN_IF_ERROR(gpu::CopyToDeviceAndWait(b->dev_tables, &tables, sizeof tables));
  return std::unique_ptr<CudaDecoder>(new CudaDecoder(std::move(b)));
}

uint64_t CudaDecoder::device_scratch_bytes() const {
  return (sizeof(internal::KernelFrame) + 2 * sizeof(int32_t) + sizeof(uint32_t)) *
             uint64_t{b_->max_frames} +
         sizeof(Crc32cTables);
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
  b_->groups.resize(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const DeviceFrame& f = frames[i];
    const auto which = [i] { return "CudaDecoder: frame " + std::to_string(i); };
    if (reinterpret_cast<uintptr_t>(f.frame) % 16 != 0 ||
        (!f.check_only && reinterpret_cast<uintptr_t>(f.out) % 16 != 0)) {
      return Status::InvalidArgument(which() + ": input and output must be 16-byte aligned");
    }
    if (f.group != gpu::DecodeOp::kOwnGroup && f.group >= frames.size()) {
      return Status::InvalidArgument(which() + ": group " + std::to_string(f.group) +
                                     " out of range");
    }
    if (f.check_only && !f.segment_crc) {
      return Status::InvalidArgument(which() + ": a check-only frame needs its segment CRC");
    }
    internal::KernelFrame& k = b_->host_frames[i];
    k = {f.frame, f.frame_size, f.check_only ? nullptr : f.out, f.check_only ? 0 : f.out_size};
    k.verdict = f.group == gpu::DecodeOp::kOwnGroup ? static_cast<uint32_t>(i) : f.group;
    k.dtype = f.dtype;
    k.flags = (f.segment_crc ? internal::kFrameCheckSegmentCrc : 0) |
              (f.param ? internal::kFrameCheckParam : 0) |
              (f.check_only ? internal::kFrameCheckOnly : 0);
    k.segment_crc = f.segment_crc.value_or(0);
    k.param = f.param.value_or(0);
    b_->groups[i] = k.verdict;
    max_frame = std::max(max_frame, f.frame_size);
    if (!f.check_only) max_out = std::max(max_out, f.out_size);
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
      b_->dev_status, b_->dev_verdicts, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->host_status, b_->dev_status, sizeof(int32_t) * n,
                                               cudaMemcpyDeviceToHost, stream));
  return Status::OK();
}

Result<std::vector<gpu::DecodeResult>> CudaDecoder::Finish(cudaStream_t stream) {
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const uint32_t n = std::exchange(b_->pending, 0);
  // A group failed its checks when any of its frames did (kernel codes from
  // kKernelFirstCheckError): the kernels decoded none of its frames.
  std::vector<int32_t> group_check(n, internal::kKernelOk);
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t c = b_->host_status[i];
    if (c >= internal::kKernelFirstCheckError) group_check[b_->groups[i]] = c;
  }
  std::vector<gpu::DecodeResult> out(n);
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t code = b_->host_status[i];
    gpu::DecodeResult& r = out[i];
    const char* what = nullptr;
    switch (code) {
      case internal::kKernelOk:
        if (group_check[b_->groups[i]] != internal::kKernelOk) {
          r.check = gpu::DecodeCheck::kSibling;
          what = "not decoded: another segment of its object failed its check";
        }
        break;
      case internal::kKernelBadStream:
        what = "a chunk stream does not decode";
        break;
      case internal::kKernelBadHeader:
        what = "codec header out of range";
        break;
      case internal::kKernelCrc:
        r.check = gpu::DecodeCheck::kFrame;
        what = "CRC32C mismatch";
        break;
      case internal::kKernelSegmentCrc:
        r.check = gpu::DecodeCheck::kSegmentCrc;
        what = "payload CRC32C differs from the object header's";
        break;
      default:
        r.check = gpu::DecodeCheck::kFrame;
        what = "prefix does not match the expected codec, dtype and sizes";
        break;
    }
    if (what != nullptr) {
      r.status = Status::Corruption("GPU decode of frame " + std::to_string(i) + ": " + what);
    }
  }
  return out;
}

namespace {

constexpr size_t kHeaderSlot = 128;  // >= the TurboQuant header (48 + 64 bytes)

// What every GPU encoder needs of a segment (Encode's size checks, alignment,
// the frame buffer's capacity). REQUIRES: a known info.dtype.
Status CheckSegment(size_t i, const DeviceSegment& s, CodecId codec, const SegmentInfo& info) {
  const std::string which = "CudaEncoder: segment " + std::to_string(i);
  if (reinterpret_cast<uintptr_t>(s.raw) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(s.frame) % 16 != 0) {
    return Status::InvalidArgument(which + ": raw and frame must be 16-byte aligned");
  }
  if (s.raw_size % DTypeBytes(info.dtype) != 0 || s.raw_size > (uint64_t{1} << 31)) {
    return Status::InvalidArgument(which + ": not a whole number of elements up to 2 GiB");
  }
  const size_t bound = MaxEncodedSize(codec, info, s.raw_size);
  if (s.frame_capacity < bound) {
    return Status::InvalidArgument(which + ": frame buffer below MaxEncodedSize " +
                                   std::to_string(bound));
  }
  return Status::OK();
}

}  // namespace

struct CudaEncoder::Buffers {
  uint32_t max_segments = 0;
  uint8_t* host_headers = nullptr;                   // pinned, kHeaderSlot per segment
  internal::KernelSegment* host_segments = nullptr;  // pinned
  internal::KernelFrame* host_frames = nullptr;      // pinned
  float* host_codebook = nullptr;                    // pinned, 16
  internal::KernelSegment* dev_segments = nullptr;
  internal::KernelFrame* dev_frames = nullptr;
  float* dev_codebook = nullptr;
  uint32_t* dev_crc = nullptr;
  Crc32cTables* dev_tables = nullptr;
  uint64_t* host_sizes = nullptr;  // pinned: the frame sizes
  uint64_t* dev_sizes = nullptr;
  internal::AnsEncodeJob* host_jobs = nullptr;  // pinned
  internal::AnsEncodeJob* dev_jobs = nullptr;
  uint8_t* dev_scratch = nullptr;  // ans: histograms, tables, word counts
  size_t scratch_bytes = 0;
  uint32_t pending = 0;  // segments of the last EncodeAsync

  ~Buffers() {
    // Teardown: nothing useful to do with a failure here.
    cudaFreeHost(host_headers);
    cudaFreeHost(host_segments);
    cudaFreeHost(host_frames);
    cudaFreeHost(host_codebook);
    cudaFreeHost(host_sizes);
    cudaFreeHost(host_jobs);
    cudaFree(dev_segments);
    cudaFree(dev_frames);
    cudaFree(dev_codebook);
    cudaFree(dev_crc);
    cudaFree(dev_tables);
    cudaFree(dev_sizes);
    cudaFree(dev_jobs);
    cudaFree(dev_scratch);
  }
};

CudaEncoder::CudaEncoder(std::unique_ptr<Buffers> b) : b_(std::move(b)) {}
CudaEncoder::~CudaEncoder() = default;

Result<std::unique_ptr<CudaEncoder>> CudaEncoder::Create(uint32_t max_segments) {
  if (max_segments == 0 || max_segments > 65535) {
    return Status::InvalidArgument("CudaEncoder: max_segments must be in [1, 65535]");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the no-device error
    return Status::Unavailable("CudaEncoder: no usable CUDA device");
  }
  auto b = std::make_unique<Buffers>();
  b->max_segments = max_segments;
  const size_t n = max_segments;
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&b->host_headers), kHeaderSlot * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&b->host_segments),
                                              sizeof(internal::KernelSegment) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&b->host_frames), sizeof(internal::KernelFrame) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&b->host_codebook), sizeof(float) * 16));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_segments), sizeof(internal::KernelSegment) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_frames), sizeof(internal::KernelFrame) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_codebook), sizeof(float) * 16));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_crc), sizeof(uint32_t) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_tables), sizeof(Crc32cTables)));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&b->host_sizes), sizeof(uint64_t) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_sizes), sizeof(uint64_t) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&b->host_jobs), sizeof(internal::AnsEncodeJob) * n));
  ORBITKV_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&b->dev_jobs), sizeof(internal::AnsEncodeJob) * n));
  const Crc32cTables tables = MakeCrc32cTables();
  ORBITKV_CUDA_RETURN_IF_ERROR(gpu::CopyToDeviceAndWait(b->dev_tables, &tables, sizeof tables));
  return std::unique_ptr<CudaEncoder>(new CudaEncoder(std::move(b)));
}

Status CudaEncoder::EncodeAsync(CodecId codec, const SegmentInfo& info,
                                std::span<const DeviceSegment> segments, cudaStream_t stream,
                                const EncodeOptions& options) {
  if (codec == CodecId::kAns) return EncodeAnsAsync(info, segments, stream, options);
  const bool tq = codec == CodecId::kTurboQuant4 || codec == CodecId::kTurboQuant3;
  if (codec != CodecId::kFp8 && !tq) {
    return Status::Unavailable("CudaEncoder: no GPU encoder for codec " +
                               std::string(CodecName(codec)) + " (it has no frame)");
  }
  if (info.dtype != DType::kBf16 && info.dtype != DType::kFp16) {
    return Status::InvalidArgument("CudaEncoder: segments must be bf16 or fp16");
  }
  if (info.head_dim == 0) return Status::InvalidArgument("CudaEncoder: head_dim is 0");
  if (segments.size() > b_->max_segments) {
    return Status::InvalidArgument("CudaEncoder: " + std::to_string(segments.size()) +
                                   " segments, created for " + std::to_string(b_->max_segments));
  }
  const uint32_t bits = codec == CodecId::kTurboQuant4 ? 4 : 3;
  uint64_t max_raw = 0, max_frame = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const DeviceSegment& s = segments[i];
    ORBITKV_RETURN_IF_ERROR(CheckSegment(i, s, codec, info));
    if (tq) ORBITKV_RETURN_IF_ERROR(internal::TurboQuantCheckShape(info, s.raw_size));
    const size_t size = MaxEncodedSize(codec, info, s.raw_size);
    uint8_t* h = b_->host_headers + kHeaderSlot * i;
    const size_t header =
        tq ? internal::WriteTurboQuantHeader(bits, info, s.raw_size, options.turboquant_seed, h)
           : kFramePrefixBytes;
    if (!tq) internal::WritePrefix(h, codec, info.dtype, 0, s.raw_size, size, info.head_dim);
    ORBITKV_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(s.frame, h, header, cudaMemcpyHostToDevice, stream));
    b_->host_segments[i] = {s.raw, s.raw_size, s.frame, size};
    b_->host_frames[i] = {s.frame, size, nullptr, 0};
    b_->host_sizes[i] = size;
    max_raw = std::max<uint64_t>(max_raw, s.raw_size);
    max_frame = std::max<uint64_t>(max_frame, size);
  }
  b_->pending = static_cast<uint32_t>(segments.size());
  if (segments.empty()) return Status::OK();
  const size_t n = segments.size();
  if (tq) {
    const std::vector<float>& c = internal::TurboQuantCodebook(info.head_dim, bits);
    std::copy(c.begin(), c.end(), b_->host_codebook);
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->dev_codebook, b_->host_codebook,
                                                 sizeof(float) * c.size(), cudaMemcpyHostToDevice,
                                                 stream));
  }
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->dev_segments, b_->host_segments,
                                               sizeof(internal::KernelSegment) * n,
                                               cudaMemcpyHostToDevice, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->dev_frames, b_->host_frames,
                                               sizeof(internal::KernelFrame) * n,
                                               cudaMemcpyHostToDevice, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(internal::LaunchEncode(
      static_cast<uint8_t>(codec), info.dtype == DType::kBf16, info.head_dim,
      options.turboquant_seed, b_->dev_codebook, b_->dev_segments, b_->dev_frames,
      static_cast<uint32_t>(n), max_raw, max_frame, b_->dev_tables, b_->dev_crc, stream));
  return Status::OK();
}

Status CudaEncoder::EncodeAnsAsync(const SegmentInfo& info, std::span<const DeviceSegment> segments,
                                   cudaStream_t stream, const EncodeOptions& options) {
  const auto dtype = static_cast<uint8_t>(info.dtype);
  if (dtype < 1 || dtype > 3) return Status::InvalidArgument("CudaEncoder: unknown element dtype");
  if (segments.size() > b_->max_segments) {
    return Status::InvalidArgument("CudaEncoder: " + std::to_string(segments.size()) +
                                   " segments, created for " + std::to_string(b_->max_segments));
  }
  const auto planes = static_cast<uint32_t>(DTypeBytes(info.dtype));
  const auto align16 = [](size_t v) { return (v + 15) / 16 * 16; };
  std::vector<size_t> at(segments.size());
  size_t scratch = 0;
  uint64_t max_raw = 0, max_items = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const DeviceSegment& s = segments[i];
    ORBITKV_RETURN_IF_ERROR(CheckSegment(i, s, CodecId::kAns, info));
    const uint64_t elems = s.raw_size / planes;
    const uint32_t chunk = internal::AnsChunkElements(elems, options.ans_chunk_elements);
    if (chunk % kAnsLanes != 0 || chunk > kAnsMaxChunkElements) {
      return Status::InvalidArgument(
          "ans: chunk elements must be a multiple of 32 up to 2^20, not " + std::to_string(chunk));
    }
    const uint32_t chunks = internal::AnsChunkCount(elems, chunk);
    internal::AnsEncodeJob& job = b_->host_jobs[i];
    job = {};
    job.raw = s.raw;
    job.raw_size = s.raw_size;
    job.frame = s.frame;
    job.planes = planes;
    job.chunk = chunk;
    job.chunks = chunks;
    job.dtype = dtype;
    at[i] = scratch;
    scratch += sizeof(uint32_t) * kAnsMaxPlanes * 256 +
               sizeof(internal::AnsEncTable) * kAnsMaxPlanes +
               align16(sizeof(uint32_t) * planes * uint64_t{chunks});
    b_->host_frames[i] = {s.frame, 0, nullptr, 0};
    max_raw = std::max<uint64_t>(max_raw, s.raw_size);
    max_items = std::max<uint64_t>(max_items, uint64_t{planes} * chunks);
  }
  b_->pending = static_cast<uint32_t>(segments.size());
  if (segments.empty()) return Status::OK();
  if (scratch > b_->scratch_bytes) {
    // The previous call has finished (one EncodeAsync then Finish at a time).
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaFree(b_->dev_scratch));
    b_->dev_scratch = nullptr;
    b_->scratch_bytes = 0;
    ORBITKV_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&b_->dev_scratch), scratch));
    b_->scratch_bytes = scratch;
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    internal::AnsEncodeJob& job = b_->host_jobs[i];
    uint8_t* base = b_->dev_scratch + at[i];
    job.counts = reinterpret_cast<uint32_t*>(base);
    base += sizeof(uint32_t) * kAnsMaxPlanes * 256;
    job.tables = reinterpret_cast<internal::AnsEncTable*>(base);
    base += sizeof(internal::AnsEncTable) * kAnsMaxPlanes;
    job.words = reinterpret_cast<uint32_t*>(base);
  }
  const size_t n = segments.size();
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b_->dev_scratch, 0, scratch, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->dev_jobs, b_->host_jobs,
                                               sizeof(internal::AnsEncodeJob) * n,
                                               cudaMemcpyHostToDevice, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->dev_frames, b_->host_frames,
                                               sizeof(internal::KernelFrame) * n,
                                               cudaMemcpyHostToDevice, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(internal::LaunchAnsEncode(
      CodecFormatVersion(CodecId::kAns), b_->dev_jobs, b_->dev_frames, b_->dev_sizes,
      static_cast<uint32_t>(n), max_raw, max_items, b_->dev_tables, b_->dev_crc, stream));
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b_->host_sizes, b_->dev_sizes, sizeof(uint64_t) * n,
                                               cudaMemcpyDeviceToHost, stream));
  return Status::OK();
}

Result<std::vector<uint64_t>> CudaEncoder::Finish(cudaStream_t stream) {
  ORBITKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<uint64_t> sizes(b_->host_sizes, b_->host_sizes + b_->pending);
  b_->pending = 0;
  return sizes;
}

}  // namespace orbitkv::codec
