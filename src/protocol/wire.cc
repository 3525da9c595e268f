#include "protocol/wire.h"

#include <flatbuffers/flatbuffers.h>
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "protocol/orbitkv_generated.h"
#include "recovery/model_description.h"

namespace orbitkv::protocol {
namespace {

namespace fb = flatbuffers;
namespace w = orbitkv::wire;

// StatusCode and Tier values are on the wire: append only, never renumber.
static_assert(static_cast<int>(StatusCode::kOk) == 0);
static_assert(static_cast<int>(StatusCode::kInvalidArgument) == 1);
static_assert(static_cast<int>(StatusCode::kIOError) == 3);
static_assert(static_cast<int>(StatusCode::kNoSpace) == 4);
static_assert(static_cast<int>(StatusCode::kCancelled) == 7);
static_assert(static_cast<int>(StatusCode::kInternal) == 14);
constexpr uint8_t kMaxStatusCode = static_cast<uint8_t>(StatusCode::kInternal);
static_assert(static_cast<int>(Tier::kNone) == 0 && static_cast<int>(Tier::kDram) == 1 &&
              static_cast<int>(Tier::kSsd) == 2);
constexpr uint8_t kMaxTier = static_cast<uint8_t>(Tier::kSsd);
static_assert(sizeof(BlockKey) == 32 && alignof(BlockKey) == 1);
static_assert(sizeof(w::IpcHandle) == kIpcHandleBytes && alignof(w::IpcHandle) == 1);
static_assert(sizeof(decltype(RegisterRequest::ipc_handles)::value_type) == kIpcHandleBytes);
static_assert(w::Body_MAX == std::variant_size_v<Message>,
              "every Body union member has a Message alternative");

// The Body union member of each Message alternative: Body_X == index + 1.
template <typename T, size_t I = 0>
constexpr size_t MessageIndex() {
  if constexpr (std::is_same_v<std::variant_alternative_t<I, Message>, T>) {
    return I;
  } else {
    return MessageIndex<T, I + 1>();
  }
}
template <typename T>
constexpr w::Body BodyOf() {
  return static_cast<w::Body>(MessageIndex<T>() + 1);
}
static_assert(BodyOf<HelloRequest>() == w::Body_Hello);
static_assert(BodyOf<RegisterRequest>() == w::Body_RegisterInstance);
static_assert(BodyOf<RestoreResult>() == w::Body_RestoreReply);
static_assert(BodyOf<CancelRestoreReply>() == w::Body_CancelReply);
static_assert(BodyOf<ErrorReply>() == w::Body_ErrorReply);

// ---- encoding -----------------------------------------------------------------

template <typename T, typename BodyT>
std::vector<uint8_t> Finish(fb::FlatBufferBuilder& fbb, uint64_t id, fb::Offset<BodyT> body) {
  auto env = w::CreateEnvelope(fbb, kProtocolVersion, id, BodyOf<T>(), body.Union());
  w::FinishEnvelopeBuffer(fbb, env);
  const uint8_t* p = fbb.GetBufferPointer();
  return std::vector<uint8_t>(p, p + fbb.GetSize());
}

fb::Offset<fb::Vector<uint8_t>> KeysVector(fb::FlatBufferBuilder& fbb,
                                           const std::vector<BlockKey>& keys) {
  // BlockKey is std::array<uint8_t, 32>: a vector of them is 32 * n contiguous bytes.
  return fbb.CreateVector(reinterpret_cast<const uint8_t*>(keys.data()), keys.size() * 32);
}

std::string_view Truncated(std::string_view s) {
  return s.size() > kMaxStringBytes ? s.substr(0, kMaxStringBytes) : s;
}

// `s` for an error message: at most 64 bytes, non-printable bytes as \xNN (a
// hostile device string must not make the message invalid UTF-8).
// ---- decoding helpers ---------------------------------------------------------

Status Invalid(std::string_view field, std::string_view what) {
  return Status::InvalidArgument(fmt::format("{}: {}", field, what));
}

template <typename V>
Status CheckCount(const V* v, size_t max, std::string_view field) {
  if (v != nullptr && v->size() > max) {
    return Invalid(field, fmt::format("{} entries, more than the limit {}", v->size(), max));
  }
  return Status::OK();
}

Status GetString(const fb::String* s, std::string_view field, std::string* out) {
  if (s == nullptr) {
    out->clear();
    return Status::OK();
  }
  if (s->size() > kMaxStringBytes) {
    return Invalid(field,
                   fmt::format("{} bytes, longer than the limit {}", s->size(), kMaxStringBytes));
  }
  out->assign(s->data(), s->size());
  return Status::OK();
}

template <typename T>
Status GetScalars(const fb::Vector<T>* v, size_t max, std::string_view field, std::vector<T>* out) {
  ORBITKV_RETURN_IF_ERROR(CheckCount(v, max, field));
  out->clear();
  if (v == nullptr) return Status::OK();
  // FlatBuffers 2.0.8's verifier checks a vector's 4-byte length prefix, not
  // the alignment of 8-byte elements (found by fuzz/protocol_fuzz.cc). Every
  // builder aligns them, so a misaligned one is hostile. The buffer start is
  // 8-aligned (Align below), so the address tells the offset's alignment.
  // Empty vectors are exempt: the builder does not align them (and nothing is
  // read from them).
  if (v->size() > 0 && reinterpret_cast<uintptr_t>(v->Data()) % alignof(T) != 0) {
    return Invalid(field, fmt::format("elements not {}-byte aligned", alignof(T)));
  }
  out->reserve(v->size());
  for (fb::uoffset_t i = 0; i < v->size(); ++i) out->push_back(v->Get(i));
  return Status::OK();
}

Status GetKeys(const fb::Vector<uint8_t>* v, std::string_view field, std::vector<BlockKey>* out) {
  out->clear();
  if (v == nullptr) return Status::OK();
  if (v->size() % 32 != 0) {
    return Invalid(field, fmt::format("{} bytes, not a multiple of 32", v->size()));
  }
  const size_t n = v->size() / 32;
  if (n > kMaxKeysPerMessage) {
    return Invalid(field, fmt::format("{} keys, more than the limit {}", n, kMaxKeysPerMessage));
  }
  // One pass over the bytes (a resize would zero them first): BlockKey is 32
  // bytes with alignment 1, so the vector's bytes are n keys in order.
  const auto* first = reinterpret_cast<const BlockKey*>(v->data());
  out->assign(first, first + n);
  return Status::OK();
}

Status CheckSameCount(size_t a, std::string_view field_a, size_t b, std::string_view field_b) {
  if (a != b) {
    return Invalid(field_b, fmt::format("{} entries, but {} has {}", b, field_a, a));
  }
  return Status::OK();
}

Status GetTier(uint8_t v, std::string_view field, Tier* out) {
  if (v > kMaxTier) return Invalid(field, fmt::format("unknown tier {}", v));
  *out = static_cast<Tier>(v);
  return Status::OK();
}

// ---- per-body decoders ------------------------------------------------------------
// Each takes a verified, non-null table.

Status Decode(const w::Hello& t, HelloRequest* m) {
  m->protocol_version = t.protocol_version();
  m->client_pid = t.client_pid();
  return GetString(t.client_name(), "Hello.client_name", &m->client_name);
}

Status Decode(const w::HelloReply& t, HelloReply* m) {
  m->protocol_version = t.protocol_version();
  m->server_pid = t.server_pid();
  m->max_frame_bytes = t.max_frame_bytes();
  m->max_fds_per_frame = t.max_fds_per_frame();
  m->max_keys_per_message = t.max_keys_per_message();
  m->max_connections = t.max_connections();
  return Status::OK();
}

Status DecodeGroup(const w::Group& g, size_t gi, GroupLayout* out) {
  out->group_id = g.group_id();
  out->num_slots = g.num_slots();
  const std::string field = fmt::format("RegisterInstance.layout.groups[{}]", gi);
  ORBITKV_RETURN_IF_ERROR(
      GetScalars(g.slot_bytes(), kMaxSlotsPerGroup, field + ".slot_bytes", &out->slot_bytes));
  ORBITKV_RETURN_IF_ERROR(CheckCount(g.slots(), kMaxSlotsPerGroup, field + ".slots"));
  out->slots.clear();
  if (g.slots() == nullptr) return Status::OK();
  out->slots.reserve(g.slots()->size());
  for (fb::uoffset_t i = 0; i < g.slots()->size(); ++i) {
    const w::Slot* s = g.slots()->Get(i);
    if (s == nullptr) return Invalid(fmt::format("{}.slots[{}]", field, i), "missing");
    SlotLayout sl;
    sl.slot_id = s->slot_id();
    sl.region = s->region();
    sl.offset = s->offset();
    sl.page_stride = s->page_stride();
    sl.bytes_per_page = s->bytes_per_page();
    out->slots.push_back(sl);
  }
  return Status::OK();
}

Status DecodeLayout(const w::Layout* l, RegisterRequest* m) {
  if (l == nullptr) return Invalid("RegisterInstance.layout", "missing");
  m->layout.num_pages = l->num_pages();
  ORBITKV_RETURN_IF_ERROR(GetScalars(l->region_bytes(), kMaxRegions,
                                     "RegisterInstance.layout.region_bytes",
                                     &m->layout.region_bytes));
  ORBITKV_RETURN_IF_ERROR(CheckCount(l->groups(), kMaxGroups, "RegisterInstance.layout.groups"));
  m->layout.groups.clear();
  if (l->groups() == nullptr) return Status::OK();
  m->layout.groups.resize(l->groups()->size());
  for (fb::uoffset_t i = 0; i < l->groups()->size(); ++i) {
    const w::Group* g = l->groups()->Get(i);
    if (g == nullptr) {
      return Invalid(fmt::format("RegisterInstance.layout.groups[{}]", i), "missing");
    }
    ORBITKV_RETURN_IF_ERROR(DecodeGroup(*g, i, &m->layout.groups[i]));
  }
  return Status::OK();
}

Status GetIpcHandles(const fb::Vector<const w::IpcHandle*>* v, RegisterRequest* m) {
  // The verifier has bounded the vector to n * 64 bytes inside the buffer.
  ORBITKV_RETURN_IF_ERROR(CheckCount(v, kMaxIpcHandles, "RegisterInstance.ipc_handles"));
  m->ipc_handles.clear();
  if (v == nullptr || v->size() == 0) return Status::OK();
  m->ipc_handles.resize(v->size());
  std::memcpy(m->ipc_handles.data(), v->Data(), size_t{v->size()} * kIpcHandleBytes);
  return Status::OK();
}

// How the regions travel follows the device: memfds for "host" (checked
// against the frame by CheckAttachedFds), one IPC handle each for "cuda:N".
Status CheckDeviceRegions(const RegisterRequest& m) {
  ORBITKV_ASSIGN_OR_RETURN(DeviceSpec dev, ParseDevice(m.device, "RegisterInstance.device"));
  const size_t regions = m.layout.region_bytes.size();
  if (!dev.cuda && !m.ipc_handles.empty()) {
    return Invalid("RegisterInstance.ipc_handles",
                   fmt::format("{} handles for device \"host\" (host regions travel as memfds; "
                               "IPC handles are for \"cuda:N\")",
                               m.ipc_handles.size()));
  }
  if (dev.cuda && m.ipc_handles.size() != regions) {
    return Invalid("RegisterInstance.ipc_handles",
                   fmt::format("{} handles for the {} regions of device \"{}\" (want one "
                               "cudaIpcMemHandle per layout region)",
                               m.ipc_handles.size(), regions, m.device));
  }
  return Status::OK();
}

// Shape here (counts, strings); meaning in ValidateModelDescription, which
// names the field under "RegisterInstance.model".
Status DecodeModel(const w::ModelDescription* t, RegisterRequest* m) {
  m->model.reset();
  if (t == nullptr) return Status::OK();
  constexpr std::string_view kField = "RegisterInstance.model";
  ModelDescription d;
  d.key_block_tokens = t->key_block_tokens();
  ORBITKV_RETURN_IF_ERROR(
      CheckCount(t->groups(), kMaxModelGroups, "RegisterInstance.model.groups"));
  if (t->groups() != nullptr) {
    d.groups.resize(t->groups()->size());
    for (fb::uoffset_t i = 0; i < t->groups()->size(); ++i) {
      const std::string field = fmt::format("{}.groups[{}]", kField, i);
      const w::ModelGroup* g = t->groups()->Get(i);
      if (g == nullptr) return Invalid(field, "missing");
      GroupDescription& o = d.groups[i];
      ORBITKV_RETURN_IF_ERROR(GetString(g->name(), field + ".name", &o.name));
      o.kind = static_cast<GroupKind>(g->kind());
      o.storage_group = g->storage_group();
      o.block_tokens = g->block_tokens();
      o.bytes = g->bytes();
      o.window_tokens = g->window_tokens();
      o.checkpoint_interval_tokens = g->checkpoint_interval_tokens();
      ORBITKV_RETURN_IF_ERROR(GetScalars(g->checkpoint_positions(), kMaxCheckpointPositions,
                                         field + ".checkpoint_positions", &o.checkpoint_positions));
    }
  }
  ORBITKV_RETURN_IF_ERROR(recovery::ValidateModelDescription(d, kField));
  m->model = std::move(d);
  return Status::OK();
}

// Shape here (short names, a bounded head_dim); meaning in the Manager
// (manager/storage_codec.h), which refuses unknown names and lossy codecs
// without a dtype and head_dim.
Status DecodeStorageCodec(const w::StorageCodec* t, RegisterRequest* m) {
  m->storage = {};
  if (t == nullptr) return Status::OK();
  StorageCodecRequest& o = m->storage;
  ORBITKV_RETURN_IF_ERROR(GetString(t->codec(), "RegisterInstance.storage.codec", &o.codec));
  ORBITKV_RETURN_IF_ERROR(GetString(t->dtype(), "RegisterInstance.storage.dtype", &o.dtype));
  for (auto [field, v] : {std::pair{"RegisterInstance.storage.codec", &o.codec},
                          std::pair{"RegisterInstance.storage.dtype", &o.dtype}}) {
    if (v->size() > kMaxCodecNameBytes) {
      return Invalid(
          field, fmt::format("{} bytes, longer than the limit {}", v->size(), kMaxCodecNameBytes));
    }
  }
  o.head_dim = t->head_dim();
  if (o.head_dim > kMaxCodecHeadDim) {
    return Invalid("RegisterInstance.storage.head_dim",
                   fmt::format("{} is more than the limit {}", o.head_dim, kMaxCodecHeadDim));
  }
  return Status::OK();
}

Status Decode(const w::RegisterInstance& t, RegisterRequest* m) {
  ORBITKV_RETURN_IF_ERROR(GetString(t.ns(), "RegisterInstance.ns", &m->ns));
  m->rank = t.rank();
  ORBITKV_RETURN_IF_ERROR(GetString(t.device(), "RegisterInstance.device", &m->device));
  ORBITKV_RETURN_IF_ERROR(DecodeLayout(t.layout(), m));
  ORBITKV_RETURN_IF_ERROR(GetIpcHandles(t.ipc_handles(), m));
  ORBITKV_RETURN_IF_ERROR(DecodeModel(t.model(), m));
  ORBITKV_RETURN_IF_ERROR(DecodeStorageCodec(t.storage(), m));
  return CheckDeviceRegions(*m);
}

Status Decode(const w::RegisterReply& t, RegisterReply* m) {
  m->instance = t.instance();
  return Status::OK();
}

Status Decode(const w::Publish& t, PublishRequest* m) {
  m->instance = t.instance();
  m->group_id = t.group_id();
  ORBITKV_RETURN_IF_ERROR(GetKeys(t.keys(), "Publish.keys", &m->keys));
  ORBITKV_RETURN_IF_ERROR(GetScalars(t.pages(), kMaxKeysPerMessage, "Publish.pages", &m->pages));
  ORBITKV_RETURN_IF_ERROR(
      CheckSameCount(m->keys.size(), "Publish.keys", m->pages.size(), "Publish.pages"));
  return GetScalars(t.slot_ids(), kMaxSlotsPerGroup, "Publish.slot_ids", &m->slot_ids);
}

Status Decode(const w::PublishReply& t, PublishResult* m) {
  m->stored = t.stored();
  m->sealed = t.sealed();
  m->skipped = t.skipped();
  m->dropped = t.dropped();
  return Status::OK();
}

Status Decode(const w::Query& t, QueryRequest* m) {
  m->instance = t.instance();
  m->group_id = t.group_id();
  m->ttl_ms = t.ttl_ms();
  return GetKeys(t.keys(), "Query.keys", &m->keys);
}

// A hybrid query's plan: absent (dense), or one piece per source with the
// same tier, within the limits of its fields.
Status DecodePieces(const w::QueryReply& t, QueryResult* m) {
  static_assert(kMaxQuerySources == kMaxKeysPerMessage);
  m->prefix_tokens = t.prefix_tokens();
  m->not_needed_bytes = t.not_needed_bytes();
  m->pieces.clear();
  if (t.pieces() == nullptr) return Status::OK();
  const size_t n = t.pieces()->size();
  ORBITKV_RETURN_IF_ERROR(
      CheckSameCount(m->sources.size(), "QueryReply.sources", n, "QueryReply.pieces"));
  if (m->prefix_tokens > kMaxSequenceTokens) {
    return Invalid("QueryReply.prefix_tokens",
                   fmt::format("{}, more than the limit {}", m->prefix_tokens, kMaxSequenceTokens));
  }
  m->pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const w::QuerySource* p = t.pieces()->Get(static_cast<fb::uoffset_t>(i));
    QuerySource& q = m->pieces[i];
    const std::string field = fmt::format("QueryReply.pieces[{}]", i);
    if (p->group() >= kMaxModelGroups || p->storage_group() >= kMaxGroups) {
      return Invalid(field, fmt::format("group {} / storage group {}, limits {} and {}", p->group(),
                                        p->storage_group(), kMaxModelGroups, kMaxGroups));
    }
    if (p->bytes() == 0 || p->bytes() > kMaxPieceBytes) {
      return Invalid(field + ".bytes",
                     fmt::format("{}, outside [1, {}]", p->bytes(), kMaxPieceBytes));
    }
    ORBITKV_RETURN_IF_ERROR(GetTier(p->tier(), field + ".tier", &q.tier));
    if (q.tier != m->sources[i]) {
      return Invalid(field + ".tier", "differs from QueryReply.sources[" + std::to_string(i) + "]");
    }
    q.group = p->group();
    q.storage_group = p->storage_group();
    q.index = p->index();
    q.bytes = p->bytes();
  }
  return Status::OK();
}

Status Decode(const w::QueryReply& t, QueryResult* m) {
  m->query = t.query();
  m->prefix = t.prefix();
  m->logical_bytes = t.logical_bytes();
  m->budget_limited = t.budget_limited();
  if (m->prefix > kMaxKeysPerMessage) {
    return Invalid("QueryReply.prefix",
                   fmt::format("{}, more than the limit {}", m->prefix, kMaxKeysPerMessage));
  }
  ORBITKV_RETURN_IF_ERROR(CheckCount(t.sources(), kMaxKeysPerMessage, "QueryReply.sources"));
  const size_t n = t.sources() ? t.sources()->size() : 0;
  ORBITKV_RETURN_IF_ERROR(CheckSameCount(m->prefix, "QueryReply.prefix", n, "QueryReply.sources"));
  m->sources.resize(n);
  for (size_t i = 0; i < n; ++i) {
    ORBITKV_RETURN_IF_ERROR(GetTier(t.sources()->Get(static_cast<fb::uoffset_t>(i)),
                                    "QueryReply.sources", &m->sources[i]));
  }
  return DecodePieces(t, m);
}

Status Decode(const w::Restore& t, RestoreRequest* m) {
  m->instance = t.instance();
  m->query = t.query();
  ORBITKV_RETURN_IF_ERROR(GetScalars(t.blocks(), kMaxKeysPerMessage, "Restore.blocks", &m->blocks));
  ORBITKV_RETURN_IF_ERROR(GetScalars(t.pages(), kMaxKeysPerMessage, "Restore.pages", &m->pages));
  m->want_timeline = t.want_timeline();
  return CheckSameCount(m->blocks.size(), "Restore.blocks", m->pages.size(), "Restore.pages");
}

// Every stage is -1 (absent) or within [0, done_ns], and done_ns is set.
Status DecodeTimeline(const w::RestoreTimeline& t, RestoreTimeline* m) {
  constexpr std::string_view kField = "RestoreReply.timeline";
  m->source_ready_ns = t.source_ready_ns();
  m->io_submitted_ns = t.io_submitted_ns();
  m->io_complete_ns = t.io_complete_ns();
  m->copy_complete_ns = t.copy_complete_ns();
  m->done_ns = t.done_ns();
  if (m->done_ns < 0) return Invalid(kField, fmt::format("done_ns {} is negative", m->done_ns));
  const std::pair<const char*, int64_t> stages[] = {{"source_ready_ns", m->source_ready_ns},
                                                    {"io_submitted_ns", m->io_submitted_ns},
                                                    {"io_complete_ns", m->io_complete_ns},
                                                    {"copy_complete_ns", m->copy_complete_ns}};
  for (const auto& [name, v] : stages) {
    if (v < -1 || v > m->done_ns) {
      return Invalid(kField, fmt::format("{} {} is outside [-1, done_ns {}]", name, v, m->done_ns));
    }
  }
  return Status::OK();
}

Status Decode(const w::RestoreReply& t, RestoreResult* m) {
  ORBITKV_RETURN_IF_ERROR(CheckCount(t.blocks(), kMaxKeysPerMessage, "RestoreReply.blocks"));
  m->timeline.reset();
  if (t.timeline() != nullptr) {
    RestoreTimeline tl;
    ORBITKV_RETURN_IF_ERROR(DecodeTimeline(*t.timeline(), &tl));
    m->timeline = tl;
  }
  m->blocks.clear();
  if (t.blocks() == nullptr) return Status::OK();
  m->blocks.resize(t.blocks()->size());
  for (fb::uoffset_t i = 0; i < t.blocks()->size(); ++i) {
    const w::BlockResult* b = t.blocks()->Get(i);
    const std::string field = fmt::format("RestoreReply.blocks[{}]", i);
    if (b == nullptr) return Invalid(field, "missing");
    BlockResult& out = m->blocks[i];
    out.block = b->block();
    ORBITKV_RETURN_IF_ERROR(GetTier(b->source(), field + ".source", &out.source));
    WireStatus ws;
    ws.code = b->code();
    ws.err_no = b->err_no();
    ws.data_loss = b->data_loss();
    ORBITKV_RETURN_IF_ERROR(GetString(b->message(), field + ".message", &ws.message));
    ORBITKV_RETURN_IF_ERROR(StatusFromWire(ws, field, &out.status));
  }
  return Status::OK();
}

Status Decode(const w::CancelRestore& t, CancelRestoreRequest* m) {
  m->restore_id = t.restore_id();
  return Status::OK();
}

Status Decode(const w::CancelReply& t, CancelRestoreReply* m) {
  m->cancelled = t.cancelled();
  return Status::OK();
}

Status Decode(const w::Prepare& t, PrepareRequest* m) {
  m->instance = t.instance();
  m->group_id = t.group_id();
  return GetKeys(t.keys(), "Prepare.keys", &m->keys);
}

Status Decode(const w::PrepareReply& t, PrepareReply* m) {
  m->queued = t.queued();
  m->skipped = t.skipped();
  return Status::OK();
}

Status Decode(const w::Unregister& t, UnregisterRequest* m) {
  m->instance = t.instance();
  return Status::OK();
}

Status Decode(const w::UnregisterReply&, UnregisterReply*) { return Status::OK(); }

Status Decode(const w::ReleaseQuery& t, ReleaseQueryRequest* m) {
  m->instance = t.instance();
  m->query = t.query();
  return Status::OK();
}

Status Decode(const w::ReleaseQueryReply&, ReleaseQueryReply*) { return Status::OK(); }

Status Decode(const w::ClearNamespace& t, ClearNamespaceRequest* m) {
  m->instance = t.instance();
  return Status::OK();
}

Status Decode(const w::ClearNamespaceReply& t, ClearNamespaceResult* m) {
  m->dram_objects = t.dram_objects();
  m->ssd_objects = t.ssd_objects();
  return Status::OK();
}

Status Decode(const w::ErrorReply& t, ErrorReply* m) {
  WireStatus ws;
  ws.code = t.code();
  ws.err_no = t.err_no();
  ws.data_loss = t.data_loss();
  ORBITKV_RETURN_IF_ERROR(GetString(t.message(), "ErrorReply.message", &ws.message));
  if (ws.code == 0) return Invalid("ErrorReply.code", "0 (OK) in an error reply");
  return StatusFromWire(ws, "ErrorReply", &m->status);
}

// Decodes the body of type T (a Message alternative) from its wire table W.
template <typename T, typename W>
Status DecodeBody(const w::Envelope& env, std::string_view name, Message* out) {
  const W* table = env.body_as<W>();
  if (table == nullptr) return Invalid(fmt::format("Envelope.body ({})", name), "missing");
  T m;
  ORBITKV_RETURN_IF_ERROR(Decode(*table, &m));
  *out = std::move(m);
  return Status::OK();
}

// An aligned copy of `bytes` when they are not 8-aligned: FlatBuffers reads
// scalars in place, and the verifier checks alignment relative to the start.
struct AlignedView {
  std::span<const uint8_t> bytes;
  std::unique_ptr<uint64_t[]> copy;
};
AlignedView Align(std::span<const uint8_t> bytes) {
  AlignedView v;
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint64_t) == 0) {
    v.bytes = bytes;
    return v;
  }
  v.copy = std::make_unique<uint64_t[]>((bytes.size() + 7) / 8);
  std::memcpy(v.copy.get(), bytes.data(), bytes.size());
  v.bytes = {reinterpret_cast<const uint8_t*>(v.copy.get()), bytes.size()};
  return v;
}

}  // namespace

