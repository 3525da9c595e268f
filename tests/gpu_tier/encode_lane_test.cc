// GpuEncodeLane (manager/gpu_encode_lane.h) on the gates' platform: the CPU
// codec behind the fake platform's FrameEncoder (CI), CudaEncoder on CUDA
// (gpu_tier_gate_cuda_test). A group encoded on the lane is byte for byte the
// object the CPU writeback's EncodeObject writes; a failed encode gives its
// range back and is counted; Close cancels what was not encoded and every
// range and the budget come back.
#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_test_util.h"
#include "gpu/fault_injecting_platform.h"
#include "gpu_tier/gate_env.h"
#include "manager/gpu_encode_lane.h"
#include "orbitkv/metrics.h"
#include "store/object_format.h"

namespace orbitkv {
namespace {

using codec::CodecId;

class EncodeLaneSeam : public ::testing::Test {
 protected:
  static constexpr uint64_t kSlot0 = 65536, kSlot1 = 16384;
  std::unique_ptr<testing::GateEnv> env;
  std::unique_ptr<gpu::FaultInjectingPlatform> faults;
  gpu::Device* dev = nullptr;
  MetricsRegistry metrics;
  std::unique_ptr<CodecMetrics> codec_metrics;
  std::unique_ptr<CodecBudget> budget;
  std::vector<testing::GateEnv::Pages> held;

