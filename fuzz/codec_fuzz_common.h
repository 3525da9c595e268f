// The codec fuzzers' shared harness (codec_*_fuzz.cc, one per decoder). The
// first input byte picks the mode:
//   bit 0 clear: the rest is a frame, its codec byte forced to the fuzzer's
//     codec; bit 1 rewrites its CRC so the codec's own parser is reached.
//   bit 0 set: the rest (after 4 bytes) is a raw segment, encoded with the
//     codec; the 4 bytes pick one byte of the frame and a mask to flip, and
//     the CRC is rewritten: mutations of valid frames, deep in every parser.
// Decode must return OK or Corruption and stay in bounds (ASan); for ans the
// scalar and dispatching (AVX2) decoders must agree on status and bytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_internal.h"
#include "codec/frame_layout.h"

namespace orbitkv::codec::fuzz {

inline void Check(bool ok) {
  if (!ok) std::abort();
}

inline int Run(CodecId codec, const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> frame;
  if (mode & 1) {
    if (size < 5) return 0;
    const uint32_t pick = Load32(data + 1);
    std::vector<uint8_t> raw(data + 5, data + size);
    const DType dtype = (pick >> 30) == 1 ? DType::kFp16 : DType::kBf16;
    const uint32_t head_dim = 32u << ((pick >> 28) & 3);
    if (codec != CodecId::kAns) raw.resize(raw.size() / (2 * head_dim) * (2 * head_dim));
    raw.resize(raw.size() / 2 * 2);
    const SegmentInfo info{dtype, head_dim};
    frame.resize(MaxEncodedSize(codec, info, raw.size()));
    const EncodeOptions options{.ans_chunk_elements = 32u * (1 + ((pick >> 24) & 7))};
    Result<size_t> n = Encode(codec, info, raw, frame, options);
    if (!n.ok()) return 0;
    frame.resize(*n);
    const size_t at = (pick & 0xffffff) % frame.size();
    frame[at] ^= static_cast<uint8_t>(pick >> 16) | 1;
  } else {
    frame.assign(data + 1, data + size);
    if (frame.size() > kFramePrefixBytes) {
      frame[kPrefixCodec] = static_cast<uint8_t>(codec);
      Store64(frame.data() + kPrefixFrameSize, frame.size());
    }
    if (!(mode & 2)) {
      std::vector<uint8_t> none;
      const Status st = Decode(frame, none);
      Check(st.ok() || st.code() == StatusCode::kCorruption ||
            st.code() == StatusCode::kInvalidArgument);
      return 0;
    }
  }
  if (frame.size() >= kFramePrefixBytes) Store32(frame.data() + kFrameCrcOffset, FrameCrc(frame));
  Result<FrameInfo> fi = ParseFrame(frame);
  if (!fi.ok()) {
    Check(fi.status().code() == StatusCode::kCorruption);
    return 0;
  }
  if (fi->decoded_size > (16u << 20)) return 0;  // a size field; the caller bounds it
  std::vector<uint8_t> out(fi->decoded_size, 0xa5);
  const Status st = Decode(frame, out, codec);
  Check(st.ok() || st.code() == StatusCode::kCorruption);
  if (fi->codec != codec) {
    Check(st.code() == StatusCode::kCorruption);  // the codec byte was the mutation
    return 0;
  }
  if (codec == CodecId::kAns) {
    std::vector<uint8_t> scalar(fi->decoded_size, 0xa5);
    const Status sst = internal::AnsDecodeScalar(*fi, frame, scalar);
    Check(sst.ok() == st.ok());
    if (st.ok()) Check(scalar == out);
  }
  return 0;
}

}  // namespace orbitkv::codec::fuzz