std::string_view MessageName(const Message& body) { return MessageName(body.index()); }

std::string_view MessageName(size_t index) {
  return w::EnumNameBody(static_cast<w::Body>(index + 1));
}

// ---- encoders ---------------------------------------------------------------------

std::vector<uint8_t> EncodeRequest(uint64_t id, const HelloRequest& m) {
  fb::FlatBufferBuilder fbb(128);
  auto name = fbb.CreateString(m.client_name);
  return Finish<HelloRequest>(fbb, id, w::CreateHello(fbb, m.protocol_version, m.client_pid, name));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const RegisterRequest& m) {
  fb::FlatBufferBuilder fbb(1024);
  auto ns = fbb.CreateString(m.ns);
  auto device = fbb.CreateString(m.device);
  auto region_bytes = fbb.CreateVector(m.layout.region_bytes);
  std::vector<fb::Offset<w::Group>> groups;
  groups.reserve(m.layout.groups.size());
  for (const GroupLayout& g : m.layout.groups) {
    auto slot_bytes = fbb.CreateVector(g.slot_bytes);
    std::vector<fb::Offset<w::Slot>> slots;
    slots.reserve(g.slots.size());
    for (const SlotLayout& s : g.slots) {
      slots.push_back(
          w::CreateSlot(fbb, s.slot_id, s.region, s.offset, s.page_stride, s.bytes_per_page));
    }
    auto slots_vec = fbb.CreateVector(slots);
    groups.push_back(w::CreateGroup(fbb, g.group_id, g.num_slots, slot_bytes, slots_vec));
  }
  auto groups_vec = fbb.CreateVector(groups);
  auto layout = w::CreateLayout(fbb, m.layout.num_pages, region_bytes, groups_vec);
  // Absent, not empty, without handles: a host register is the bytes it was
  // before the field existed.
  fb::Offset<fb::Vector<const w::IpcHandle*>> handles;
  if (!m.ipc_handles.empty()) {
    w::IpcHandle* out = nullptr;
    handles = fbb.CreateUninitializedVectorOfStructs(m.ipc_handles.size(), &out);
    std::memcpy(static_cast<void*>(out), m.ipc_handles.data(),
                m.ipc_handles.size() * kIpcHandleBytes);
  }
  // Absent for a dense model, as before the field existed.
  fb::Offset<w::ModelDescription> model;
  if (m.model) {
    std::vector<fb::Offset<w::ModelGroup>> mgroups;
    mgroups.reserve(m.model->groups.size());
    for (const GroupDescription& g : m.model->groups) {
      auto name = fbb.CreateString(g.name);
      fb::Offset<fb::Vector<uint64_t>> positions;
      if (!g.checkpoint_positions.empty()) positions = fbb.CreateVector(g.checkpoint_positions);
      mgroups.push_back(w::CreateModelGroup(
          fbb, name, static_cast<uint8_t>(g.kind), g.storage_group, g.block_tokens, g.bytes,
          g.window_tokens, g.checkpoint_interval_tokens, positions));
    }
    model = w::CreateModelDescription(fbb, m.model->key_block_tokens, fbb.CreateVector(mgroups));
  }
  // Absent for the Manager's default, as before the field existed.
  fb::Offset<w::StorageCodec> storage;
  if (m.storage != StorageCodecRequest{}) {
    auto codec = fbb.CreateString(m.storage.codec);
    auto dtype = fbb.CreateString(m.storage.dtype);
    storage = w::CreateStorageCodec(fbb, codec, dtype, m.storage.head_dim);
  }
  return Finish<RegisterRequest>(
      fbb, id, w::CreateRegisterInstance(fbb, ns, m.rank, device, layout, handles, model, storage));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const PublishRequest& m) {
  fb::FlatBufferBuilder fbb(64 + m.keys.size() * 40 + m.slot_ids.size() * 4);
  auto keys = KeysVector(fbb, m.keys);
  auto pages = fbb.CreateVector(m.pages);
  auto slot_ids = fbb.CreateVector(m.slot_ids);
  return Finish<PublishRequest>(
      fbb, id, w::CreatePublish(fbb, m.instance, m.group_id, keys, pages, slot_ids));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const QueryRequest& m) {
  fb::FlatBufferBuilder fbb(64 + m.keys.size() * 32);
  auto keys = KeysVector(fbb, m.keys);
  return Finish<QueryRequest>(fbb, id, w::CreateQuery(fbb, m.instance, m.group_id, keys, m.ttl_ms));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const RestoreRequest& m) {
  fb::FlatBufferBuilder fbb(64 + m.blocks.size() * 12);
  auto blocks = fbb.CreateVector(m.blocks);
  auto pages = fbb.CreateVector(m.pages);
  return Finish<RestoreRequest>(
      fbb, id, w::CreateRestore(fbb, m.instance, m.query, blocks, pages, m.want_timeline));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const CancelRestoreRequest& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<CancelRestoreRequest>(fbb, id, w::CreateCancelRestore(fbb, m.restore_id));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const PrepareRequest& m) {
  fb::FlatBufferBuilder fbb(64 + m.keys.size() * 32);
  auto keys = KeysVector(fbb, m.keys);
  return Finish<PrepareRequest>(fbb, id, w::CreatePrepare(fbb, m.instance, m.group_id, keys));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const UnregisterRequest& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<UnregisterRequest>(fbb, id, w::CreateUnregister(fbb, m.instance));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const HelloReply& m) {
  fb::FlatBufferBuilder fbb(96);
  return Finish<HelloReply>(
      fbb, id,
      w::CreateHelloReply(fbb, m.protocol_version, m.server_pid, m.max_frame_bytes,
                          m.max_fds_per_frame, m.max_keys_per_message, m.max_connections));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const RegisterReply& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<RegisterReply>(fbb, id, w::CreateRegisterReply(fbb, m.instance));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const PublishResult& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<PublishResult>(
      fbb, id, w::CreatePublishReply(fbb, m.stored, m.sealed, m.skipped, m.dropped));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const QueryResult& m) {
  fb::FlatBufferBuilder fbb(96 + m.sources.size() + m.pieces.size() * sizeof(w::QuerySource));
  static_assert(sizeof(Tier) == 1);
  auto sources =
      fbb.CreateVector(reinterpret_cast<const uint8_t*>(m.sources.data()), m.sources.size());
  fb::Offset<fb::Vector<const w::QuerySource*>> pieces;  // absent for a dense query
  if (!m.pieces.empty()) {
    std::vector<w::QuerySource> v;
    v.reserve(m.pieces.size());
    for (const QuerySource& p : m.pieces) {
      v.emplace_back(p.index, p.bytes, p.group, p.storage_group, static_cast<uint8_t>(p.tier));
    }
    pieces = fbb.CreateVectorOfStructs(v);
  }
  return Finish<QueryResult>(
      fbb, id,
      w::CreateQueryReply(fbb, m.query, m.prefix, sources, m.logical_bytes, m.budget_limited,
                          m.prefix_tokens, pieces, m.not_needed_bytes));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const RestoreResult& m) {
  fb::FlatBufferBuilder fbb(64 + m.blocks.size() * 32);
  std::vector<fb::Offset<w::BlockResult>> blocks;
  blocks.reserve(m.blocks.size());
  for (const BlockResult& b : m.blocks) {
    WireStatus ws = StatusToWire(b.status);
    auto msg = ws.message.empty() ? fb::Offset<fb::String>() : fbb.CreateString(ws.message);
    blocks.push_back(w::CreateBlockResult(fbb, b.block, static_cast<uint8_t>(b.source), ws.code,
                                          msg, ws.err_no, ws.data_loss));
  }
  auto vec = fbb.CreateVector(blocks);
  fb::Offset<w::RestoreTimeline> timeline;
  if (m.timeline) {
    const RestoreTimeline& t = *m.timeline;
    timeline = w::CreateRestoreTimeline(fbb, t.source_ready_ns, t.io_submitted_ns, t.io_complete_ns,
                                        t.copy_complete_ns, t.done_ns);
  }
  return Finish<RestoreResult>(fbb, id, w::CreateRestoreReply(fbb, vec, timeline));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const CancelRestoreReply& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<CancelRestoreReply>(fbb, id, w::CreateCancelReply(fbb, m.cancelled));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const PrepareReply& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<PrepareReply>(fbb, id, w::CreatePrepareReply(fbb, m.queued, m.skipped));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const ReleaseQueryRequest& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<ReleaseQueryRequest>(fbb, id, w::CreateReleaseQuery(fbb, m.instance, m.query));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const ReleaseQueryReply&) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<ReleaseQueryReply>(fbb, id, w::CreateReleaseQueryReply(fbb));
}

