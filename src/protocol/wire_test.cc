#include "protocol/wire.h"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "protocol/orbitkv_generated.h"
#include "recovery/recovery_test_util.h"

namespace orbitkv {

// Field-wise equality for the round-trip tests (internal linkage: test-only).
static bool operator==(const SlotLayout& a, const SlotLayout& b) {
  return a.slot_id == b.slot_id && a.region == b.region && a.offset == b.offset &&
         a.page_stride == b.page_stride && a.bytes_per_page == b.bytes_per_page;
}
static bool operator==(const GroupLayout& a, const GroupLayout& b) {
  return a.group_id == b.group_id && a.num_slots == b.num_slots && a.slot_bytes == b.slot_bytes &&
         a.slots == b.slots;
}
static bool operator==(const InstanceLayout& a, const InstanceLayout& b) {
  return a.num_pages == b.num_pages && a.region_bytes == b.region_bytes && a.groups == b.groups;
}

namespace protocol {
namespace {

namespace fb = flatbuffers;
namespace w = orbitkv::wire;

BlockKey Key(uint32_t i) {
  BlockKey k{};
  for (size_t b = 0; b < k.size(); ++b) k[b] = static_cast<uint8_t>(i * 31 + b * 7);
  return k;
}

std::vector<BlockKey> Keys(uint32_t n) {
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < n; ++i) keys.push_back(Key(i));
  return keys;
}

RegisterRequest SampleRegister() {
  RegisterRequest r;
  r.ns = "llama-3-8b/bf16/tp2/salt=x";
  r.rank = 1;
  r.device = "host";
  r.layout.num_pages = 1000;
  r.layout.region_bytes = {1 << 20, 2 << 20, 3 << 20};
  GroupLayout g0;
  g0.group_id = 0;
  g0.num_slots = 4;
  g0.slot_bytes = {4096, 4096, 1000, 777};
  g0.slots.push_back({0, 0, 0, 4096, 4096});
  g0.slots.push_back({2, 1, 128, 1024, 1000});
  GroupLayout g1;
  g1.group_id = 5;
  g1.num_slots = 1;
  g1.slot_bytes = {12345};
  g1.slots.push_back({0, 2, 7, 12345, 12345});
  r.layout.groups = {g0, g1};
  return r;
}

std::array<uint8_t, 64> Handle(uint8_t seed) {
  std::array<uint8_t, 64> h{};
  for (size_t b = 0; b < h.size(); ++b) h[b] = static_cast<uint8_t>(seed * 13 + b * 5 + 1);
  return h;
}

// SampleRegister() on device `device` with one IPC handle per region.
RegisterRequest SampleCudaRegister(const std::string& device = "cuda:3") {
  RegisterRequest r = SampleRegister();
  r.device = device;
  for (size_t i = 0; i < r.layout.region_bytes.size(); ++i) {
    r.ipc_handles.push_back(Handle(static_cast<uint8_t>(i)));
  }
  return r;
}

template <typename T>
T DecodeAs(const std::vector<uint8_t>& bytes, uint64_t want_id) {
  Result<DecodedMessage> d = DecodeMessage(bytes);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return T{};
  EXPECT_EQ(d->id, want_id);
  EXPECT_EQ(d->version, kProtocolVersion);
  const T* m = std::get_if<T>(&d->body);
  EXPECT_NE(m, nullptr) << "decoded as " << MessageName(d->body);
  return m ? *m : T{};
}

// Decoding must fail with InvalidArgument whose message names `field`.
void ExpectInvalid(std::span<const uint8_t> bytes, const std::string& field) {
  Result<DecodedMessage> d = DecodeMessage(bytes);
  ASSERT_FALSE(d.ok()) << "decoded as " << MessageName(d->body);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
  EXPECT_NE(d.status().message().find(field), std::string_view::npos)
      << "want '" << field << "' in: " << d.status().ToString();
}

template <typename BodyT>
std::vector<uint8_t> RawEnvelope(fb::FlatBufferBuilder& fbb, fb::Offset<BodyT> body, w::Body type,
                                 uint16_t version = kProtocolVersion, uint64_t id = 7) {
  auto env = w::CreateEnvelope(fbb, version, id, type, body.Union());
  w::FinishEnvelopeBuffer(fbb, env);
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

// ---- round trips --------------------------------------------------------------

TEST(WireTest, HelloRoundTrip) {
  HelloRequest h{kProtocolVersion, 4242, "vllm-worker-0"};
  auto m = DecodeAs<HelloRequest>(EncodeRequest(1, h), 1);
  EXPECT_EQ(m.protocol_version, kProtocolVersion);
  EXPECT_EQ(m.client_pid, 4242);
  EXPECT_EQ(m.client_name, "vllm-worker-0");

  HelloReply r{kProtocolVersion, 99, 1 << 26, 4096, 65536, 1024};
  auto mr = DecodeAs<HelloReply>(EncodeReply(2, r), 2);
  EXPECT_EQ(mr.server_pid, 99);
  EXPECT_EQ(mr.max_frame_bytes, 1u << 26);
  EXPECT_EQ(mr.max_fds_per_frame, 4096u);
  EXPECT_EQ(mr.max_keys_per_message, 65536u);
  EXPECT_EQ(mr.max_connections, 1024u);
}

TEST(WireTest, RegisterRoundTrip) {
  const RegisterRequest r = SampleRegister();
  auto m = DecodeAs<RegisterRequest>(EncodeRequest(UINT64_MAX, r), UINT64_MAX);
  EXPECT_EQ(m.ns, r.ns);
  EXPECT_EQ(m.rank, r.rank);
  EXPECT_EQ(m.device, r.device);
  EXPECT_TRUE(m.layout == r.layout);

  auto rr = DecodeAs<RegisterReply>(EncodeReply(3, RegisterReply{77}), 3);
  EXPECT_EQ(rr.instance, 77u);
}

TEST(WireTest, RegisterWithIpcHandlesRoundTrip) {
  for (const char* device : {"cuda:0", "cuda:3", "cuda:10", "cuda:1023"}) {
    const RegisterRequest r = SampleCudaRegister(device);
    auto m = DecodeAs<RegisterRequest>(EncodeRequest(41, r), 41);
    EXPECT_EQ(m.device, device);
    EXPECT_EQ(m.ns, r.ns);
    EXPECT_TRUE(m.layout == r.layout);
    EXPECT_EQ(m.ipc_handles, r.ipc_handles);
  }
  // A host register without handles leaves the field out: its bytes are what
  // a peer that predates the field sends and expects.
  const RegisterRequest host = SampleRegister();
  EXPECT_TRUE(DecodeAs<RegisterRequest>(EncodeRequest(42, host), 42).ipc_handles.empty());
  auto bytes = EncodeRequest(42, host);
  EXPECT_EQ(w::GetEnvelope(bytes.data())->body_as_RegisterInstance()->ipc_handles(), nullptr);
}

TEST(WireTest, ParseDevice) {
  auto host = ParseDevice("host");
  ASSERT_TRUE(host.ok());
  EXPECT_FALSE(host->cuda);
  for (uint32_t n : {0u, 1u, 7u, 10u, 99u, 100u, 512u, 1023u}) {
    auto d = ParseDevice("cuda:" + std::to_string(n));
    ASSERT_TRUE(d.ok()) << n << ": " << d.status().ToString();
    EXPECT_TRUE(d->cuda);
    EXPECT_EQ(d->ordinal, n);
  }
  for (const char* bad :
       {"",          "cuda",      "cuda:",      "cuda:01x",       "cuda:-1", "cuda:+1",
        "cuda:1024", "cuda:9999", "cuda:10000", "cuda:01",        "cuda:00", "cuda:0x1",
        "cuda: 1",   "cuda:1 ",   " cuda:1",    "CUDA:0",         "Host",    "host ",
        "cpu",       "gpu:0",     "cuda:1:2",   "cuda:4294967296"}) {
    auto d = ParseDevice(bad, "X.device");
    ASSERT_FALSE(d.ok()) << "accepted '" << bad << "'";
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("X.device"), std::string_view::npos)
        << d.status().ToString();
  }
  // Embedded NUL: not "cuda:1".
  EXPECT_FALSE(ParseDevice(std::string_view("cuda:1\0", 7)).ok());
  // A hostile device string is echoed printable and bounded.
  auto odd = ParseDevice(std::string("\xff\x01") + std::string(500, 'z'));
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("\\xff\\x01zz"), std::string_view::npos)
      << odd.status().ToString();
  EXPECT_LT(odd.status().message().size(), 300u);
}

TEST(WireTest, ReleaseQueryRoundTrip) {
  auto m = DecodeAs<ReleaseQueryRequest>(EncodeRequest(8, ReleaseQueryRequest{3, 77}), 8);
  EXPECT_EQ(m.instance, 3u);
  EXPECT_EQ(m.query, 77u);
  DecodeAs<ReleaseQueryReply>(EncodeReply(9, ReleaseQueryReply{}), 9);
}

TEST(WireTest, ClearNamespaceRoundTrip) {
  auto m = DecodeAs<ClearNamespaceRequest>(EncodeRequest(8, ClearNamespaceRequest{12}), 8);
  EXPECT_EQ(m.instance, 12u);
  auto r =
      DecodeAs<ClearNamespaceResult>(EncodeReply(9, ClearNamespaceResult{7, uint64_t{1} << 40}), 9);
  EXPECT_EQ(r.dram_objects, 7u);
  EXPECT_EQ(r.ssd_objects, uint64_t{1} << 40);
  EXPECT_EQ(MessageName(Message(ClearNamespaceRequest{})), "ClearNamespace");
  EXPECT_EQ(MessageName(Message(ClearNamespaceResult{})), "ClearNamespaceReply");
  EXPECT_TRUE(CheckAttachedFds(Message(ClearNamespaceRequest{1}), 0).ok());
  EXPECT_FALSE(CheckAttachedFds(Message(ClearNamespaceRequest{1}), 1).ok());
}

// Appended to the Body union: the messages of the previous schema keep their
// numbers, so older peers' messages decode as before.
TEST(WireTest, ClearNamespaceIsAppendedAfterEveryOlderBody) {
  EXPECT_EQ(static_cast<int>(w::Body_ReleaseQueryReply), 19);
  EXPECT_EQ(static_cast<int>(w::Body_ClearNamespace), 20);
  EXPECT_EQ(static_cast<int>(w::Body_ClearNamespaceReply), 21);
  auto m = DecodeAs<ReleaseQueryRequest>(EncodeRequest(3, ReleaseQueryRequest{1, 2}), 3);
  EXPECT_EQ(m.query, 2u);
}

TEST(WireTest, UnregisterRoundTrip) {
  EXPECT_EQ(DecodeAs<UnregisterRequest>(EncodeRequest(4, UnregisterRequest{12}), 4).instance, 12u);
  DecodeAs<UnregisterReply>(EncodeReply(5, UnregisterReply{}), 5);
}

TEST(WireTest, PublishRoundTrip) {
  PublishRequest p;
  p.instance = 9;
  p.group_id = 3;
  p.keys = Keys(100);
  for (uint64_t i = 0; i < 100; ++i) p.pages.push_back(i * 1000003);
  p.slot_ids = {0, 5, 7};
  auto m = DecodeAs<PublishRequest>(EncodeRequest(6, p), 6);
  EXPECT_EQ(m.instance, 9u);
  EXPECT_EQ(m.group_id, 3u);
  EXPECT_EQ(m.keys, p.keys);
  EXPECT_EQ(m.pages, p.pages);
  EXPECT_EQ(m.slot_ids, p.slot_ids);

  auto r = DecodeAs<PublishResult>(EncodeReply(7, PublishResult{10, 8, 2, 3}), 7);
  EXPECT_EQ(r.stored, 10u);
  EXPECT_EQ(r.sealed, 8u);
  EXPECT_EQ(r.skipped, 2u);
  EXPECT_EQ(r.dropped, 3u);
}

TEST(WireTest, QueryRoundTrip) {
  QueryRequest q;
  q.instance = 1;
  q.group_id = 2;
  q.keys = Keys(3);
  q.ttl_ms = 1234;
  auto m = DecodeAs<QueryRequest>(EncodeRequest(8, q), 8);
  EXPECT_EQ(m.keys, q.keys);
  EXPECT_EQ(m.ttl_ms, 1234u);
  EXPECT_EQ(m.group_id, 2u);

  QueryResult r;
  r.query = 555;
  r.prefix = 3;
  r.sources = {Tier::kDram, Tier::kSsd, Tier::kNone};
  r.logical_bytes = 1ull << 40;
  auto mr = DecodeAs<QueryResult>(EncodeReply(9, r), 9);
  EXPECT_EQ(mr.query, 555u);
  EXPECT_EQ(mr.prefix, 3u);
  EXPECT_EQ(mr.sources, r.sources);
  EXPECT_EQ(mr.logical_bytes, 1ull << 40);
  EXPECT_FALSE(mr.budget_limited);
  r.budget_limited = true;
  EXPECT_TRUE(DecodeAs<QueryResult>(EncodeReply(9, r), 9).budget_limited);
  EXPECT_TRUE(mr.pieces.empty());  // a dense reply carries no plan

  // A hybrid reply: P, the plan's sources and the bytes not needed.
  r.prefix = 2;
  r.sources = {Tier::kDram, Tier::kSsd};
  r.prefix_tokens = 128;
  r.pieces = {{0, 0, 7, Tier::kDram, 4096}, {2, 5, 128, Tier::kSsd, 37ull << 20}};
  r.not_needed_bytes = 14240;
  auto mh = DecodeAs<QueryResult>(EncodeReply(9, r), 9);
  EXPECT_EQ(mh.prefix_tokens, 128u);
  EXPECT_EQ(mh.pieces, r.pieces);
  EXPECT_EQ(mh.not_needed_bytes, 14240u);
}

TEST(WireTest, RestoreRoundTrip) {
  RestoreRequest q;
  q.instance = 1;
  q.query = 555;
  q.blocks = {0, 1, 2};
  q.pages = {10, 20, 30};
  auto m = DecodeAs<RestoreRequest>(EncodeRequest(10, q), 10);
  EXPECT_EQ(m.query, 555u);
  EXPECT_EQ(m.blocks, q.blocks);
  EXPECT_EQ(m.pages, q.pages);

  RestoreResult r;
  r.blocks.push_back({0, Tier::kDram, Status::OK()});
  r.blocks.push_back({1, Tier::kSsd, Status::IOError("read cache.bin.1 [4096, +8192)", EIO, true)});
  r.blocks.push_back({2, Tier::kNone, Status::Cancelled("restore cancelled")});
  auto mr = DecodeAs<RestoreResult>(EncodeReply(11, r), 11);
  ASSERT_EQ(mr.blocks.size(), 3u);
  EXPECT_EQ(mr.blocks[0].block, 0u);
  EXPECT_TRUE(mr.blocks[0].status.ok());
  EXPECT_EQ(mr.blocks[1].source, Tier::kSsd);
  EXPECT_EQ(mr.blocks[1].status.code(), StatusCode::kIOError);
  EXPECT_EQ(mr.blocks[1].status.err_no(), EIO);
  EXPECT_TRUE(mr.blocks[1].status.data_loss());
  EXPECT_EQ(mr.blocks[1].status.message(), "read cache.bin.1 [4096, +8192)");
  EXPECT_TRUE(mr.blocks[2].status.IsCancelled());
}

TEST(WireTest, CancelAndPrepareRoundTrip) {
  EXPECT_EQ(
      DecodeAs<CancelRestoreRequest>(EncodeRequest(12, CancelRestoreRequest{10}), 12).restore_id,
      10u);
  EXPECT_TRUE(
      DecodeAs<CancelRestoreReply>(EncodeReply(13, CancelRestoreReply{true}), 13).cancelled);
  PrepareRequest p;
  p.instance = 4;
  p.group_id = 1;
  p.keys = Keys(65536);  // the limit is accepted
  auto m = DecodeAs<PrepareRequest>(EncodeRequest(14, p), 14);
  EXPECT_EQ(m.keys.size(), 65536u);
  EXPECT_EQ(m.keys, p.keys);
  auto r = DecodeAs<PrepareReply>(EncodeReply(15, PrepareReply{5, 6}), 15);
  EXPECT_EQ(r.queued, 5u);
  EXPECT_EQ(r.skipped, 6u);
}

TEST(WireTest, EveryStatusCodeRoundTrips) {
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    const auto code = static_cast<StatusCode>(c);
    WireStatus ws{static_cast<uint8_t>(c), "boom " + std::to_string(c), 0, false};
    Status decoded;
    ASSERT_TRUE(StatusFromWire(ws, "x", &decoded).ok());
    // NoSpace without errno is rebuilt as ENOSPC; everything else keeps its code.
    EXPECT_EQ(decoded.code(), code) << StatusCodeName(code);
    auto e = DecodeAs<ErrorReply>(EncodeError(16, decoded), 16);
    EXPECT_EQ(e.status.code(), code);
    EXPECT_EQ(e.status.message(), decoded.message());
  }
  // errno and retryable survive on I/O codes.
  auto e = DecodeAs<ErrorReply>(EncodeError(17, Status::IOError("pread shard 3", EAGAIN)), 17);
  EXPECT_EQ(e.status.err_no(), EAGAIN);
  EXPECT_TRUE(e.status.retryable());
  auto nospace = DecodeAs<ErrorReply>(EncodeError(18, Status::IOError("write", ENOSPC)), 18);
  EXPECT_TRUE(nospace.status.IsNoSpace());
  EXPECT_EQ(nospace.status.err_no(), ENOSPC);
  // An OK status in an ErrorReply is a bug, reported as Internal.
  EXPECT_EQ(DecodeAs<ErrorReply>(EncodeError(19, Status::OK()), 19).status.code(),
            StatusCode::kInternal);
  // Overlong messages are cut so that the peer accepts them.
  auto longmsg =
      DecodeAs<ErrorReply>(EncodeError(20, Status::Internal(std::string(10000, 'x'))), 20);
  EXPECT_EQ(longmsg.status.message().size(), kMaxStringBytes);
}