  void SetUp() override {
    env = testing::CreateGateEnv();
    if (std::string why = env->Unavailable(); !why.empty()) GTEST_SKIP() << why;
    faults = std::make_unique<gpu::FaultInjectingPlatform>(env->inner());
    Result<gpu::Device*> d = faults->device(0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev = *d;
    codec_metrics = std::make_unique<CodecMetrics>(metrics);
    budget = std::make_unique<CodecBudget>(64u << 20, codec_metrics->budget_used);
  }
  void TearDown() override {
    for (auto& p : held) env->Free(p);
    if (env) EXPECT_EQ(env->Leaks(), "");
  }
  std::unique_ptr<GpuEncodeLane> Lane(uint64_t share) {
    GpuEncodeLaneOptions o;
    o.device = dev;
    o.budget_bytes = share;
    o.budget = budget.get();
    o.metrics = codec_metrics.get();
    auto l = GpuEncodeLane::Create(o);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? std::move(l).value() : nullptr;
  }
  gpu::DevPtr Put(const std::vector<uint8_t>& bytes) {
    held.push_back(env->Allocate(bytes.size()));
    env->Write(held.back().base, bytes.data(), bytes.size());
    return held.back().base;
  }
  static NamespaceCodec Codec(CodecId id) { return {id, {codec::DType::kBf16, 128}}; }
  static ObjectId Id(uint64_t v) {
    ObjectId id;
    id.ns = 7;
    id.group = 0;
    id.key.bytes[0] = static_cast<uint8_t>(v);
    return id;
  }
  // The raw object of two KV-like slots, and the lane task for the same bytes.
  std::vector<uint8_t> RawObject(uint64_t seed, GpuEncodeLane::Task* t) {
    const std::vector<uint64_t> slots{kSlot0, kSlot1};
    const ObjectShape shape = MakeObjectShape(slots);
    std::vector<uint8_t> raw(shape.object_size, 0);
    for (uint32_t k = 0; k < 2; ++k) {
      const std::vector<uint8_t> b =
          codec::testing::KvLikeSegment(slots[k] / 2, codec::DType::kBf16, 128, seed + k);
      std::copy(b.begin(), b.end(), raw.begin() + shape.segments[k].offset);
      t->sources.push_back(Put(b));
    }
    WriteObjectHeader(t->id, slots, ObjectCodec{}, SegmentCrcs(raw, slots), raw);
    t->slot_bytes = slots;
    return raw;
  }
};

TEST_F(EncodeLaneSeam, EveryCodecGivesTheObjectOfTheCpuWriteback) {
  auto lane = Lane(16u << 20);
  ASSERT_TRUE(lane);
  Result<uint8_t*> host = dev->AllocateHost(1u << 20);
  ASSERT_TRUE(host.ok());
  for (CodecId id : {CodecId::kAns, CodecId::kFp8, CodecId::kTurboQuant4, CodecId::kTurboQuant3}) {
    SCOPED_TRACE(std::string(codec::CodecName(id)));
    GpuEncodeLane::Task t;
    t.id = Id(static_cast<uint64_t>(id));
    t.codec = Codec(id);
    const std::vector<uint8_t> raw = RawObject(static_cast<uint64_t>(id), &t);
    CodecBuffer cpu;
    Result<uint64_t> n = EncodeObject(t.codec, raw, &cpu, *codec_metrics);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    std::promise<void> done;
    t.encoded = [&](Result<GpuEncodeLane::Encoded> e) {
      EXPECT_TRUE(e.ok()) << e.status().ToString();
      if (e.ok()) {
        EXPECT_EQ(e->object_size, *n);
        EXPECT_TRUE(lane->CopyToHost(*e, *host).ok());
        EXPECT_EQ(std::vector<uint8_t>(*host, *host + *n),
                  std::vector<uint8_t>(cpu.data(), cpu.data() + *n));
        lane->Release(e->range, e->range_bytes);
      }
      done.set_value();
    };
    ASSERT_TRUE(lane->Submit(std::move(t)).ok());
    done.get_future().wait();
  }
  EXPECT_EQ(lane->arena_free_bytes(), lane->capacity());
  EXPECT_TRUE(dev->FreeHost(*host).ok());
}

TEST_F(EncodeLaneSeam, AFailedEncodeIsCountedAndGivesItsRangeBack) {
  auto lane = Lane(16u << 20);
  ASSERT_TRUE(lane);
  faults->FailEncodes(1, Status::Internal("injected encode failure"));
  GpuEncodeLane::Task t;
  t.id = Id(1);
  t.codec = Codec(CodecId::kAns);
  RawObject(1, &t);
  std::promise<Status> done;
  t.encoded = [&](Result<GpuEncodeLane::Encoded> e) { done.set_value(e.status()); };
  ASSERT_TRUE(lane->Submit(std::move(t)).ok());
  const Status st = done.get_future().get();
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_EQ(lane->arena_free_bytes(), lane->capacity());
  EXPECT_EQ(metrics.Read("orbitkv_codec_failures_total", {{"codec", "ans"}, {"op", "encode"}}), 1);
}

TEST_F(EncodeLaneSeam, FullArenaIsBusyAndCloseCancelsWhatWasNotEncoded) {
  // An arena of two groups' ranges (after the encoder's scratch): the third
  // is Busy while they are held.
  GpuEncodeLane::Task probe;
  probe.codec = Codec(CodecId::kAns);
  probe.slot_bytes = {kSlot0, kSlot1};
  const uint64_t bound = GpuEncodeLane::Bound(probe.codec, probe.slot_bytes);
  auto encoder = dev->CreateFrameEncoder(GpuEncodeLane::kMaxSegments);
  ASSERT_TRUE(encoder.ok()) << encoder.status().ToString();
  const uint64_t share = (*encoder)->scratch_bytes() + 2 * bound;
  encoder->reset();
  auto lane = Lane(share);
  ASSERT_TRUE(lane);
  const uint64_t groups = lane->capacity() / bound;
  ASSERT_EQ(groups, 2u);
  EXPECT_EQ(metrics.Read("orbitkv_codec_budget_used_bytes"), share);
  std::vector<GpuEncodeLane::Encoded> kept;
  std::mutex mu;
  std::vector<Status> statuses;
  for (uint64_t i = 0; i < groups; ++i) {
    GpuEncodeLane::Task t;
    t.id = Id(i);
    t.codec = probe.codec;
    RawObject(i, &t);
    t.encoded = [&](Result<GpuEncodeLane::Encoded> e) {
      std::lock_guard<std::mutex> l(mu);
      statuses.push_back(e.status());
      if (e.ok()) kept.push_back(std::move(e).value());  // held, as until a disk write completes
    };
    ASSERT_TRUE(lane->Submit(std::move(t)).ok());
  }
  GpuEncodeLane::Task more;
  more.id = Id(99);
  more.codec = probe.codec;
  RawObject(99, &more);
  more.encoded = [](Result<GpuEncodeLane::Encoded>) { ADD_FAILURE() << "a refused task ran"; };
  EXPECT_EQ(lane->Submit(std::move(more)).code(), StatusCode::kBusy);
  lane->Close();  // what was queued is cancelled, what was encoding finishes
  EXPECT_EQ(statuses.size(), groups);
  for (const Status& s : statuses) {
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kCancelled) << s.ToString();
  }
  for (const GpuEncodeLane::Encoded& e : kept) lane->Release(e.range, e.range_bytes);
  EXPECT_EQ(lane->arena_free_bytes(), lane->capacity());
  GpuEncodeLane::Task late;
  late.id = Id(100);
  late.codec = probe.codec;
  RawObject(100, &late);
  late.encoded = [](Result<GpuEncodeLane::Encoded>) { ADD_FAILURE() << "ran after Close"; };
  EXPECT_EQ(lane->Submit(std::move(late)).code(), StatusCode::kCancelled);
  lane.reset();
  EXPECT_EQ(metrics.Read("orbitkv_codec_budget_used_bytes"), 0);
  EXPECT_EQ(budget->reserved(), 0u);
}

TEST_F(EncodeLaneSeam, RefusesGroupsItCannotEncode) {
  auto lane = Lane(16u << 20);
  ASSERT_TRUE(lane);
  GpuEncodeLane::Task t;
  t.id = Id(1);
  t.codec = Codec(CodecId::kAns);
  RawObject(1, &t);
  t.sources[1] += 8;  // not 16-byte aligned
  t.encoded = [](Result<GpuEncodeLane::Encoded>) { ADD_FAILURE() << "refused task ran"; };
  EXPECT_EQ(lane->Submit(t).code(), StatusCode::kInvalidArgument);
  t.sources[1] -= 8;
  t.codec = Codec(CodecId::kNone);
  EXPECT_EQ(lane->Submit(t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lane->arena_free_bytes(), lane->capacity());
}

}  // namespace
}  // namespace orbitkv
