#include "codec/codec.h"

#include <isa-l/crc.h>

#include <array>
#include <limits>
#include <string>

#include "codec/codec_internal.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec {
namespace {

constexpr std::array<std::string_view, kNumCodecs> kNames = {"none", "ans", "fp8", "turboquant-4",
                                                             "turboquant-3"};

bool ValidDType(uint8_t t) { return t >= 1 && t <= 3; }

}  // namespace

std::string_view CodecName(CodecId id) {
  const auto i = static_cast<size_t>(id);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

Result<CodecId> ParseCodecName(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<CodecId>(i);
  }
  return Status::InvalidArgument("unknown storage codec '" + std::string(name) +
                                 "' (none, ans, fp8, turboquant-4, turboquant-3)");
}

uint8_t CodecFormatVersion(CodecId id) {
  switch (id) {
    case CodecId::kNone:
      return 0;
    case CodecId::kAns:
      return kAnsFormatVersion;
    case CodecId::kFp8:
      return kFp8FormatVersion;
    case CodecId::kTurboQuant4:
    case CodecId::kTurboQuant3:
      return kTurboQuantFormatVersion;
  }
  return 0;
}

bool CodecIsLossless(CodecId id) { return id == CodecId::kNone || id == CodecId::kAns; }

size_t DTypeBytes(DType t) { return t == DType::kFp8E4m3fn ? 1 : 2; }

size_t MaxEncodedSize(CodecId id, const SegmentInfo& info, size_t raw_bytes) {
  switch (id) {
    case CodecId::kNone:
      return raw_bytes;
    case CodecId::kAns:
      return internal::AnsMaxEncodedSize(info, raw_bytes);
    case CodecId::kFp8:
      return internal::Fp8MaxEncodedSize(info, raw_bytes);
    case CodecId::kTurboQuant4:
      return internal::TurboQuantMaxEncodedSize(4, info, raw_bytes);
    case CodecId::kTurboQuant3:
      return internal::TurboQuantMaxEncodedSize(3, info, raw_bytes);
  }
  return 0;
}

Result<size_t> Encode(CodecId id, const SegmentInfo& info, std::span<const uint8_t> raw,
                      std::span<uint8_t> out, const EncodeOptions& options) {
  if (!ValidDType(static_cast<uint8_t>(info.dtype))) {
    return Status::InvalidArgument("codec: unknown element dtype");
  }
  if (raw.size() % DTypeBytes(info.dtype) != 0) {
    return Status::InvalidArgument("codec: segment of " + std::to_string(raw.size()) +
                                   " bytes is not a whole number of elements");
  }
  // Offsets inside a frame are u32.
  if (raw.size() > (size_t{1} << 31)) {
    return Status::InvalidArgument("codec: segments over 2 GiB are not encoded");
  }
  const size_t bound = MaxEncodedSize(id, info, raw.size());
  if (id != CodecId::kNone && out.size() < bound) {
    return Status::InvalidArgument("codec: output buffer of " + std::to_string(out.size()) +
                                   " bytes is below MaxEncodedSize " + std::to_string(bound));
  }
  Result<size_t> n = Status::InvalidArgument("codec none has no frame: store the raw bytes");
  switch (id) {
    case CodecId::kNone:
      break;
    case CodecId::kAns:
      n = internal::AnsEncode(info, raw, out, options);
      break;
    case CodecId::kFp8:
      n = internal::Fp8Encode(info, raw, out);
      break;
    case CodecId::kTurboQuant4:
      n = internal::TurboQuantEncode(4, info, raw, out, options);
      break;
    case CodecId::kTurboQuant3:
      n = internal::TurboQuantEncode(3, info, raw, out, options);
      break;
    default:
      n = Status::InvalidArgument("codec: unknown codec id");
  }
  if (!n.ok()) return n;
  Store32(out.data() + kFrameCrcOffset, FrameCrc(out.first(*n)));
  return n;
}

namespace internal {
void WritePrefix(uint8_t* out, CodecId id, DType dtype, uint8_t flags, uint64_t decoded_size,
                 uint64_t frame_size, uint32_t param) {
  WriteFramePrefix(out, static_cast<uint8_t>(id), CodecFormatVersion(id),
                   static_cast<uint8_t>(dtype), flags, decoded_size, frame_size, param);
}
}  // namespace internal