std::vector<uint8_t> EncodeRequest(uint64_t id, const ClearNamespaceRequest& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<ClearNamespaceRequest>(fbb, id, w::CreateClearNamespace(fbb, m.instance));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const ClearNamespaceResult& m) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<ClearNamespaceResult>(
      fbb, id, w::CreateClearNamespaceReply(fbb, m.dram_objects, m.ssd_objects));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const UnregisterReply&) {
  fb::FlatBufferBuilder fbb(64);
  return Finish<UnregisterReply>(fbb, id, w::CreateUnregisterReply(fbb));
}

std::vector<uint8_t> EncodeReply(uint64_t id, const ErrorReply& m) {
  fb::FlatBufferBuilder fbb(128);
  WireStatus ws = m.status.ok() ? StatusToWire(Status::Internal("ErrorReply with an OK status"))
                                : StatusToWire(m.status);
  auto msg = fbb.CreateString(ws.message);
  return Finish<ErrorReply>(fbb, id,
                            w::CreateErrorReply(fbb, ws.code, msg, ws.err_no, ws.data_loss));
}

std::vector<uint8_t> EncodeError(uint64_t id, const Status& status) {
  return EncodeReply(id, ErrorReply{status});
}

std::vector<uint8_t> EncodeMessage(uint64_t id, const Message& body) {
  return std::visit(
      [id](const auto& m) -> std::vector<uint8_t> {
        if constexpr (requires { EncodeRequest(id, m); }) {
          return EncodeRequest(id, m);
        } else {
          return EncodeReply(id, m);
        }
      },
      body);
}