TEST(WireTest, EncodeMessageMatchesTypedEncoders) {
  const Message body = PublishResult{1, 2, 3};
  EXPECT_EQ(EncodeMessage(21, body), EncodeReply(21, PublishResult{1, 2, 3}));
  const Message req = SampleRegister();
  EXPECT_EQ(EncodeMessage(22, req), EncodeRequest(22, SampleRegister()));
  EXPECT_EQ(MessageName(req), "RegisterInstance");
  EXPECT_EQ(MessageName(Message(ErrorReply{Status::Busy("x")})), "ErrorReply");
}

// Regression (fuzz/protocol_fuzz.cc): the builder does not align empty
// vectors, and the decoder's alignment check refused our own empty [ulong].
// Every message, default-constructed (all vectors empty), must round-trip.
template <size_t I = 0>
void RoundTripDefaults() {
  if constexpr (I < std::variant_size_v<Message>) {
    const Message body{std::in_place_index<I>};
    auto d = DecodeMessage(EncodeMessage(100 + I, body));
    ASSERT_TRUE(d.ok()) << MessageName(body) << ": " << d.status().ToString();
    EXPECT_EQ(d->body.index(), I);
    EXPECT_EQ(d->id, 100 + I);
    RoundTripDefaults<I + 1>();
  }
}
TEST(WireTest, EmptyMessagesRoundTrip) { RoundTripDefaults(); }

