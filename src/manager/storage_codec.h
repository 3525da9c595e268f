// Storage codecs in the Manager (README "Storage codecs"; spec "Optional GPU
// storage encoding"): the codec of a namespace's objects (chosen at register
// from the engine's StorageCodecRequest or --storage-codec, and part of the
// namespace's identity), encoding a sealed raw object for SSD writeback, and
// checking and decoding an encoded object's segments on the CPU, each counted
// on orbitkv_codec_* by codec. An encoded object is checked before a byte of
// it is decoded: its codec and version, every segment's payload CRC32C (the
// object header's), each frame's prefix and CRC (codec::Decode); any failure
// is Corruption, found before a byte is decoded into an engine page (a frame
// that passes every CRC and still fails to decode, an encoder bug, fails its
// block too; that page's bytes are then unspecified, as of any failed block).
// Functions are pure apart from the counters; everything is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "codec/codec.h"
#include "orbitkv/cache_api.h"
#include "orbitkv/layout.h"
#include "orbitkv/metrics.h"
#include "orbitkv/status.h"
#include "store/object_format.h"

namespace orbitkv {

// The codec of one namespace's objects; constant while the namespace lives.
struct NamespaceCodec {
  codec::CodecId id = codec::CodecId::kNone;
  codec::SegmentInfo info;  // dtype, head_dim (ans uses the dtype only)

  bool raw() const { return id == codec::CodecId::kNone; }
  // The header's codec id and version for objects this codec writes.
  ObjectCodec object_codec() const;
  // What makes namespaces of different codecs (or parameters) distinct: empty
  // for none, else e.g. "fp8/bf16/128".
  std::string Identity() const;
};

// The codec for a register: `request.codec`, or `manager_default` when it is
// empty. InvalidArgument (naming the field) for an unknown codec or dtype, a
// lossy codec without a dtype and head_dim, a head_dim the codec does not take,
// or a slot size that is not a whole number of elements (ans) or of head
// vectors (fp8, turboquant-*).
Result<NamespaceCodec> SelectNamespaceCodec(const StorageCodecRequest& request,
                                            codec::CodecId manager_default,
                                            const InstanceLayout& layout);

// The orbitkv_codec_* series, one set per codec (registered at once, zero
// while idle). `op` is "encode" or "decode": bytes_in are the bytes a codec
// was given (raw bytes to encode, frames to decode), bytes_out what it made.
class CodecMetrics {
 public:
  explicit CodecMetrics(MetricsRegistry& registry);
  struct Op {
    Counter *bytes_in, *bytes_out, *failures;
    Histogram* seconds;
  };
  struct Series {
    Op encode, decode;
    Counter* crc_failures;  // segments whose payload CRC did not match
    // DRAM entries replaced by their encoded object after writeback
    // (--codec-dram-copy encoded), and the pool bytes that saved.
    Counter* dram_copies;
    Counter* dram_bytes_saved;
    // Encoded DRAM entries restored into CUDA pages: decoded on the GPU
    // (dram_gpu_decode.h), or on the CPU because no GPU decode lane could
    // take them (no codec budget share, no decoder, an object larger than the
    // lane's arena, pages the decoder cannot write whole).
    Counter* dram_gpu_decodes;
    Counter* dram_cpu_fallbacks;
  };
  const Series& of(codec::CodecId id) const { return series_[static_cast<size_t>(id)]; }
  Gauge* budget_used;  // codec buffers held now (CPU encode output, GPU codec arena)

 private:
  Series series_[codec::kNumCodecs];
};

// The --codec-budget reservations of the GPU codec path: each cuFile worker
// that decodes holds its codec arena (retained encoded input) and decoder
// scratch here for its life, shown on budget_used with the CPU encode
// buffers. Thread-safe.
class CodecBudget {
 public:
  CodecBudget(uint64_t limit, Gauge* budget_used) : limit_(limit), used_gauge_(budget_used) {}
  uint64_t limit() const { return limit_; }
  // False (nothing reserved) when `bytes` more would pass the limit.
  bool TryReserve(uint64_t bytes);
  void Release(uint64_t bytes);
  uint64_t reserved() const { return reserved_.load(); }

 private:
  const uint64_t limit_;
  Gauge* const used_gauge_;
  std::atomic<uint64_t> reserved_{0};
};

// The share of --codec-budget one cuFile worker's GPU decode lane holds
// (arena + decoder scratch): the budget split over the CUDA devices, at most
// kMaxGpuCodecShare. An encoded object whose extent does not fit its arena
// takes the host reader.
inline constexpr uint64_t kMaxGpuCodecShare = uint64_t{64} << 20;
uint64_t GpuCodecShare(uint64_t codec_budget, int cuda_devices);

// A 4 KiB aligned, zero-initialised buffer (the SSD store writes from such),
// counted on the codec budget gauge while it lives.
class CodecBuffer {
 public:
  CodecBuffer() = default;
  // ResourceExhausted when the memory is not there.
  static Result<CodecBuffer> Allocate(uint64_t bytes, Gauge* budget_used);
  CodecBuffer(CodecBuffer&& o) noexcept { *this = std::move(o); }
  CodecBuffer& operator=(CodecBuffer&& o) noexcept;
  ~CodecBuffer() { Reset(); }
  uint8_t* data() const { return data_; }
  uint64_t capacity() const { return capacity_; }
  void Reset();

 private:
  uint8_t* data_ = nullptr;
  uint64_t capacity_ = 0;
  Gauge* budget_used_ = nullptr;
};

// Encodes the sealed raw object `raw` (a raw header, then its segments) into
// `out` as an object of codec `c` (every segment a frame, laid out by
// SegmentLayout of the frame sizes, each with its frame's CRC32C) and returns
// its size; `out` is 4 KiB aligned and covers AlignUp(size, 4096).
// InvalidArgument when a segment does not fit the codec; Corruption when
// `raw` is not a raw object. REQUIRES: !c.raw().
Result<uint64_t> EncodeObject(const NamespaceCodec& c, std::span<const uint8_t> raw,
                              CodecBuffer* out, const CodecMetrics& m);

// OK when the parsed header `h` names codec `c`'s id and format version;
// Corruption otherwise (never decoded as another codec, nor as raw bytes).
Status CheckObjectCodec(const NamespaceCodec& c, const ParsedHeader& h);

// OK when the parsed header `h` of `object` is one codec `c` wrote (its codec
// id and version) and every segment's payload CRC32C matches; Corruption
// otherwise (a CRC mismatch counted on crc_failures). REQUIRES: !c.raw() and
// `h` was parsed from `object`.
Status CheckEncodedObject(const NamespaceCodec& c, const ParsedHeader& h,
                          std::span<const uint8_t> object, const CodecMetrics& m);

// Decodes segment `slot` of an object CheckEncodedObject accepted into `dst`,
// which is exactly the slot's raw size. Corruption (counted) for a frame that
// is malformed or of another size; `dst` then holds unspecified bytes.
Status DecodeSegment(const NamespaceCodec& c, const ParsedHeader& h,
                     std::span<const uint8_t> object, uint32_t slot, std::span<uint8_t> dst,
                     const CodecMetrics& m);

}  // namespace orbitkv
