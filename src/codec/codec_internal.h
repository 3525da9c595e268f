// The per-codec halves behind codec.h's dispatch (codec.cc). Each Encode
// writes a complete frame, prefix included but CRC left zero (codec.cc seals
// it); each Decode receives a frame whose prefix ParseFrame has validated
// (magic, sizes, CRC) and out sized to the decoded size, and checks
// everything else itself. Not for use outside src/codec.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codec/codec.h"

namespace orbitkv::codec::internal {

// Writes the common prefix (CRC zero).
void WritePrefix(uint8_t* out, CodecId id, DType dtype, uint8_t flags, uint64_t decoded_size,
                 uint64_t frame_size, uint32_t param);

size_t AnsMaxEncodedSize(const SegmentInfo& info, size_t raw_bytes);
Result<size_t> AnsEncode(const SegmentInfo& info, std::span<const uint8_t> raw,
                         std::span<uint8_t> out, const EncodeOptions& options);
Status AnsDecode(const FrameInfo& fi, std::span<const uint8_t> frame, std::span<uint8_t> out);
// The scalar decoder, always built; AnsDecode picks AVX2 where enabled.
Status AnsDecodeScalar(const FrameInfo& fi, std::span<const uint8_t> frame, std::span<uint8_t> out);
// Whether the CPU has AVX2 (and popcnt); checked once at run time.
bool AnsAvx2Available();

// The CPU codecs' SIMD paths (ans encode and decode, fp8 encode and decode)
// run where the CPU has AVX2, unless ForceScalarCodecs(true) selects the
// scalar references (tests compare the two byte for byte; benchmarks time
// both). Both give the same bytes. Process-wide and thread-safe; flip it only
// while no codec call is running.
bool CodecAvx2Enabled();
void ForceScalarCodecs(bool scalar);

// max(amax / 448, FLT_MIN): the fp32 scale of a group whose largest finite
// magnitude is amax.
float Fp8GroupScale(float amax);
size_t Fp8MaxEncodedSize(const SegmentInfo& info, size_t raw_bytes);
Result<size_t> Fp8Encode(const SegmentInfo& info, std::span<const uint8_t> raw,
                         std::span<uint8_t> out);
Status Fp8Decode(const FrameInfo& fi, std::span<const uint8_t> frame, std::span<uint8_t> out);
// The AVX2 halves of the fp8 codec (fp8_avx2.cc): one group of n elements
// (16-bit, bf16 when bf16), exactly the scalar loop's bytes.
float Fp8GroupAmaxAvx2(const uint8_t* raw, size_t n, bool bf16);
void Fp8EncodeGroupAvx2(const uint8_t* raw, size_t n, bool bf16, float scale, uint8_t* payload);
void Fp8DecodeGroupAvx2(const uint8_t* payload, size_t n, bool bf16, float scale, uint8_t* out);

size_t TurboQuantMaxEncodedSize(uint32_t bits, const SegmentInfo& info, size_t raw_bytes);
Result<size_t> TurboQuantEncode(uint32_t bits, const SegmentInfo& info,
                                std::span<const uint8_t> raw, std::span<uint8_t> out,
                                const EncodeOptions& options);
// The Lloyd-Max codebook (2^bits centroids, ascending) for one coordinate of
// a uniformly random unit vector in dim dimensions (density proportional to
// (1 - t^2)^((dim - 3) / 2) on [-1, 1]), and its distortion dim * E[(t - Q(t))^2]
// (the paper's D_mse for unit vectors). Deterministic; cached per (dim, bits).
const std::vector<float>& TurboQuantCodebook(uint32_t dim, uint32_t bits);
double TurboQuantCodebookDistortion(uint32_t dim, uint32_t bits);
// The GPU encoder's halves of TurboQuantEncode: the shape checks, and the
// header (prefix with CRC zero, TurboQuant fields, codebook) written to o;
// returns the header's size (where the norms start).
Status TurboQuantCheckShape(const SegmentInfo& info, uint64_t raw_bytes);
size_t WriteTurboQuantHeader(uint32_t bits, const SegmentInfo& info, uint64_t raw_bytes,
                             uint64_t seed, uint8_t* o);
Status TurboQuantDecode(uint32_t bits, const FrameInfo& fi, std::span<const uint8_t> frame,
                        std::span<uint8_t> out);

}  // namespace orbitkv::codec::internal