TEST(WireTest, PeekEnvelopeId) {
  auto bytes = EncodeRequest(0xDEADBEEFCAFEull, SampleRegister());
  EXPECT_EQ(PeekEnvelopeId(bytes), 0xDEADBEEFCAFEull);
  for (size_t n = 0; n < bytes.size(); ++n) {
    // Any prefix: an id or nothing, never a crash.
    (void)PeekEnvelopeId(std::span(bytes.data(), n));
  }
  std::vector<uint8_t> junk(64, 0xAB);
  EXPECT_FALSE(PeekEnvelopeId(junk).has_value());
}

TEST(WireTest, UnalignedInputDecodes) {
  auto bytes = EncodeRequest(23, SampleRegister());
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  auto d = DecodeMessage(std::span(shifted.data() + 1, bytes.size()));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->id, 23u);
  EXPECT_EQ(PeekEnvelopeId(std::span(shifted.data() + 1, bytes.size())), 23u);
}

TEST(WireTest, CheckAttachedFds) {
  RegisterRequest r = SampleRegister();
  EXPECT_TRUE(CheckAttachedFds(r, 3).ok());
  EXPECT_EQ(CheckAttachedFds(r, 2).code(), StatusCode::kInvalidArgument);
  r.device = "cuda:0";
  EXPECT_TRUE(CheckAttachedFds(r, 0).ok());
  EXPECT_FALSE(CheckAttachedFds(r, 3).ok());
  // Handles and fds on one frame: the fds are refused.
  const RegisterRequest cuda = SampleCudaRegister();
  EXPECT_TRUE(CheckAttachedFds(cuda, 0).ok());
  for (size_t n : {1, 3}) {
    Status st = CheckAttachedFds(cuda, n);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("ipc_handles"), std::string_view::npos) << st.ToString();
  }
  EXPECT_TRUE(CheckAttachedFds(QueryRequest{}, 0).ok());
  EXPECT_FALSE(CheckAttachedFds(QueryRequest{}, 1).ok());
}