// ---- decoding ------------------------------------------------------------------------

Result<DecodedMessage> DecodeMessage(std::span<const uint8_t> input) {
  if (input.size() > kMaxMessageBytes) {
    return Invalid("Envelope",
                   fmt::format("{} bytes, more than the limit {}", input.size(), kMaxMessageBytes));
  }
  const AlignedView view = Align(input);
  fb::Verifier::Options opts;
  opts.max_depth = kVerifierMaxDepth;
  opts.max_tables = kVerifierMaxTables;
  opts.check_alignment = true;
  opts.check_nested_flatbuffers = true;
  fb::Verifier verifier(view.bytes.data(), view.bytes.size(), opts);
  if (!w::VerifyEnvelopeBuffer(verifier)) {
    return Invalid("Envelope",
                   fmt::format("{} bytes that do not verify as an OrbitKV message", input.size()));
  }
  const w::Envelope* env = w::GetEnvelope(view.bytes.data());
  if (env->version() != kProtocolVersion) {
    return Invalid("Envelope.version", fmt::format("{} is not supported (this side speaks {})",
                                                   env->version(), kProtocolVersion));
  }
  DecodedMessage out{env->version(), env->id(), UnregisterReply{}};
  Status st;
  switch (env->body_type()) {
    case w::Body_NONE:
      return Invalid("Envelope.body", "missing");
    case w::Body_Hello:
      st = DecodeBody<HelloRequest, w::Hello>(*env, "Hello", &out.body);
      break;
    case w::Body_HelloReply:
      st = DecodeBody<HelloReply, w::HelloReply>(*env, "HelloReply", &out.body);
      break;
    case w::Body_RegisterInstance:
      st = DecodeBody<RegisterRequest, w::RegisterInstance>(*env, "RegisterInstance", &out.body);
      break;
    case w::Body_RegisterReply:
      st = DecodeBody<RegisterReply, w::RegisterReply>(*env, "RegisterReply", &out.body);
      break;
    case w::Body_Publish:
      st = DecodeBody<PublishRequest, w::Publish>(*env, "Publish", &out.body);
      break;
    case w::Body_PublishReply:
      st = DecodeBody<PublishResult, w::PublishReply>(*env, "PublishReply", &out.body);
      break;
    case w::Body_Query:
      st = DecodeBody<QueryRequest, w::Query>(*env, "Query", &out.body);
      break;
    case w::Body_QueryReply:
      st = DecodeBody<QueryResult, w::QueryReply>(*env, "QueryReply", &out.body);
      break;
    case w::Body_Restore:
      st = DecodeBody<RestoreRequest, w::Restore>(*env, "Restore", &out.body);
      break;
    case w::Body_RestoreReply:
      st = DecodeBody<RestoreResult, w::RestoreReply>(*env, "RestoreReply", &out.body);
      break;
    case w::Body_CancelRestore:
      st = DecodeBody<CancelRestoreRequest, w::CancelRestore>(*env, "CancelRestore", &out.body);
      break;
    case w::Body_CancelReply:
      st = DecodeBody<CancelRestoreReply, w::CancelReply>(*env, "CancelReply", &out.body);
      break;
    case w::Body_Prepare:
      st = DecodeBody<PrepareRequest, w::Prepare>(*env, "Prepare", &out.body);
      break;
    case w::Body_PrepareReply:
      st = DecodeBody<PrepareReply, w::PrepareReply>(*env, "PrepareReply", &out.body);
      break;
    case w::Body_Unregister:
      st = DecodeBody<UnregisterRequest, w::Unregister>(*env, "Unregister", &out.body);
      break;
    case w::Body_UnregisterReply:
      st = DecodeBody<UnregisterReply, w::UnregisterReply>(*env, "UnregisterReply", &out.body);
      break;
    case w::Body_ErrorReply:
      st = DecodeBody<ErrorReply, w::ErrorReply>(*env, "ErrorReply", &out.body);
      break;
    case w::Body_ReleaseQuery:
      st = DecodeBody<ReleaseQueryRequest, w::ReleaseQuery>(*env, "ReleaseQuery", &out.body);
      break;
    case w::Body_ReleaseQueryReply:
      st =
          DecodeBody<ReleaseQueryReply, w::ReleaseQueryReply>(*env, "ReleaseQueryReply", &out.body);
      break;
    case w::Body_ClearNamespace:
      st = DecodeBody<ClearNamespaceRequest, w::ClearNamespace>(*env, "ClearNamespace", &out.body);
      break;
    case w::Body_ClearNamespaceReply:
      st = DecodeBody<ClearNamespaceResult, w::ClearNamespaceReply>(*env, "ClearNamespaceReply",
                                                                    &out.body);
      break;
    default:
      // The verifier accepts unknown union members (forward compatibility);
      // this version cannot act on them.
      return Invalid("Envelope.body_type",
                     fmt::format("unknown message type {}", static_cast<int>(env->body_type())));
  }
  if (!st.ok()) return st;
  return out;
}

