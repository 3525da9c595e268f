// libFuzzer target: the ans decoder (codec_fuzz_common.h describes the modes).
#include "codec_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return orbitkv::codec::fuzz::Run(orbitkv::codec::CodecId::kAns, data, size);
}
