// libFuzzer target for QueryReply's hybrid fields (prefix_tokens, pieces,
// not_needed_bytes): what a client decodes from the Manager. Random bytes
// seldom make a reply with a pieces vector, so this target builds one from
// the input (any counts, tiers, groups, bytes), encodes it with the generated
// builders, then flips input-chosen bytes. Checks: decoding never crashes and
// fails only with InvalidArgument; a reply that decodes has one piece per
// source with the same tier, within the field limits, and survives
// re-encoding unchanged.
#include <flatbuffers/flatbuffers.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <vector>

#include "built_message_fuzz.h"
#include "protocol/orbitkv_generated.h"
#include "protocol/wire.h"

namespace {

namespace fb = flatbuffers;
namespace w = orbitkv::wire;

std::optional<orbitkv::protocol::DecodedMessage> BuildAndDecode(FuzzedDataProvider& in) {
  fb::FlatBufferBuilder fbb(1024);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 12);
  const size_t m = in.ConsumeBool() ? n : in.ConsumeIntegralInRange<size_t>(0, 12);
  std::vector<uint8_t> tiers(n);
  for (uint8_t& t : tiers) t = in.ConsumeIntegralInRange<uint8_t>(0, 3);
  std::vector<w::QuerySource> pieces;
  for (size_t i = 0; i < m; ++i) {
    const bool same = in.ConsumeBool() && i < n;
    pieces.emplace_back(in.ConsumeIntegral<uint64_t>(),
                        in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20)
                                         : in.ConsumeIntegral<uint64_t>(),
                        in.ConsumeIntegralInRange<uint32_t>(0, 70),
                        in.ConsumeIntegralInRange<uint32_t>(0, 70),
                        same ? tiers[i] : in.ConsumeIntegral<uint8_t>());
  }
  auto sources = fbb.CreateVector(tiers);
  fb::Offset<fb::Vector<const w::QuerySource*>> pv;
  if (in.ConsumeBool()) pv = fbb.CreateVectorOfStructs(pieces);
  auto reply =
      w::CreateQueryReply(fbb, in.ConsumeIntegral<uint64_t>(), static_cast<uint32_t>(n), sources,
                          in.ConsumeIntegral<uint64_t>(), in.ConsumeBool(),
                          in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 1 << 20)
                                           : in.ConsumeIntegral<uint64_t>(),
                          pv, in.ConsumeIntegral<uint64_t>());
  return orbitkv::fuzz::FlipAndDecode(fbb, w::Body_QueryReply, reply.Union(), in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orbitkv::protocol;
  FuzzedDataProvider in(data, size);
  std::optional<DecodedMessage> decoded = BuildAndDecode(in);
  if (!decoded) return 0;
  const auto* q = std::get_if<orbitkv::QueryResult>(&decoded->body);
  if (q == nullptr) return 0;  // a flip may change the body
  if (!q->pieces.empty()) {
    if (q->pieces.size() != q->sources.size()) std::abort();
    for (size_t i = 0; i < q->pieces.size(); ++i) {
      const orbitkv::QuerySource& p = q->pieces[i];
      if (p.tier != q->sources[i] || p.bytes == 0 || p.bytes > orbitkv::kMaxPieceBytes ||
          p.group >= orbitkv::kMaxModelGroups || p.storage_group >= orbitkv::kMaxGroups) {
        std::abort();
      }
    }
  }
  orbitkv::Result<DecodedMessage> again = DecodeMessage(EncodeMessage(decoded->id, decoded->body));
  if (!again.ok()) std::abort();
  const auto* q2 = std::get_if<orbitkv::QueryResult>(&again->body);
  if (q2 == nullptr || q2->pieces != q->pieces || q2->sources != q->sources ||
      q2->prefix_tokens != q->prefix_tokens || q2->not_needed_bytes != q->not_needed_bytes) {
    std::abort();
  }
  return 0;
}