std::optional<uint64_t> PeekEnvelopeId(std::span<const uint8_t> input) {
  if (input.size() > kMaxMessageBytes) return std::nullopt;
  const AlignedView view = Align(input);
  fb::Verifier verifier(view.bytes.data(), view.bytes.size(), fb::Verifier::Options{});
  // The prologue of Verifier::VerifyBuffer, then the envelope's own table only.
  constexpr size_t kMinBuffer =
      sizeof(fb::uoffset_t) + sizeof(fb::soffset_t) + sizeof(fb::voffset_t);  // as FlatBuffers
  if (view.bytes.size() < kMinBuffer ||
      !fb::BufferHasIdentifier(view.bytes.data(), w::EnvelopeIdentifier())) {
    return std::nullopt;
  }
  const fb::uoffset_t root = verifier.VerifyOffset(0);
  if (root == 0) return std::nullopt;
  // Envelope derives privately from Table; the root is a Table all the same.
  const auto* table = reinterpret_cast<const fb::Table*>(view.bytes.data() + root);
  if (!table->VerifyTableStart(verifier) ||
      !table->VerifyField<uint64_t>(verifier, w::Envelope::VT_ID, sizeof(uint64_t))) {
    return std::nullopt;
  }
  return table->GetField<uint64_t>(w::Envelope::VT_ID, 0);
}

