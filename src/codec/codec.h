// Storage codecs for KV segments (spec "Optional GPU storage encoding"): one
// segment's bytes in, one self-describing encoded frame out, and back. The
// frame carries its codec id and format version, the sizes, the codec's
// parameters (frequency tables, scales, codebooks) and a CRC32C of itself, so
// Decode needs nothing but the frame and the output buffer; the CUDA decoder
// (codec/codec_cuda.h) reads the same frames and gives the same bytes.
// Frames come back from disk: Decode treats them as untrusted and returns
// Corruption for any malformed frame without reading or writing out of bounds.
// All functions are pure and thread-safe.
//
// Frame prefix, little-endian (kFramePrefixBytes = 32):
//   [0, 4)   magic "OKVC"
//   [4]      codec id (CodecId), [5] format version of that codec
//   [6]      element dtype (DType), [7] flags (kFrameFlagStored: raw copy)
//   [8, 16)  decoded size u64    [16, 24) frame size u64 (the whole frame)
//   [24, 28) param u32: ans chunk elements, fp8 group elements, TurboQuant head_dim
//   [28, 32) CRC32C (Castagnoli) of the whole frame with this field zeroed
// then the codec's own header and payload (README "Codecs", codec/*.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "codec/frame_layout.h"  // kFramePrefixBytes, kFrameMagic, ...
#include "orbitkv/status.h"

namespace orbitkv::codec {

// Stored on disk: never renumber.
enum class CodecId : uint8_t {
  kNone = 0,         // raw bytes, no frame (the object format's codec 0)
  kAns = 1,          // lossless rANS over byte planes, 32 interleaved lanes per chunk
  kFp8 = 2,          // e4m3fn with an fp32 scale per group (lossy)
  kTurboQuant4 = 3,  // TurboQuant-MSE, 4 bits per coordinate (lossy)
  kTurboQuant3 = 4,  // TurboQuant-MSE, 3 bits per coordinate (lossy)
};
inline constexpr int kNumCodecs = 5;

// Element type of the segment. Stored on disk: never renumber.
enum class DType : uint8_t { kBf16 = 1, kFp16 = 2, kFp8E4m3fn = 3 };

// Format version each encoder writes and each decoder accepts.
inline constexpr uint8_t kAnsFormatVersion = 1;
inline constexpr uint8_t kFp8FormatVersion = 1;
inline constexpr uint8_t kTurboQuantFormatVersion = 1;

// "none", "ans", "fp8", "turboquant-4", "turboquant-3" (the --storage-codec names).
std::string_view CodecName(CodecId id);
Result<CodecId> ParseCodecName(std::string_view name);
uint8_t CodecFormatVersion(CodecId id);  // 0 for kNone (no frame)
bool CodecIsLossless(CodecId id);
size_t DTypeBytes(DType t);  // 2, 2, 1

// What the encoder must know about a segment.
struct SegmentInfo {
  DType dtype = DType::kBf16;
  // Elements per KV head vector (a (token, head) row). fp8 keeps one scale
  // per head_dim elements; TurboQuant rotates and quantises vectors of this
  // size (a power of two in [32, 1024]; the segment a whole number of them).
  // ans ignores it.
  uint32_t head_dim = 128;
};

// Encoder knobs; defaults are the production choice.
struct EncodeOptions {
  // ans: elements per chunk (a multiple of 32 in [32, 1 << 20]); one GPU warp
  // decodes one chunk. 0 picks by segment size.
  uint32_t ans_chunk_elements = 0;
  // TurboQuant: the seed of the randomised Hadamard transform's signs.
  uint64_t turboquant_seed = 0x6f6b762d74710001ull;
};

// Bytes an encoded frame of `raw_bytes` may take at most (for buffer sizing).
// kNone gives raw_bytes.
size_t MaxEncodedSize(CodecId id, const SegmentInfo& info, size_t raw_bytes);

// Encodes `raw` into out[0, n) and returns n (the frame size).
// InvalidArgument when raw does not fit the codec (size not a whole number of
// elements or head vectors, an unsupported dtype or head_dim, kNone), when
// out is smaller than MaxEncodedSize.
Result<size_t> Encode(CodecId id, const SegmentInfo& info, std::span<const uint8_t> raw,
                      std::span<uint8_t> out, const EncodeOptions& options = {});

// The prefix fields of a frame, validated (magic, known codec and version,
// dtype, frame size equal to frame.size(), CRC). Corruption otherwise.
struct FrameInfo {
  CodecId codec = CodecId::kNone;
  uint8_t version = 0;
  DType dtype = DType::kBf16;
  uint8_t flags = 0;
  uint64_t decoded_size = 0;
  uint64_t frame_size = 0;
  uint32_t param = 0;
  uint32_t crc = 0;
};
Result<FrameInfo> ParseFrame(std::span<const uint8_t> frame);

// Decodes a whole frame into out, which must be exactly the decoded size.
// Corruption for any malformed frame (bytes of out are then unspecified);
// InvalidArgument when out.size() differs from the frame's decoded size.
// `expected` (optional) must match the frame's codec.
Status Decode(std::span<const uint8_t> frame, std::span<uint8_t> out,
              std::optional<CodecId> expected = std::nullopt);

// CRC32C (iSCSI polynomial, the object format's per-segment CRC); chainable:
// Crc32c(b, Crc32c(a)) == Crc32c(a ++ b).
uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc = 0);

// The CRC stored at kFrameCrcOffset: Crc32c of the frame with that field
// zeroed. REQUIRES: frame.size() >= kFramePrefixBytes.
uint32_t FrameCrc(std::span<const uint8_t> frame);

}  // namespace orbitkv::codec