// ---- hostile input ------------------------------------------------------------------

TEST(WireHostileTest, RandomBytesAreRejected) {
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bytes(rng() % 512);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (iter % 2 == 0 && bytes.size() >= 8) std::memcpy(bytes.data() + 4, "OKV1", 4);
    Result<DecodedMessage> d = DecodeMessage(bytes);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    }
    (void)PeekEnvelopeId(bytes);
  }
}

TEST(WireHostileTest, EveryTruncationIsRejected) {
  PublishRequest p;
  p.keys = Keys(4);
  p.pages = {1, 2, 3, 4};
  for (const auto& bytes : {EncodeRequest(1, SampleRegister()), EncodeRequest(2, p),
                            EncodeReply(3, RestoreResult{{{0, Tier::kSsd, Status::Busy("b")}}}),
                            EncodeRequest(4, SampleCudaRegister())}) {
    auto full = DecodeMessage(bytes);
    ASSERT_TRUE(full.ok());
    const auto canonical = EncodeMessage(full->id, full->body);
    for (size_t n = 0; n < bytes.size(); ++n) {
      Result<DecodedMessage> d = DecodeMessage(std::span(bytes.data(), n));
      if (d.ok()) {
        // Only trailing alignment padding may go missing unnoticed.
        EXPECT_GE(n + 8, bytes.size()) << "prefix of " << n << " bytes decoded";
        EXPECT_EQ(EncodeMessage(d->id, d->body), canonical);
      } else {
        EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
      }
    }
  }
}

// A register of a hybrid model: attention, a window, recurrent checkpoints at
// explicit positions (every optional field of the description set).
RegisterRequest SampleHybridRegister() {
  using namespace recovery::testing;  // NOLINT
  RegisterRequest r = SampleRegister();
  r.model = Describe(16, {Full("attn", 0, 16, 1 << 20), Window("swa", 1, 32, 1 << 19, 4096),
                          Recurrent("gdn", 2, 16, 37 << 20, 0, {256, 512, 4096})});
  return r;
}