Status CheckAttachedFds(const Message& body, size_t num_fds) {
  size_t want = 0;
  std::string_view what = "no file descriptors";
  if (const auto* reg = std::get_if<RegisterRequest>(&body); reg != nullptr) {
    if (reg->device == "host") {
      want = reg->layout.region_bytes.size();
      what = "one memfd per region";
    } else {
      what = "none for a CUDA device: its regions travel as ipc_handles";
    }
  }
  if (num_fds != want) {
    return Status::InvalidArgument(fmt::format("{}: {} file descriptors attached, want {} ({})",
                                               MessageName(body), num_fds, want, what));
  }
  return Status::OK();
}

// ---- Status ----------------------------------------------------------------------------

WireStatus StatusToWire(const Status& status) {
  WireStatus ws;
  ws.code = static_cast<uint8_t>(status.code());
  if (status.ok()) return ws;
  ws.message = std::string(Truncated(status.message()));
  ws.err_no = status.err_no();
  ws.data_loss = status.data_loss();
  return ws;
}

Status StatusFromWire(const WireStatus& wire, std::string_view field, Status* out) {
  if (wire.code > kMaxStatusCode) {
    return Invalid(fmt::format("{}.code", field), fmt::format("unknown status code {}", wire.code));
  }
  if (wire.message.size() > kMaxStringBytes) {
    return Invalid(
        fmt::format("{}.message", field),
        fmt::format("{} bytes, longer than the limit {}", wire.message.size(), kMaxStringBytes));
  }
  std::string msg = wire.message;
  switch (static_cast<StatusCode>(wire.code)) {
    case StatusCode::kOk:
      *out = Status::OK();
      break;
    case StatusCode::kInvalidArgument:
      *out = Status::InvalidArgument(std::move(msg));
      break;
    case StatusCode::kNotFound:
      *out = Status::NotFound(std::move(msg));
      break;
    case StatusCode::kIOError:
      *out = Status::IOError(std::move(msg), wire.err_no, wire.data_loss);
      break;
    case StatusCode::kNoSpace:
      *out =
          Status::IOError(std::move(msg), wire.err_no != 0 ? wire.err_no : ENOSPC, wire.data_loss);
      break;
    case StatusCode::kBusy:
      *out = Status::Busy(std::move(msg));
      break;
    case StatusCode::kUnavailable:
      *out = Status::Unavailable(std::move(msg));
      break;
    case StatusCode::kCancelled:
      *out = Status::Cancelled(std::move(msg));
      break;
    case StatusCode::kDeadlineExceeded:
      *out = Status::DeadlineExceeded(std::move(msg));
      break;
    case StatusCode::kCorruption:
      *out = Status::Corruption(std::move(msg));
      break;
    case StatusCode::kAlreadyExists:
      *out = Status::AlreadyExists(std::move(msg));
      break;
    case StatusCode::kFailedPrecondition:
      *out = Status::FailedPrecondition(std::move(msg));
      break;
    case StatusCode::kResourceExhausted:
      *out = Status::ResourceExhausted(std::move(msg));
      break;
    case StatusCode::kPermissionDenied:
      *out = Status::PermissionDenied(std::move(msg));
      break;
    case StatusCode::kInternal:
      *out = Status::Internal(std::move(msg));
      break;
  }
  return Status::OK();
}

}  // namespace orbitkv::protocol
