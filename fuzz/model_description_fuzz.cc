// libFuzzer target for RegisterInstance.model, the model description a
// register carries (recovery::ValidateModelDescription behind the wire
// decoder). Random bytes seldom make a FlatBuffer with a model table, so this
// target builds one: the input chooses every field, raw (any kind byte, any
// size, positions in any order), encodes it with the generated builders
// inside a valid RegisterInstance, then flips input-chosen bytes of the
// message. Checks: decoding never crashes and fails only with
// InvalidArgument; a description that decodes is valid, its canonical bytes
// and fingerprint are computable, and it survives re-encoding unchanged.
#include <flatbuffers/flatbuffers.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "built_message_fuzz.h"
#include "protocol/orbitkv_generated.h"
#include "protocol/wire.h"
#include "recovery/model_description.h"

namespace {

namespace fb = flatbuffers;
namespace w = orbitkv::wire;

std::optional<orbitkv::protocol::DecodedMessage> BuildAndDecode(FuzzedDataProvider& in) {
  fb::FlatBufferBuilder fbb(1024);
  std::vector<fb::Offset<w::ModelGroup>> groups;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 6);
  const bool small = in.ConsumeBool();  // small values hit the grid and window rules
  auto value = [&](uint64_t small_max) {
    return small ? in.ConsumeIntegralInRange<uint64_t>(0, small_max)
                 : in.ConsumeIntegral<uint64_t>();
  };
  for (size_t i = 0; i < n; ++i) {
    auto name = fbb.CreateString(in.ConsumeRandomLengthString(16));
    const auto kind = in.ConsumeIntegralInRange<uint8_t>(0, 4);
    const auto storage = static_cast<uint32_t>(value(70));
    const uint64_t bt = value(64), bytes = value(1 << 20), window = value(256),
                   interval = value(256);
    std::vector<uint64_t> positions(in.ConsumeIntegralInRange<size_t>(0, 8));
    for (uint64_t& p : positions) p = value(512);
    fb::Offset<fb::Vector<uint64_t>> pos;
    if (in.ConsumeBool()) pos = fbb.CreateVector(positions);
    groups.push_back(
        w::CreateModelGroup(fbb, name, kind, storage, bt, bytes, window, interval, pos));
  }
  const uint64_t key_block = value(64);
  fb::Offset<fb::Vector<fb::Offset<w::ModelGroup>>> groups_vec;
  if (in.ConsumeBool() || n > 0) groups_vec = fbb.CreateVector(groups);
  auto model = w::CreateModelDescription(fbb, key_block, groups_vec);
  auto ns = fbb.CreateString("fuzz");
  auto device = fbb.CreateString("host");
  auto layout = w::CreateLayout(fbb, 1);
  auto reg = w::CreateRegisterInstance(fbb, ns, 0, device, layout, 0, model);
  return orbitkv::fuzz::FlipAndDecode(fbb, w::Body_RegisterInstance, reg.Union(), in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace orbitkv::protocol;
  FuzzedDataProvider in(data, size);
  std::optional<DecodedMessage> decoded = BuildAndDecode(in);
  if (!decoded) return 0;
  const auto* reg = std::get_if<orbitkv::RegisterRequest>(&decoded->body);
  if (reg == nullptr || !reg->model) return 0;  // a flip may drop the model or change the body
  if (!orbitkv::recovery::ValidateModelDescription(*reg->model).ok()) std::abort();
  if (orbitkv::recovery::CanonicalBytes(*reg->model).empty()) std::abort();
  (void)orbitkv::recovery::Fingerprint(*reg->model);
  orbitkv::Result<DecodedMessage> again = DecodeMessage(EncodeMessage(decoded->id, decoded->body));
  if (!again.ok()) std::abort();
  const auto* reg2 = std::get_if<orbitkv::RegisterRequest>(&again->body);
  if (reg2 == nullptr || reg2->model != reg->model) std::abort();
  return 0;
}
