// libFuzzer target for the engine protocol decoder: every socket message the
// Manager reads goes through DecodeMessage (and PeekEnvelopeId, to address an
// ErrorReply), so both must be total on arbitrary bytes.
//
// Beyond "no crash, no sanitizer report", it checks that decoding is
// canonical: whatever decodes re-encodes to bytes that decode again, and
// re-encoding that is a fixed point.
//
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined ... protocol_fuzz.cc wire.cc status.cc
//   ./protocol_fuzz -max_total_time=30 corpus/
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "protocol/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orbitkv::protocol;
  const std::span<const uint8_t> bytes(data, size);
  const std::optional<uint64_t> peeked = PeekEnvelopeId(bytes);
  orbitkv::Result<DecodedMessage> decoded = DecodeMessage(bytes);
  if (!decoded.ok()) {
    if (decoded.status().code() != orbitkv::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  // A message that decodes has a readable id, and it is the same one.
  if (!peeked.has_value() || *peeked != decoded->id) std::abort();
  const std::vector<uint8_t> canonical = EncodeMessage(decoded->id, decoded->body);
  orbitkv::Result<DecodedMessage> again = DecodeMessage(canonical);
  if (!again.ok() || again->id != decoded->id || again->body.index() != decoded->body.index()) {
    std::abort();
  }
  if (EncodeMessage(again->id, again->body) != canonical) std::abort();
  return 0;
}