TEST(WireTest, RegisterWithModelRoundTrip) {
  const RegisterRequest r = SampleHybridRegister();
  auto m = DecodeAs<RegisterRequest>(EncodeRequest(5, r), 5);
  ASSERT_TRUE(m.model.has_value());
  EXPECT_EQ(*m.model, *r.model);
  EXPECT_TRUE(m.layout == r.layout);
  RegisterRequest interval = SampleHybridRegister();
  interval.model->groups[2].checkpoint_positions.clear();
  interval.model->groups[2].checkpoint_interval_tokens = 64;
  EXPECT_EQ(*DecodeAs<RegisterRequest>(EncodeRequest(6, interval), 6).model, *interval.model);
}

// Old clients never set the field: their bytes decode as a dense register,
// and a dense register carries no model table.
TEST(WireTest, RegisterWithoutModelIsDenseAndUnchanged) {
  const std::vector<uint8_t> now = EncodeRequest(9, SampleRegister());
  EXPECT_FALSE(DecodeAs<RegisterRequest>(now, 9).model.has_value());
  // The new encoder adds nothing for a dense register: no model table at all.
  EXPECT_EQ(w::GetEnvelope(now.data())->body_as_RegisterInstance()->model(), nullptr);
  // A register built with the fields of the protocol before ipc_handles and
  // model existed (what an old client sends).
  fb::FlatBufferBuilder fbb(256);
  auto ns = fbb.CreateString("old");
  auto device = fbb.CreateString("host");
  auto region_bytes = fbb.CreateVector(std::vector<uint64_t>{4096});
  auto layout = w::CreateLayout(fbb, 1, region_bytes);
  w::RegisterInstanceBuilder b(fbb);
  b.add_ns(ns);
  b.add_rank(3);
  b.add_device(device);
  b.add_layout(layout);
  auto m =
      DecodeAs<RegisterRequest>(RawEnvelope(fbb, b.Finish(), w::Body_RegisterInstance, 1, 9), 9);
  EXPECT_EQ(m.ns, "old");
  EXPECT_FALSE(m.model.has_value());
}

TEST(WireTest, RegisterWithStorageCodecRoundTrip) {
  RegisterRequest r = SampleRegister();
  r.storage = {"turboquant-4", "bf16", 128};
  EXPECT_EQ(DecodeAs<RegisterRequest>(EncodeRequest(5, r), 5).storage, r.storage);
  r.storage = {"ans", "", 0};
  EXPECT_EQ(DecodeAs<RegisterRequest>(EncodeRequest(6, r), 6).storage, r.storage);
  // The Manager's default: no table at all, the bytes of a register before the field.
  const std::vector<uint8_t> plain = EncodeRequest(7, SampleRegister());
  EXPECT_EQ(w::GetEnvelope(plain.data())->body_as_RegisterInstance()->storage(), nullptr);
  EXPECT_EQ(DecodeAs<RegisterRequest>(plain, 7).storage, StorageCodecRequest{});
}

// The committed fuzz seed (fuzz/corpus/protocol_fuzz) is a register with a
// storage codec and decodes as one, so the fuzzer starts inside the table.
TEST(WireTest, ProtocolFuzzSeedIsARegisterWithAStorageCodec) {
  RegisterRequest r = SampleRegister();
  r.storage = {"fp8", "fp16", 64};
  const std::vector<uint8_t> bytes = EncodeRequest(11, r);
  const std::string path =
      std::string(ORBITKV_SOURCE_DIR) + "/fuzz/corpus/protocol_fuzz/register_storage_codec";
  if (std::getenv("ORBITKV_WRITE_FUZZ_SEEDS")) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> seed{std::istreambuf_iterator<char>(in), {}};
  ASSERT_FALSE(seed.empty()) << path;
  EXPECT_EQ(DecodeAs<RegisterRequest>(seed, 11).storage, r.storage);
}

TEST(WireHostileTest, BadStorageCodecFieldsAreRefusedNamingTheField) {
  RegisterRequest r = SampleRegister();
  r.storage = {std::string(kMaxCodecNameBytes + 1, 'a'), "bf16", 128};
  ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.storage.codec: 33 bytes");
  r.storage = {"fp8", std::string(kMaxCodecNameBytes + 1, 'b'), 128};
  ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.storage.dtype: 33 bytes");
  r.storage = {"fp8", "bf16", kMaxCodecHeadDim + 1};
  ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.storage.head_dim: 65537");
}

TEST(WireHostileTest, BadModelDescriptionsAreRefusedNamingTheField) {
  auto refused = [](std::function<void(ModelDescription&)> edit, const std::string& field) {
    RegisterRequest r = SampleHybridRegister();
    edit(*r.model);
    ExpectInvalid(EncodeRequest(1, r), field);
  };
  refused([](auto& d) { d.groups[1].window_tokens = 0; },
          "RegisterInstance.model.groups[1].window_tokens: 0");
  refused([](auto& d) { d.groups[2].checkpoint_positions[1] = 500; },
          "RegisterInstance.model.groups[2].checkpoint_positions[1]: 500 is off the block grid");
  refused([](auto& d) { d.groups[2].name = "swa"; },
          "RegisterInstance.model.groups[2].name: \"swa\" names two groups");
  refused([](auto& d) { d.groups.clear(); }, "RegisterInstance.model.groups: no groups");
  refused([](auto& d) { d.groups[0].bytes = kMaxPieceBytes + 1; },
          "RegisterInstance.model.groups[0].bytes");
  refused([](auto& d) { d.groups[0].kind = static_cast<GroupKind>(200); },
          "RegisterInstance.model.groups[0].kind: unknown kind 200");
  refused([](auto& d) { d.groups.resize(kMaxModelGroups + 1, d.groups[0]); },
          "RegisterInstance.model.groups: 65 entries, more than the limit 64");
  refused([](auto& d) { d.groups[2].checkpoint_positions.assign(kMaxCheckpointPositions + 1, 16); },
          "RegisterInstance.model.groups[2].checkpoint_positions: 65537 entries");
  refused([](auto& d) { d.groups[0].name.assign(kMaxStringBytes + 1, 'a'); },
          "RegisterInstance.model.groups[0].name: 4097 bytes, longer than the limit 4096");
  // An empty model table: no key block size, no groups.
  fb::FlatBufferBuilder fbb(256);
  auto model = w::CreateModelDescription(fbb);
  auto ns = fbb.CreateString("ns");
  auto device = fbb.CreateString("host");
  auto layout = w::CreateLayout(fbb, 1);
  ExpectInvalid(RawEnvelope(fbb, w::CreateRegisterInstance(fbb, ns, 0, device, layout, 0, model),
                            w::Body_RegisterInstance),
                "RegisterInstance.model.key_block_tokens: 0");
}