Result<FrameInfo> ParseFrame(std::span<const uint8_t> frame) {
  if (frame.size() < kFramePrefixBytes) {
    return Status::Corruption("codec frame of " + std::to_string(frame.size()) +
                              " bytes is shorter than its 32-byte prefix");
  }
  const uint8_t* p = frame.data();
  if (Load32(p) != kFrameMagic) return Status::Corruption("codec frame: bad magic");
  FrameInfo fi;
  const uint8_t id = p[kPrefixCodec];
  if (id == 0 || id >= kNumCodecs) {
    return Status::Corruption("codec frame: unknown codec id " + std::to_string(id));
  }
  fi.codec = static_cast<CodecId>(id);
  fi.version = p[kPrefixVersion];
  if (fi.version != CodecFormatVersion(fi.codec)) {
    return Status::Corruption("codec frame: " + std::string(CodecName(fi.codec)) +
                              " format version " + std::to_string(fi.version) +
                              " (this build reads " + std::to_string(CodecFormatVersion(fi.codec)) +
                              ")");
  }
  if (!ValidDType(p[kPrefixDType])) return Status::Corruption("codec frame: unknown dtype");
  fi.dtype = static_cast<DType>(p[kPrefixDType]);
  fi.flags = p[kPrefixFlags];
  fi.decoded_size = Load64(p + kPrefixDecodedSize);
  fi.frame_size = Load64(p + kPrefixFrameSize);
  fi.param = Load32(p + kPrefixParam);
  fi.crc = Load32(p + kFrameCrcOffset);
  if (fi.frame_size != frame.size()) {
    return Status::Corruption("codec frame: frame size field " + std::to_string(fi.frame_size) +
                              " but " + std::to_string(frame.size()) + " bytes given");
  }
  if (fi.decoded_size % DTypeBytes(fi.dtype) != 0) {
    return Status::Corruption("codec frame: decoded size is not a whole number of elements");
  }
  if ((fi.flags & ~kFrameFlagStored) != 0) return Status::Corruption("codec frame: unknown flags");
  const uint32_t crc = FrameCrc(frame);
  if (crc != fi.crc) return Status::Corruption("codec frame: CRC32C mismatch");
  return fi;
}

Status Decode(std::span<const uint8_t> frame, std::span<uint8_t> out,
              std::optional<CodecId> expected) {
  Result<FrameInfo> fi = ParseFrame(frame);
  if (!fi.ok()) return fi.status();
  if (expected && *expected != fi->codec) {
    return Status::Corruption("codec frame: codec " + std::string(CodecName(fi->codec)) +
                              " where " + std::string(CodecName(*expected)) + " was expected");
  }
  if (out.size() != fi->decoded_size) {
    return Status::InvalidArgument("codec: output of " + std::to_string(out.size()) +
                                   " bytes for a frame that decodes to " +
                                   std::to_string(fi->decoded_size));
  }
  switch (fi->codec) {
    case CodecId::kAns:
      return internal::AnsDecode(*fi, frame, out);
    case CodecId::kFp8:
      return internal::Fp8Decode(*fi, frame, out);
    case CodecId::kTurboQuant4:
      return internal::TurboQuantDecode(4, *fi, frame, out);
    case CodecId::kTurboQuant3:
      return internal::TurboQuantDecode(3, *fi, frame, out);
    case CodecId::kNone:
      break;
  }
  return Status::Corruption("codec frame: unknown codec");
}

uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc) {
  // ISA-L's crc32_iscsi takes and returns the register without the final
  // inversion; invert on the way in and out for the standard, chainable CRC.
  // Its length is an int: feed it at most 1 GiB at a time.
  uint32_t reg = ~crc;
  const uint8_t* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const size_t n = std::min<size_t>(left, size_t{1} << 30);
    reg = crc32_iscsi(const_cast<uint8_t*>(p), static_cast<int>(n), reg);
    p += n;
    left -= n;
  }
  return ~reg;
}

uint32_t FrameCrc(std::span<const uint8_t> frame) {
  static constexpr uint8_t kZero[4] = {0, 0, 0, 0};
  uint32_t crc = Crc32c(frame.first(kFrameCrcOffset));
  crc = Crc32c(kZero, crc);
  return Crc32c(frame.subspan(kFrameCrcOffset + 4), crc);
}

}  // namespace orbitkv::codec
