// Fingerprint and namespace keys: the SHA-256 half of model_description.h,
// in orbitkv_recovery_identity with the object keys (Nettle's SHA-256).
#include <fmt/format.h>

#include "recovery/model_description.h"
#include "recovery/sha256.h"

namespace orbitkv::recovery {

ModelFingerprint Fingerprint(const ModelDescription& d) { return Sha256(CanonicalBytes(d)); }

std::string FingerprintHex(const ModelFingerprint& f) {
  std::string out;
  out.reserve(64);
  for (uint8_t b : f) out += fmt::format("{:02x}", b);
  return out;
}

NamespaceKey MakeNamespaceKey(std::string_view ns, const std::optional<ModelDescription>& model) {
  NamespaceKey k;
  k.ns = std::string(ns);
  if (model) k.model = Fingerprint(*model);
  return k;
}

}  // namespace orbitkv::recovery