TEST(WireHostileTest, BitFlipsNeverCrash) {
  for (const auto& bytes :
       {EncodeRequest(1, SampleRegister()), EncodeRequest(1, SampleCudaRegister()),
        EncodeRequest(1, SampleHybridRegister())}) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (uint8_t mask : {0x01, 0x80, 0xFF}) {
        auto copy = bytes;
        copy[i] ^= mask;
        Result<DecodedMessage> d = DecodeMessage(copy);
        if (!d.ok()) {
          EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
        }
      }
    }
  }
}

TEST(WireHostileTest, WrongVersion) {
  fb::FlatBufferBuilder fbb;
  auto body = w::CreateUnregister(fbb, 1);
  auto bytes = RawEnvelope(fbb, body, w::Body_Unregister, kProtocolVersion + 1);
  ExpectInvalid(bytes, "Envelope.version");
  // The id is still readable, so the server can address its ErrorReply.
  EXPECT_EQ(PeekEnvelopeId(bytes), 7u);
}

TEST(WireHostileTest, WrongIdentifier) {
  auto bytes = EncodeRequest(1, UnregisterRequest{1});
  std::memcpy(bytes.data() + 4, "XXXX", 4);
  ExpectInvalid(bytes, "Envelope");
}

TEST(WireHostileTest, MissingOrUnknownBody) {
  {
    fb::FlatBufferBuilder fbb;
    auto env = w::CreateEnvelope(fbb, kProtocolVersion, 1, w::Body_NONE, 0);
    w::FinishEnvelopeBuffer(fbb, env);
    ExpectInvalid(std::span(fbb.GetBufferPointer(), fbb.GetSize()), "Envelope.body");
  }
  {
    fb::FlatBufferBuilder fbb;
    auto body = w::CreateUnregister(fbb, 1);
    ExpectInvalid(RawEnvelope(fbb, body, static_cast<w::Body>(200)), "Envelope.body_type");
  }
  {
    fb::FlatBufferBuilder fbb;  // a type without its table
    auto env = w::CreateEnvelope(fbb, kProtocolVersion, 1, w::Body_Publish, 0);
    w::FinishEnvelopeBuffer(fbb, env);
    ExpectInvalid(std::span(fbb.GetBufferPointer(), fbb.GetSize()), "Envelope.body");
  }
}

TEST(WireHostileTest, KeysNotAMultipleOf32) {
  for (w::Body type : {w::Body_Publish, w::Body_Query, w::Body_Prepare}) {
    fb::FlatBufferBuilder fbb;
    std::vector<uint8_t> keys(33, 1);
    auto kv = fbb.CreateVector(keys);
    std::vector<uint8_t> bytes;
    if (type == w::Body_Publish) {
      std::vector<uint64_t> pages = {1};
      auto pv = fbb.CreateVector(pages);
      bytes = RawEnvelope(fbb, w::CreatePublish(fbb, 1, 0, kv, pv), type);
      ExpectInvalid(bytes, "Publish.keys");
    } else if (type == w::Body_Query) {
      bytes = RawEnvelope(fbb, w::CreateQuery(fbb, 1, 0, kv), type);
      ExpectInvalid(bytes, "Query.keys");
    } else {
      bytes = RawEnvelope(fbb, w::CreatePrepare(fbb, 1, 0, kv), type);
      ExpectInvalid(bytes, "Prepare.keys");
    }
  }
}

TEST(WireHostileTest, TooManyKeys) {
  PublishRequest p;
  p.keys = Keys(kMaxKeysPerMessage + 1);
  p.pages.assign(p.keys.size(), 0);
  ExpectInvalid(EncodeRequest(1, p), "Publish.keys");
  QueryRequest q;
  q.keys = p.keys;
  ExpectInvalid(EncodeRequest(1, q), "Query.keys");
}

TEST(WireHostileTest, PagesMustMatchKeys) {
  PublishRequest p;
  p.keys = Keys(3);
  p.pages = {1, 2};
  ExpectInvalid(EncodeRequest(1, p), "Publish.pages");
  RestoreRequest r;
  r.blocks = {0, 1};
  r.pages = {5};
  ExpectInvalid(EncodeRequest(1, r), "Restore.pages");
  RestoreRequest big;
  big.blocks.assign(kMaxKeysPerMessage + 1, 0);
  big.pages.assign(kMaxKeysPerMessage + 1, 0);
  ExpectInvalid(EncodeRequest(1, big), "Restore.blocks");
}

