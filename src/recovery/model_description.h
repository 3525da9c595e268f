// Model descriptions (orbitkv/model_description.h): validation, the canonical
// encoding, the fingerprint that keeps instances of different descriptions
// apart, and the agreement check against a registered layout. Pure functions,
// thread-safe. python/orbitkv/hybrid.py mirrors Validate, CanonicalBytes and
// Fingerprint byte for byte (tests/python/test_hybrid.py checks it).
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orbitkv/layout.h"
#include "orbitkv/model_description.h"
#include "orbitkv/status.h"

namespace orbitkv::recovery {

// Checks every rule of orbitkv/model_description.h: at least one group, at most
// kMaxModelGroups; key_block_tokens in [1, kMaxBlockTokens]; per group a
// printable name unique in the description, a known kind, a unique
// storage_group < kMaxGroups, block_tokens a multiple of key_block_tokens and
// at most kMaxBlockTokens, bytes in [1, kMaxPieceBytes]; a window only on
// sliding-window groups, in [1, kMaxSequenceTokens]; on recurrent groups
// exactly one of interval or positions, on the block grid, positions strictly
// ascending in (0, kMaxSequenceTokens], at most kMaxCheckpointPositions.
// InvalidArgument whose message starts with the field, prefixed by `field`
// ("model.groups[1].window_tokens: ..."), and says why.
Status ValidateModelDescription(const ModelDescription& d, std::string_view field = "model");

// "full attention", "sliding window", "recurrent" ("unknown" for another value).
std::string_view GroupKindName(GroupKind k);

// The canonical encoding (version 1), little-endian, groups sorted by name so
// that group order does not matter:
//   "OKVMODEL" u16 version=1 u64 key_block_tokens u32 group count, then per group:
//   u32 name length, name, u8 kind, u32 storage_group, u64 block_tokens, u64 bytes,
//   u64 window_tokens, u64 checkpoint_interval_tokens, u32 position count, u64 positions...
// REQUIRES: ValidateModelDescription(d).ok().
std::vector<uint8_t> CanonicalBytes(const ModelDescription& d);

// The functions from here to NamespaceKey are in target orbitkv_recovery_identity
// (it links Nettle's SHA-256), the rest in orbitkv_recovery (no dependency), so
// the wire decoder validates without linking a hash library.
//
// SHA-256 of CanonicalBytes: equal descriptions, and only those (up to SHA-256),
// have equal fingerprints. REQUIRES: d validated.
using ModelFingerprint = std::array<uint8_t, 32>;
ModelFingerprint Fingerprint(const ModelDescription& d);
std::string FingerprintHex(const ModelFingerprint& f);  // 64 lowercase hex digits

// What the Manager interns a namespace under: the engine's namespace string
// and the fingerprint of its description (none: a dense model, the namespace
// of instances that register without one). Instances whose descriptions differ
// get different namespaces, so they never share objects; a dense instance
// never shares with a hybrid one of the same name. Injective by construction.
struct NamespaceKey {
  std::string ns;
  std::optional<ModelFingerprint> model;
  friend auto operator<=>(const NamespaceKey&, const NamespaceKey&) = default;
  friend bool operator==(const NamespaceKey&, const NamespaceKey&) = default;
};
// REQUIRES: `model`, when set, validated.
NamespaceKey MakeNamespaceKey(std::string_view ns, const std::optional<ModelDescription>& model);

// Register-time agreement of a validated description with a validated layout:
// every layout group is some description group's storage_group, and its
// object's logical bytes (the sum of slot_bytes over the whole group) equal
// that group's `bytes`. Description groups may be absent from one instance's
// layout (another instance of the namespace holds them). InvalidArgument
// naming the group otherwise.
Status CheckLayoutAgreement(const ModelDescription& d, const InstanceLayout& layout);

}  // namespace orbitkv::recovery
