// Wire: encodes the cache API structs (orbitkv/cache_api.h) into the
// FlatBuffers messages of orbitkv.fbs and decodes them back. One message is one
// Envelope {version, id, body}; the requester picks the id and the reply
// echoes it.
//
// Decoding treats the bytes as untrusted: the FlatBuffers verifier runs first
// (depth and table count bounded), then the version, the body type and every
// vector and string are checked against the limits below. Any violation is an
// InvalidArgument whose message names the field ("Publish.keys: ..."). Decode
// never crashes, never reads out of bounds, and allocates at most in
// proportion to the input (it is fuzzed by fuzz/protocol_fuzz.cc).
// The decoder checks shape, not meaning: layouts, instance ids and page ranges
// are validated by the Manager (ValidateLayout etc.). RegisterInstance.device
// is checked here (ParseDevice), since it decides how the regions travel, and
// so is RegisterInstance.model (recovery::ValidateModelDescription): a bad
// description is refused with the field and the reason before any Manager
// state is touched. A register without one (older clients) is a dense model.
//
// Encoders do not check the limits: the peer's decoder does.
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "orbitkv/cache_api.h"
#include "orbitkv/device.h"
#include "orbitkv/layout.h"
#include "orbitkv/status.h"

namespace orbitkv::protocol {

// Envelope.version this build speaks. Decode accepts exactly this version; a
// peer that speaks another gets an ErrorReply naming both (the Hello exchange
// carries it too, for a readable error before anything else is sent).
inline constexpr uint16_t kProtocolVersion = 1;

// ---- limits enforced by DecodeMessage ---------------------------------------
inline constexpr uint32_t kMaxKeysPerMessage = 65536;  // keys, pages, blocks, sources
inline constexpr uint32_t kMaxStringBytes = 4096;      // every string field
// RegisterInstance.storage: codec and dtype names, and head_dim.
inline constexpr uint32_t kMaxCodecNameBytes = 32;
inline constexpr uint32_t kMaxCodecHeadDim = 1u << 16;
// RegisterInstance.ipc_handles: one cudaIpcMemHandle_t (64 bytes) per region,
// so at most kMaxRegions of them.
inline constexpr size_t kIpcHandleBytes = 64;
inline constexpr uint32_t kMaxIpcHandles = kMaxRegions;
// RegisterInstance.device is "host" or "cuda:N", N <= kMaxCudaDeviceOrdinal
// (orbitkv/device.h).
// Buffers this large are refused before verification (FlatBuffers' own bound
// is 2 GiB; frames are bounded far below this by frame.h).
inline constexpr size_t kMaxMessageBytes = size_t{1} << 30;
// Verifier bounds. Depth: Envelope > RegisterInstance > Layout > Group > Slot
// is 5; the slack is for schema growth. Tables: the largest legal message is a
// RegisterInstance with kMaxGroups full groups, or a RestoreReply with one
// BlockResult per key.
inline constexpr uint32_t kVerifierMaxDepth = 16;
inline constexpr uint32_t kVerifierMaxTables =
    kMaxGroups * kMaxSlotsPerGroup + kMaxGroups + kMaxModelGroups + kMaxKeysPerMessage + 64;

// ---- messages that cache_api.h does not define ------------------------------

struct HelloRequest {
  uint16_t protocol_version = kProtocolVersion;
  int32_t client_pid = 0;   // informational; servers use SO_PEERCRED
  std::string client_name;  // informational
};

struct HelloReply {
  uint16_t protocol_version = kProtocolVersion;
  int32_t server_pid = 0;
  uint32_t max_frame_bytes = 0;
  uint32_t max_fds_per_frame = 0;
  uint32_t max_keys_per_message = kMaxKeysPerMessage;
  uint32_t max_connections = 0;
};

struct RegisterReply {
  InstanceId instance = 0;
};

struct UnregisterRequest {
  InstanceId instance = 0;
};

struct UnregisterReply {};

struct ReleaseQueryRequest {
  InstanceId instance = 0;
  QueryId query = 0;
};
struct ReleaseQueryReply {};

// Cancels this session's in-flight Restore whose envelope id is restore_id.
// The restore still answers its own request (blocks not restored report
// Cancelled); this reply only says whether it was found in flight.
struct CancelRestoreRequest {
  RestoreId restore_id = 0;
};

struct CancelRestoreReply {
  bool cancelled = false;
};

struct PrepareReply {
  uint32_t queued = 0;   // objects scheduled to be warmed into DRAM
  uint32_t skipped = 0;  // already in DRAM, or not found
};

// The reply to a request that failed as a whole. REQUIRES: !status.ok().
struct ErrorReply {
  Status status;
};

// Every body an Envelope can carry, in the order of the schema's Body union.
using Message =
    std::variant<HelloRequest, HelloReply, RegisterRequest, RegisterReply, PublishRequest,
                 PublishResult, QueryRequest, QueryResult, RestoreRequest, RestoreResult,
                 CancelRestoreRequest, CancelRestoreReply, PrepareRequest, PrepareReply,
                 UnregisterRequest, UnregisterReply, ErrorReply, ReleaseQueryRequest,
                 ReleaseQueryReply, ClearNamespaceRequest, ClearNamespaceResult>;

struct DecodedMessage {
  uint16_t version = 0;
  uint64_t id = 0;
  Message body;
};

// The schema's name of a body ("Publish", "QueryReply", ...), for logs.
std::string_view MessageName(const Message& body);
// The same by Message's variant index; REQUIRES: index < variant_size of Message.
std::string_view MessageName(size_t index);

// ---- encoding -----------------------------------------------------------------
std::vector<uint8_t> EncodeRequest(uint64_t id, const HelloRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const RegisterRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const PublishRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const QueryRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const RestoreRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const CancelRestoreRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const PrepareRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const UnregisterRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const ReleaseQueryRequest& m);
std::vector<uint8_t> EncodeRequest(uint64_t id, const ClearNamespaceRequest& m);

std::vector<uint8_t> EncodeReply(uint64_t id, const HelloReply& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const RegisterReply& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const PublishResult& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const QueryResult& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const RestoreResult& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const CancelRestoreReply& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const PrepareReply& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const UnregisterReply& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const ReleaseQueryReply& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const ClearNamespaceResult& m);
std::vector<uint8_t> EncodeReply(uint64_t id, const ErrorReply& m);
// An ErrorReply carrying `status`; an OK status becomes Internal (a bug).
std::vector<uint8_t> EncodeError(uint64_t id, const Status& status);

// Any body. Messages are tagged with kProtocolVersion.
std::vector<uint8_t> EncodeMessage(uint64_t id, const Message& body);

// ---- decoding -----------------------------------------------------------------

// Verifies and decodes one Envelope. InvalidArgument naming the field for
// anything malformed, out of bounds, of another version or of an unknown body
// type. Strings longer than kMaxStringBytes are refused, also inside Status
// messages. `bytes` need not be aligned (it is copied when it is not).
Result<DecodedMessage> DecodeMessage(std::span<const uint8_t> bytes);

// The envelope id of `bytes`, reading only the envelope's own table (O(1),
// bounds-checked): what a reader thread needs to route a reply, or a server to
// address an ErrorReply to a request that failed to decode. nullopt when the
// envelope itself is unreadable.
std::optional<uint64_t> PeekEnvelopeId(std::span<const uint8_t> bytes);

// Checks the file descriptors that came with a decoded request: a
// RegisterRequest for device "host" carries exactly one per region (its
// memfds, in order); every other message (and a CUDA register, whose regions
// are its ipc_handles) carries none.
Status CheckAttachedFds(const Message& body, size_t num_fds);

// ---- RegisterInstance.device ------------------------------------------------------

// The device a RegisterRequest names.
// Devices are parsed with orbitkv/device.h's ParseDevice (field
// "RegisterInstance.device"). DecodeMessage applies it to every
// RegisterInstance, and checks there that a "host" request has no ipc_handles
// and a "cuda:N" request one per layout region.

// ---- Status on the wire ---------------------------------------------------------
// A Status travels as (code = numeric StatusCode, message, errno, data_loss).
// Decoding rebuilds it with the matching factory; I/O codes go through
// Status::IOError so retryable() follows errno as on the sender (a NoSpace
// without errno gets ENOSPC). data_loss survives only on I/O codes, the only
// ones that can carry it. Encoding cuts messages to kMaxStringBytes so that
// the peer's decoder accepts them.
struct WireStatus {
  uint8_t code = 0;
  std::string message;
  int32_t err_no = 0;
  bool data_loss = false;
};
WireStatus StatusToWire(const Status& status);
// Sets *out to the decoded Status (OK for code 0) and returns OK; or returns
// InvalidArgument, naming `field`, for an unknown code or an overlong message.
Status StatusFromWire(const WireStatus& wire, std::string_view field, Status* out);

}  // namespace orbitkv::protocol