TEST(WireHostileTest, LayoutBounds) {
  {
    RegisterRequest r = SampleRegister();
    r.layout.region_bytes.assign(kMaxRegions + 1, 4096);
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.layout.region_bytes");
  }
  {
    RegisterRequest r = SampleRegister();
    r.layout.groups.resize(kMaxGroups + 1);
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.layout.groups");
  }
  {
    RegisterRequest r = SampleRegister();
    r.layout.groups[1].slots.resize(kMaxSlotsPerGroup + 1);
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.layout.groups[1].slots");
  }
  {
    RegisterRequest r = SampleRegister();
    r.layout.groups[0].slot_bytes.resize(kMaxSlotsPerGroup + 1);
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.layout.groups[0].slot_bytes");
  }
  {
    RegisterRequest r = SampleRegister();
    r.ns = std::string(kMaxStringBytes + 1, 'n');
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ns");
    r.ns = std::string(kMaxStringBytes, 'n');  // the limit is accepted
    EXPECT_TRUE(DecodeMessage(EncodeRequest(1, r)).ok());
  }
  {
    RegisterRequest r = SampleRegister();
    r.device = std::string(kMaxStringBytes + 1, 'd');
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.device");
  }
  {
    fb::FlatBufferBuilder fbb;  // no layout at all
    auto ns = fbb.CreateString("ns");
    ExpectInvalid(
        RawEnvelope(fbb, w::CreateRegisterInstance(fbb, ns, 0, 0, 0), w::Body_RegisterInstance),
        "RegisterInstance.layout");
  }
}

TEST(WireHostileTest, DeviceMustBeHostOrCudaN) {
  for (const char* bad :
       {"cuda:", "cuda:01x", "cuda:-1", "cuda:1024", "cuda:01", "gpu", "", "HOST", "cuda:0 "}) {
    // With handles (as a CUDA register) and without (as a host one): the
    // device is refused before the handles are looked at.
    RegisterRequest r = SampleCudaRegister(bad);
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.device");
    r.ipc_handles.clear();
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.device");
  }
  {
    fb::FlatBufferBuilder fbb;  // no device string at all
    auto ns = fbb.CreateString("ns");
    auto layout = w::CreateLayout(fbb, 1);
    ExpectInvalid(RawEnvelope(fbb, w::CreateRegisterInstance(fbb, ns, 0, 0, layout),
                              w::Body_RegisterInstance),
                  "RegisterInstance.device");
  }
}

TEST(WireHostileTest, IpcHandlesFollowTheDevice) {
  {
    RegisterRequest r = SampleCudaRegister();  // 3 regions
    r.ipc_handles.pop_back();
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ipc_handles");
    r.ipc_handles.clear();  // a CUDA register without handles
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ipc_handles");
    r = SampleCudaRegister();
    r.ipc_handles.push_back(Handle(9));
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ipc_handles");
  }
  {
    RegisterRequest r = SampleRegister();  // host
    r.ipc_handles.push_back(Handle(1));
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ipc_handles");
    r.ipc_handles.assign(r.layout.region_bytes.size(), Handle(2));  // even one per region
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ipc_handles");
  }
  {
    // The count is bounded before anything is copied; the limit is accepted.
    RegisterRequest r = SampleCudaRegister("cuda:1");
    r.layout.region_bytes.assign(kMaxRegions, 4096);
    r.ipc_handles.assign(kMaxIpcHandles, Handle(3));
    auto m = DecodeAs<RegisterRequest>(EncodeRequest(2, r), 2);
    EXPECT_EQ(m.ipc_handles.size(), kMaxIpcHandles);
    r.ipc_handles.push_back(Handle(4));
    ExpectInvalid(EncodeRequest(1, r), "RegisterInstance.ipc_handles");
  }
  {
    // A handle vector whose length claims more than the buffer holds: the
    // verifier refuses it (each element is exactly 64 bytes by the schema).
    RegisterRequest r = SampleCudaRegister();
    auto bytes = EncodeRequest(1, r);
    const auto h0 = Handle(0);
    bool patched = false;
    for (size_t i = 0; i + 4 + 64 <= bytes.size(); ++i) {
      uint32_t len;
      std::memcpy(&len, bytes.data() + i, 4);
      if (len == 3 && std::memcmp(bytes.data() + i + 4, h0.data(), 64) == 0) {
        // One more: 64 bytes past the last handle, inside the buffer or not;
        // either way the message is refused (verifier or handle count).
        len = 4;
        std::memcpy(bytes.data() + i, &len, 4);
        Result<DecodedMessage> d = DecodeMessage(bytes);
        ASSERT_FALSE(d.ok());
        EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
        len = 0x7FFFFFF0;
        std::memcpy(bytes.data() + i, &len, 4);
        ExpectInvalid(bytes, "Envelope");
        patched = true;
        break;
      }
    }
    ASSERT_TRUE(patched);
  }
}

TEST(WireHostileTest, HybridQueryReplyBounds) {
  QueryResult q;
  q.prefix = 1;
  q.sources = {Tier::kDram};
  q.prefix_tokens = 16;
  q.pieces = {{0, 0, 0, Tier::kDram, 4096}};
  QueryResult bad = q;
  bad.pieces.push_back(bad.pieces[0]);
  ExpectInvalid(EncodeReply(1, bad), "QueryReply.pieces");
  bad = q;
  bad.pieces[0].tier = Tier::kSsd;
  ExpectInvalid(EncodeReply(1, bad), "QueryReply.pieces[0].tier");
  bad = q;
  bad.pieces[0].bytes = 0;
  ExpectInvalid(EncodeReply(1, bad), "QueryReply.pieces[0].bytes");
  bad = q;
  bad.pieces[0].group = kMaxModelGroups;
  ExpectInvalid(EncodeReply(1, bad), "QueryReply.pieces[0]");
  bad = q;
  bad.prefix_tokens = kMaxSequenceTokens + 1;
  ExpectInvalid(EncodeReply(1, bad), "QueryReply.prefix_tokens");
  {
    fb::FlatBufferBuilder fbb;
    auto sv = fbb.CreateVector(std::vector<uint8_t>{1});
    std::vector<w::QuerySource> p = {w::QuerySource(0, 4096, 0, 0, 9)};
    auto pv = fbb.CreateVectorOfStructs(p);
    ExpectInvalid(
        RawEnvelope(fbb, w::CreateQueryReply(fbb, 1, 1, sv, 0, false, 16, pv), w::Body_QueryReply),
        "QueryReply.pieces[0].tier");
  }
}

