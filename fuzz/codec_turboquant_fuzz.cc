// libFuzzer target: the TurboQuant decoders, 4 and 3 bits (input byte 0 bit
// 7 picks; codec_fuzz_common.h describes the other bits).
#include "codec_fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using orbitkv::codec::CodecId;
  const bool three = size > 0 && (data[0] & 0x80) != 0;
  return orbitkv::codec::fuzz::Run(three ? CodecId::kTurboQuant3 : CodecId::kTurboQuant4, data,
                                   size);
}
