#include "manager/storage_codec.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "orbitkv/units.h"
#include "store/crc32c.h"

namespace orbitkv {
namespace {

using codec::CodecId;
using codec::DType;

constexpr std::string_view kDTypeNames[] = {"bf16", "fp16", "fp8_e4m3fn"};  // DType 1, 2, 3
constexpr uint64_t kMaxCodecSegmentBytes = uint64_t{1} << 31;               // frame offsets are u32

Result<DType> ParseDType(std::string_view name) {
  for (size_t i = 0; i < std::size(kDTypeNames); ++i) {
    if (kDTypeNames[i] == name) return static_cast<DType>(i + 1);
  }
  return Status::InvalidArgument("RegisterRequest.storage.dtype: unknown element dtype '" +
                                 std::string(name) + "' (bf16, fp16, fp8_e4m3fn)");
}

std::string_view DTypeName(DType t) { return kDTypeNames[static_cast<size_t>(t) - 1]; }

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ObjectCodec NamespaceCodec::object_codec() const {
  return {static_cast<uint8_t>(id), codec::CodecFormatVersion(id)};
}

std::string NamespaceCodec::Identity() const {
  if (raw()) return "";
  std::string out(codec::CodecName(id));
  out += "/";
  out += DTypeName(info.dtype);
  if (!codec::CodecIsLossless(id)) out += "/" + std::to_string(info.head_dim);
  return out;
}

Result<NamespaceCodec> SelectNamespaceCodec(const StorageCodecRequest& req, CodecId manager_default,
                                            const InstanceLayout& layout) {
  NamespaceCodec c;
  c.id = manager_default;
  if (!req.codec.empty()) {
    Result<CodecId> id = codec::ParseCodecName(req.codec);
    if (!id.ok()) return id.status().WithContext("RegisterRequest.storage.codec");
    c.id = *id;
  }
  if (c.raw()) return c;
  const std::string what = "storage codec " + std::string(codec::CodecName(c.id));
  const bool lossy = !codec::CodecIsLossless(c.id);
  if (lossy && (req.dtype.empty() || req.head_dim == 0)) {
    return Status::InvalidArgument(
        what +
        " is lossy: it needs the KV element dtype and head_dim "
        "(RegisterRequest.storage.dtype, .head_dim)" +
        (req.codec.empty() ? " (the Manager's --storage-codec; an engine may ask for none)" : ""));
  }
  c.info.dtype = DType::kBf16;  // ans without a dtype: 2-byte elements (any bytes round-trip)
  if (!req.dtype.empty()) {
    ORBITKV_ASSIGN_OR_RETURN(c.info.dtype, ParseDType(req.dtype));
  }
  c.info.head_dim = lossy ? req.head_dim : 0;
  const uint64_t elem = codec::DTypeBytes(c.info.dtype);
  const uint64_t unit = lossy ? elem * c.info.head_dim : elem;
  if (lossy) {
    // The codec's own rules for head_dim and dtype: encode one zero head vector.
    std::vector<uint8_t> vec(unit), frame(codec::MaxEncodedSize(c.id, c.info, unit));
    Result<size_t> probe = codec::Encode(c.id, c.info, vec, frame);
    if (!probe.ok()) {
      return Status::InvalidArgument(what + " does not take dtype " + req.dtype + ", head_dim " +
                                     std::to_string(req.head_dim) + ": " +
                                     std::string(probe.status().message()));
    }
  }
  std::set<uint64_t> seen;
  for (const GroupLayout& g : layout.groups) {
    for (size_t s = 0; s < g.slot_bytes.size(); ++s) {
      const uint64_t bytes = g.slot_bytes[s];
      if (!seen.insert(bytes).second) continue;
      const std::string slot = "group " + std::to_string(g.group_id) + " slot " +
                               std::to_string(s) + " (" + std::to_string(bytes) + " bytes)";
      if (bytes % unit != 0) {
        return Status::InvalidArgument(
            what + ": " + slot + " is not a whole number of " +
            (lossy ? "head vectors of " + std::to_string(c.info.head_dim) + " " : "") +
            std::string(DTypeName(c.info.dtype)) + (lossy ? " elements" : " elements"));
      }
      if (bytes > kMaxCodecSegmentBytes) {
        return Status::InvalidArgument(what + ": " + slot + " is larger than a codec segment (" +
                                       FormatByteSize(kMaxCodecSegmentBytes) + ")");
      }
    }
  }
  return c;
}

CodecMetrics::CodecMetrics(MetricsRegistry& m) {
  for (int i = 0; i < codec::kNumCodecs; ++i) {
    const std::string name(codec::CodecName(static_cast<CodecId>(i)));
    Series& s = series_[i];
    for (auto [op, dst] : {std::pair{"encode", &s.encode}, std::pair{"decode", &s.decode}}) {
      const Labels l = {{"codec", name}, {"op", op}};
      dst->bytes_in = m.GetCounter("orbitkv_codec_bytes_in_total",
                                   "Bytes given to a storage codec: raw bytes to encode, "
                                   "encoded frames to decode.",
                                   l);
      dst->bytes_out =
          m.GetCounter("orbitkv_codec_bytes_out_total",
                       "Bytes a storage codec made: frames encoded, raw bytes decoded.", l);
      dst->failures = m.GetCounter("orbitkv_codec_failures_total",
                                   "Segments a storage codec failed to encode or decode.", l);
      dst->seconds =
          m.GetHistogram("orbitkv_codec_seconds",
                         "CPU time of one encode (an object) or decode (a segment), by codec.",
                         LatencyBuckets(), l);
    }
    s.crc_failures =
        m.GetCounter("orbitkv_codec_crc_failures_total",
                     "Encoded segments whose payload CRC32C did not match.", {{"codec", name}});
    s.dram_copies = m.GetCounter(
        "orbitkv_codec_dram_copies_total",
        "DRAM entries replaced by their encoded object after writeback (--codec-dram-copy).",
        {{"codec", name}});
    s.dram_bytes_saved = m.GetCounter(
        "orbitkv_codec_dram_bytes_saved_total",
        "Pool bytes freed by replacing raw DRAM entries with encoded ones.", {{"codec", name}});
    s.dram_gpu_decodes =
        m.GetCounter("orbitkv_codec_dram_restores_total",
                     "Encoded DRAM entries restored into CUDA pages, by where they were decoded.",
                     {{"codec", name}, {"where", "gpu"}});
    s.dram_cpu_fallbacks =
        m.GetCounter("orbitkv_codec_dram_restores_total",
                     "Encoded DRAM entries restored into CUDA pages, by where they were decoded.",
                     {{"codec", name}, {"where", "cpu"}});
  }
  budget_used = m.GetGauge("orbitkv_codec_budget_used_bytes",
                           "Codec buffers held now (CPU encode output; GPU codec arena).");
}

uint64_t GpuCodecShare(uint64_t codec_budget, int cuda_devices) {
  return std::min(codec_budget / static_cast<uint64_t>(std::max(cuda_devices, 1)),
                  kMaxGpuCodecShare);
}

bool CodecBudget::TryReserve(uint64_t bytes) {
  uint64_t cur = reserved_.load();
  do {
    if (bytes > limit_ - std::min(cur, limit_)) return false;
  } while (!reserved_.compare_exchange_weak(cur, cur + bytes));
  if (used_gauge_) used_gauge_->Add(static_cast<int64_t>(bytes));
  return true;
}

void CodecBudget::Release(uint64_t bytes) {
  reserved_.fetch_sub(bytes);
  if (used_gauge_) used_gauge_->Sub(static_cast<int64_t>(bytes));
}

Result<CodecBuffer> CodecBuffer::Allocate(uint64_t bytes, Gauge* budget_used) {
  const uint64_t cap = AlignUp(std::max<uint64_t>(bytes, 1), 4096);
  void* p = std::aligned_alloc(4096, cap);
  if (p == nullptr) {
    return Status::ResourceExhausted("codec buffer of " + FormatByteSize(cap) + ": out of memory");
  }
  std::memset(p, 0, cap);
  CodecBuffer b;
  b.data_ = static_cast<uint8_t*>(p);
  b.capacity_ = cap;
  b.budget_used_ = budget_used;
  if (budget_used) budget_used->Add(static_cast<int64_t>(cap));
  return b;
}

CodecBuffer& CodecBuffer::operator=(CodecBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    budget_used_ = std::exchange(o.budget_used_, nullptr);
  }
  return *this;
}

void CodecBuffer::Reset() {
  if (data_ == nullptr) return;
  if (budget_used_) budget_used_->Sub(static_cast<int64_t>(capacity_));
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

Result<uint64_t> EncodeObject(const NamespaceCodec& c, std::span<const uint8_t> raw,
                              CodecBuffer* out, const CodecMetrics& m) {
  const auto start = std::chrono::steady_clock::now();
  const CodecMetrics::Op& op = m.of(c.id).encode;
  ORBITKV_ASSIGN_OR_RETURN(ParsedHeader h, ParseObjectHeader(raw, raw.size()));
  if (h.codec != kCodecRaw) {
    return Status::Corruption("encoding an object that is already encoded (codec " +
                              std::to_string(h.codec) + ")");
  }
  // Frames go where SegmentLayout of their sizes puts them: each right after
  // the previous one, at the next 512 boundary. Size the buffer for the worst.
  uint64_t bound = h.header_size;
  for (const SegmentPos& seg : h.segments) {
    bound = AlignUp(bound, kObjectAlign) + codec::MaxEncodedSize(c.id, c.info, seg.size);
  }
  if (out->capacity() < AlignUp(bound, 4096)) {
    ORBITKV_ASSIGN_OR_RETURN(*out, CodecBuffer::Allocate(bound, m.budget_used));
  } else {
    std::memset(out->data(), 0, AlignUp(bound, 4096));  // zeros between segments
  }
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> crcs;
  uint64_t end = h.header_size, raw_bytes = 0, coded_bytes = 0;
  for (size_t i = 0; i < h.segments.size(); ++i) {
    const SegmentPos& seg = h.segments[i];
    const uint64_t at = AlignUp(end, kObjectAlign);
    const size_t max = codec::MaxEncodedSize(c.id, c.info, seg.size);
    Result<size_t> n =
        codec::Encode(c.id, c.info, raw.subspan(seg.offset, seg.size), {out->data() + at, max});
    if (!n.ok()) {
      op.failures->Inc();
      return n.status().WithContext("encoding slot " + std::to_string(i));
    }
    sizes.push_back(*n);
    crcs.push_back(Crc32c({out->data() + at, *n}));
    end = at + *n;
    raw_bytes += seg.size;
    coded_bytes += *n;
  }
  WriteObjectHeader(h.id, sizes, c.object_codec(), crcs, {out->data(), h.header_size});
  op.bytes_in->Inc(raw_bytes);
  op.bytes_out->Inc(coded_bytes);  // frames, as decode's bytes_in counts them
  op.seconds->Observe(Since(start));
  return end;
}

Status CheckObjectCodec(const NamespaceCodec& c, const ParsedHeader& h) {
  const ObjectCodec want = c.object_codec();
  if (h.codec == want.id && h.codec_version == want.version) return Status::OK();
  return Status::Corruption("object of codec " + std::to_string(h.codec) + " version " +
                            std::to_string(h.codec_version) + " in a namespace of " +
                            std::string(codec::CodecName(c.id)) + " version " +
                            std::to_string(want.version));
}

Status CheckEncodedObject(const NamespaceCodec& c, const ParsedHeader& h,
                          std::span<const uint8_t> object, const CodecMetrics& m) {
  ORBITKV_RETURN_IF_ERROR(CheckObjectCodec(c, h));
  Status st = VerifyObjectPayload(h, object);
  if (!st.ok()) m.of(c.id).crc_failures->Inc();
  return st;
}

Status DecodeSegment(const NamespaceCodec& c, const ParsedHeader& h,
                     std::span<const uint8_t> object, uint32_t slot, std::span<uint8_t> dst,
                     const CodecMetrics& m) {
  const auto start = std::chrono::steady_clock::now();
  const CodecMetrics::Op& op = m.of(c.id).decode;
  const SegmentPos& seg = h.segments[slot];
  Status st = codec::Decode(object.subspan(seg.offset, seg.size), dst, c.id);
  if (!st.ok()) {
    op.failures->Inc();
    // A frame of another decoded size is as damaged as a malformed one.
    return Status::Corruption("slot " + std::to_string(slot) +
                              " of an encoded object: " + std::string(st.message()));
  }
  op.bytes_in->Inc(seg.size);
  op.bytes_out->Inc(dst.size());
  op.seconds->Observe(Since(start));
  return Status::OK();
}

}  // namespace orbitkv