TEST(WireHostileTest, ReplyBounds) {
  {
    QueryResult q;
    q.prefix = 2;
    q.sources = {Tier::kDram};
    ExpectInvalid(EncodeReply(1, q), "QueryReply.sources");
  }
  {
    fb::FlatBufferBuilder fbb;
    std::vector<uint8_t> sources = {1, 9};
    auto sv = fbb.CreateVector(sources);
    ExpectInvalid(RawEnvelope(fbb, w::CreateQueryReply(fbb, 1, 2, sv), w::Body_QueryReply),
                  "QueryReply.sources");
  }
  {
    fb::FlatBufferBuilder fbb;
    auto msg = fbb.CreateString("x");
    ExpectInvalid(RawEnvelope(fbb, w::CreateErrorReply(fbb, 0, msg), w::Body_ErrorReply),
                  "ErrorReply.code");
  }
  {
    fb::FlatBufferBuilder fbb;
    auto msg = fbb.CreateString("x");
    ExpectInvalid(RawEnvelope(fbb, w::CreateErrorReply(fbb, 200, msg), w::Body_ErrorReply),
                  "ErrorReply.code");
  }
  {
    fb::FlatBufferBuilder fbb;
    auto msg = fbb.CreateString(std::string(kMaxStringBytes + 1, 'm'));
    ExpectInvalid(RawEnvelope(fbb, w::CreateErrorReply(fbb, 1, msg), w::Body_ErrorReply),
                  "ErrorReply.message");
  }
  {
    fb::FlatBufferBuilder fbb;
    std::vector<fb::Offset<w::BlockResult>> blocks;
    blocks.push_back(w::CreateBlockResult(fbb, 0, 1, 0));
    blocks.push_back(w::CreateBlockResult(fbb, 1, 7, 0));
    auto bv = fbb.CreateVector(blocks);
    ExpectInvalid(RawEnvelope(fbb, w::CreateRestoreReply(fbb, bv), w::Body_RestoreReply),
                  "RestoreReply.blocks[1].source");
  }
  {
    fb::FlatBufferBuilder fbb;
    std::vector<fb::Offset<w::BlockResult>> blocks;
    blocks.push_back(w::CreateBlockResult(fbb, 0, 1, 99));
    auto bv = fbb.CreateVector(blocks);
    ExpectInvalid(RawEnvelope(fbb, w::CreateRestoreReply(fbb, bv), w::Body_RestoreReply),
                  "RestoreReply.blocks[0].code");
  }
  {
    RestoreResult r;
    r.blocks.resize(kMaxKeysPerMessage + 1);
    ExpectInvalid(EncodeReply(1, r), "RestoreReply.blocks");
  }
}

TEST(WireHostileTest, TableCountIsBounded) {
  // More tables than any legal message has: the verifier stops counting.
  fb::FlatBufferBuilder fbb;
  std::vector<fb::Offset<w::BlockResult>> blocks;
  const size_t n = kVerifierMaxTables + 10;
  blocks.reserve(n);
  for (size_t i = 0; i < n; ++i) blocks.push_back(w::CreateBlockResult(fbb, 1, 1, 1));
  auto bv = fbb.CreateVector(blocks);
  ExpectInvalid(RawEnvelope(fbb, w::CreateRestoreReply(fbb, bv), w::Body_RestoreReply), "Envelope");
}

// Regression (fuzz/protocol_fuzz.cc): FlatBuffers 2.0.8 verifies a [ulong]
// vector's length prefix but not that its elements are 8-byte aligned; reading
// them was a misaligned load.
TEST(WireHostileTest, MisalignedUlongVectorIsRejected) {
  bool saw_misaligned = false;
  for (int pad = 0; pad < 2; ++pad) {
    fb::FlatBufferBuilder fbb;
    std::vector<uint8_t> keys(64, 3);
    auto kv = fbb.CreateVector(keys);  // built first, so it lies after the pages
    for (int i = 0; i < pad; ++i) fbb.PushElement<uint32_t>(0);
    // A [uint] of length 2 read as a [ulong] of length 2: 16 bytes, the last 8
    // from the keys vector that follows it. The builder aligns it to 4 only.
    std::vector<uint32_t> halves = {1, 0};
    auto pages = fb::Offset<fb::Vector<uint64_t>>(fbb.CreateVector(halves).o);
    auto bytes = RawEnvelope(fbb, w::CreatePublish(fbb, 1, 0, kv, pages), w::Body_Publish);
    const auto* env = w::GetEnvelope(bytes.data());
    const bool misaligned =
        reinterpret_cast<uintptr_t>(env->body_as_Publish()->pages()->Data()) % 8 != 0;
    if (misaligned) {
      saw_misaligned = true;
      ExpectInvalid(bytes, "Publish.pages");
    } else {
      auto m = DecodeAs<PublishRequest>(bytes, 7);
      ASSERT_EQ(m.pages.size(), 2u);
      EXPECT_EQ(m.pages[0], 1u);
    }
  }
  EXPECT_TRUE(saw_misaligned);
}

TEST(WireHostileTest, OversizedVectorLengthFieldIsRejected) {
  // A keys vector whose length field claims far more bytes than the buffer has.
  QueryRequest q;
  q.keys = Keys(2);
  auto bytes = EncodeRequest(1, q);
  // Find the vector length (64) followed by the key bytes, and inflate it.
  const BlockKey k0 = Key(0);
  bool patched = false;
  for (size_t i = 0; i + 4 + 32 <= bytes.size(); ++i) {
    uint32_t len;
    std::memcpy(&len, bytes.data() + i, 4);
    if (len == 64 && std::memcmp(bytes.data() + i + 4, k0.data(), 32) == 0) {
      len = 0x7FFFFFE0;
      std::memcpy(bytes.data() + i, &len, 4);
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  ExpectInvalid(bytes, "Envelope");
}

}  // namespace
}  // namespace protocol
}  // namespace orbitkv
