// Shared by the fuzz targets that build a message from the input rather than
// decode raw bytes (model_description_fuzz.cc, query_reply_fuzz.cc): finish
// the envelope, flip input-chosen bytes, decode, and accept only OK or
// InvalidArgument. Header-only, fuzzing builds only.
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "protocol/orbitkv_generated.h"
#include "protocol/wire.h"

namespace orbitkv::fuzz {

// Wraps `body` in an envelope, then XORs up to 4 input-chosen bytes of the
// message with input-chosen values; decodes it. nullopt when the decoder
// refused it (aborts on any code but InvalidArgument).
inline std::optional<protocol::DecodedMessage> FlipAndDecode(flatbuffers::FlatBufferBuilder& fbb,
                                                             wire::Body type,
                                                             flatbuffers::Offset<void> body,
                                                             FuzzedDataProvider& in) {
  auto env = wire::CreateEnvelope(fbb, protocol::kProtocolVersion, 1, type, body);
  wire::FinishEnvelopeBuffer(fbb, env);
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  const size_t flips = in.ConsumeIntegralInRange<size_t>(0, 4);
  for (size_t i = 0; i < flips && !bytes.empty(); ++i) {
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
    bytes[at] ^= in.ConsumeIntegralInRange<uint8_t>(1, 255);
  }
  Result<protocol::DecodedMessage> decoded = protocol::DecodeMessage(bytes);
  if (!decoded.ok()) {
    if (decoded.status().code() != StatusCode::kInvalidArgument) std::abort();
    return std::nullopt;
  }
  return std::move(decoded).value();
}

}  // namespace orbitkv::fuzz
