// GpuDecodeLane (manager/gpu_decode_lane.h) on the gates' platform: the CPU
// codec behind the fake platform's FrameDecoder (CI), CudaDecoder on CUDA
// (gpu_tier_gate_cuda_test). Objects copied from pinned host memory decode in
// many batches through both pipeline stages to the CPU decoder's bytes; an
// object whose segment it does not restore fails its CRC is a Corruption of
// the whole object, counted, with its pages untouched; Close decodes what was
// queued; the budget and the arena come back.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_test_util.h"
#include "gpu_tier/gate_env.h"
#include "manager/gpu_decode_lane.h"
#include "orbitkv/metrics.h"
#include "store/object_format.h"

namespace orbitkv {
namespace {

using codec::CodecId;

constexpr uint8_t kPoison = 0x3b;

class DecodeLaneSeam : public ::testing::Test {
 protected:
  static constexpr uint64_t kSlot0 = 32768, kSlot1 = 8192;
  std::unique_ptr<testing::GateEnv> env;
  gpu::Device* dev = nullptr;
  MetricsRegistry metrics;
  std::unique_ptr<CodecMetrics> codec_metrics;
  std::unique_ptr<CodecBudget> budget;
  std::vector<testing::GateEnv::Pages> held;
  // One pinned region for every object, as the pool holds them (one
  // allocation; the staged mover reads along small gaps between a call's
  // objects, which it may only do inside one allocation).
  static constexpr uint64_t kHostBytes = 8u << 20;
  uint8_t* host = nullptr;
  uint64_t host_used = 0;

  void SetUp() override {
    env = testing::CreateGateEnv();
    if (std::string why = env->Unavailable(); !why.empty()) GTEST_SKIP() << why;
    Result<gpu::Device*> d = env->inner()->device(0);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev = *d;
    codec_metrics = std::make_unique<CodecMetrics>(metrics);
    budget = std::make_unique<CodecBudget>(64u << 20, codec_metrics->budget_used);
  }
  void TearDown() override {
    if (host) EXPECT_TRUE(dev->FreeHost(host).ok());
    for (auto& p : held) env->Free(p);
    if (budget) EXPECT_EQ(budget->reserved(), 0u);
    if (env) EXPECT_EQ(env->Leaks(), "");
  }
  // max_frames 8: four objects of two segments per batch at most.
  std::unique_ptr<GpuDecodeLane> Lane(uint32_t max_frames = 8, uint64_t max_batch_bytes = 0,
                                      Histogram* enqueues = nullptr) {
    GpuDecodeLaneOptions o;
    o.max_batch_bytes = max_batch_bytes;
    o.cost_enqueue = enqueues;
    o.device = dev;
    o.budget_bytes = 8u << 20;
    o.budget = budget.get();
    o.metrics = codec_metrics.get();
    o.max_frames = std::max<uint32_t>(max_frames, kMaxSlotsPerGroup);
    auto l = GpuDecodeLane::Create(o);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? std::move(l).value() : nullptr;
  }
  gpu::DevPtr Poisoned(uint64_t bytes) {
    held.push_back(env->Allocate(bytes));
    env->Write(held.back().base, std::vector<uint8_t>(bytes, kPoison).data(), bytes);
    return held.back().base;
  }
  std::vector<uint8_t> Get(gpu::DevPtr p, uint64_t n) {
    std::vector<uint8_t> out(n);
    env->Read(out.data(), p, n);
    return out;
  }
  static NamespaceCodec Codec(CodecId id) { return {id, {codec::DType::kBf16, 128}}; }

  // An encoded object of two KV-like slots in pinned host memory (as the
  // pool holds it), its parsed header, and each slot's CPU-decoded bytes.
  struct Object {
    const uint8_t* bytes = nullptr;
    uint64_t size = 0;
    ParsedHeader header;
    std::vector<std::vector<uint8_t>> decoded;
  };
  Object Make(const NamespaceCodec& c, uint64_t seed, uint32_t corrupt_slot = ~0u) {
    const std::vector<uint64_t> slots{kSlot0, kSlot1};
    const ObjectShape shape = MakeObjectShape(slots);
    std::vector<uint8_t> raw(shape.object_size, 0);
    for (uint32_t k = 0; k < 2; ++k) {
      const std::vector<uint8_t> b =
          codec::testing::KvLikeSegment(slots[k] / 2, codec::DType::kBf16, 128, seed + k);
      std::copy(b.begin(), b.end(), raw.begin() + shape.segments[k].offset);
    }
    ObjectId id;
    id.ns = 9;
    id.key.bytes[0] = static_cast<uint8_t>(seed);
    WriteObjectHeader(id, slots, ObjectCodec{}, SegmentCrcs(raw, slots), raw);
    CodecBuffer enc;
    Result<uint64_t> n = EncodeObject(c, raw, &enc, *codec_metrics);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    Object o;
    o.size = n.ok() ? *n : 0;
    if (!host) {
      Result<uint8_t*> h = dev->AllocateHost(kHostBytes);
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      if (!h.ok()) return o;
      host = *h;
    }
    EXPECT_LE(host_used + o.size, kHostBytes);
    if (!n.ok() || host_used + o.size > kHostBytes) return o;
    uint8_t* const at = host + host_used;
    host_used = AlignUp(host_used + o.size, 4096);
    std::memcpy(at, enc.data(), o.size);
    Result<ParsedHeader> ph = ParseObjectHeader({at, o.size}, o.size);
    EXPECT_TRUE(ph.ok()) << ph.status().ToString();
    o.header = *ph;
    for (uint32_t k = 0; k < 2; ++k) {
      std::vector<uint8_t> d(slots[k]);
      EXPECT_TRUE(DecodeSegment(c, o.header, {at, o.size}, k, d, *codec_metrics).ok());
      o.decoded.push_back(std::move(d));
    }
    if (corrupt_slot < 2) at[o.header.segments[corrupt_slot].offset + 100] ^= 0x10;
    o.bytes = at;
    return o;
  }
  // The lane task restoring `slots` of `o` into `pages`.
  GpuDecodeLane::Task Task(GpuDecodeLane& lane, const NamespaceCodec& c, const Object& o,
                           const std::vector<uint32_t>& slots,
                           const std::vector<gpu::DevPtr>& pages,
                           std::function<void(Status)> done) {
    GpuDecodeLane::Task t;
    std::optional<gpu::DevPtr> at = lane.TryTake(o.size);
    EXPECT_TRUE(at.has_value());
    t.input = at.value_or(0);
    t.input_bytes = o.size;
    t.host_input = o.bytes;
    t.header = o.header;
    t.codec = c;
    for (size_t i = 0; i < slots.size(); ++i) {
      t.targets.push_back({slots[i], pages[i], slots[i] == 0 ? kSlot0 : kSlot1});
    }
    t.done = std::move(done);
    return t;
  }
};

struct Pending {
  Mutex mu;
  CondVar cv;
  int left GUARDED_BY(mu) = 0;
  std::vector<Status> results GUARDED_BY(mu);
  std::function<void(Status)> One(size_t i) {
    {
      MutexLock l(mu);
      ++left;
      if (results.size() <= i) results.resize(i + 1);
    }
    return [this, i](Status s) {
      MutexLock l(mu);
      results[i] = std::move(s);
      if (--left == 0) cv.NotifyAll();
    };
  }
  std::vector<Status> Wait() {
    MutexLock l(mu);
    while (left != 0) cv.Wait(mu);
    return results;
  }
};

TEST_F(DecodeLaneSeam, ObjectsOfManyBatchesDecodeToTheCpuBytes) {
  for (CodecId id : {CodecId::kAns, CodecId::kFp8, CodecId::kTurboQuant4}) {
    SCOPED_TRACE(std::string(codec::CodecName(id)));
    auto lane = Lane();
    ASSERT_TRUE(lane);
    const NamespaceCodec c = Codec(id);
    constexpr int kObjects = 20;
    std::vector<Object> objects;
    std::vector<std::vector<gpu::DevPtr>> pages;
    for (int i = 0; i < kObjects; ++i) {
      objects.push_back(Make(c, 100 + i));
      pages.push_back({Poisoned(kSlot0), Poisoned(kSlot1)});
    }
    const uint64_t decoded_before = codec_metrics->of(id).decode.bytes_out->Value();
    Pending p;
    // Five submissions of four: more batches than stages, so both run.
    for (int s = 0; s < kObjects; s += 4) {
      std::vector<GpuDecodeLane::Task> tasks;
      for (int i = s; i < s + 4; ++i) {
        tasks.push_back(Task(*lane, c, objects[i], {0, 1}, pages[i], p.One(i)));
      }
      lane->SubmitBatch(std::move(tasks));
    }
    const std::vector<Status> st = p.Wait();
    for (int i = 0; i < kObjects; ++i) {
      EXPECT_TRUE(st[i].ok()) << i << ": " << st[i].ToString();
      EXPECT_EQ(Get(pages[i][0], kSlot0), objects[i].decoded[0]) << i;
      EXPECT_EQ(Get(pages[i][1], kSlot1), objects[i].decoded[1]) << i;
    }
    EXPECT_EQ(codec_metrics->of(id).decode.bytes_out->Value() - decoded_before,
              kObjects * (kSlot0 + kSlot1));
    EXPECT_EQ(codec_metrics->of(id).decode.failures->Value(), 0u);
    lane->Close();
    lane.reset();
    EXPECT_EQ(budget->reserved(), 0u);
  }
}

// Restoring only slot 0 of an object whose slot 1 fails its header CRC: the
// whole object is Corruption (counted as a CRC failure), slot 0's page keeps
// its bytes, and the objects beside it in the batch decode.
TEST_F(DecodeLaneSeam, ASegmentItDoesNotRestoreFailingItsCrcFailsTheObjectUntouched) {
  auto lane = Lane();
  ASSERT_TRUE(lane);
  const NamespaceCodec c = Codec(CodecId::kFp8);
  const Object good = Make(c, 1), bad = Make(c, 2, /*corrupt_slot=*/1);
  const std::vector<gpu::DevPtr> good_page{Poisoned(kSlot0)}, bad_page{Poisoned(kSlot0)};
  Pending p;
  std::vector<GpuDecodeLane::Task> tasks;
  tasks.push_back(Task(*lane, c, bad, {0}, bad_page, p.One(0)));
  tasks.push_back(Task(*lane, c, good, {0}, good_page, p.One(1)));
  lane->SubmitBatch(std::move(tasks));
  const std::vector<Status> st = p.Wait();
  EXPECT_EQ(st[0].code(), StatusCode::kCorruption) << st[0].ToString();
  EXPECT_TRUE(st[1].ok()) << st[1].ToString();
  EXPECT_EQ(Get(bad_page[0], kSlot0), std::vector<uint8_t>(kSlot0, kPoison));
  EXPECT_EQ(Get(good_page[0], kSlot0), good.decoded[0]);
  EXPECT_EQ(codec_metrics->of(CodecId::kFp8).crc_failures->Value(), 1u);
  EXPECT_EQ(codec_metrics->of(CodecId::kFp8).decode.failures->Value(), 0u);
}

TEST_F(DecodeLaneSeam, CloseDecodesWhatWasQueuedAndLaterSubmitsAreCancelled) {
  auto lane = Lane();
  ASSERT_TRUE(lane);
  const NamespaceCodec c = Codec(CodecId::kAns);
  std::vector<Object> objects;
  std::vector<std::vector<gpu::DevPtr>> pages;
  for (int i = 0; i < 9; ++i) {
    objects.push_back(Make(c, 50 + i));
    pages.push_back({Poisoned(kSlot0), Poisoned(kSlot1)});
  }
  Pending p;
  std::vector<GpuDecodeLane::Task> tasks;
  for (int i = 0; i < 8; ++i)
    tasks.push_back(Task(*lane, c, objects[i], {0, 1}, pages[i], p.One(i)));
  lane->SubmitBatch(std::move(tasks));
  GpuDecodeLane::Task late = Task(*lane, c, objects[8], {0, 1}, pages[8], p.One(8));
  lane->Close();
  lane->Submit(std::move(late));
  const std::vector<Status> st = p.Wait();
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(st[i].ok()) << i << ": " << st[i].ToString();
    EXPECT_EQ(Get(pages[i][0], kSlot0), objects[i].decoded[0]) << i;
  }
  EXPECT_EQ(st[8].code(), StatusCode::kCancelled);
  EXPECT_EQ(Get(pages[8][0], kSlot0), std::vector<uint8_t>(kSlot0, kPoison));
  lane.reset();
  EXPECT_EQ(budget->reserved(), 0u);
}

// A batch's arena ranges come back only when it completes. A submission
// that filled the arena went to the GPU as one batch, so the lane ran one
// batch at a time with the other stages idle (the fp8 DRAM restore's lost
// H2D time). Batches now hold at most max_batch_bytes, by default a share of
// the arena that leaves room for the other stages.
TEST_F(DecodeLaneSeam, OneLargeSubmissionSpansSeveralBatches) {
  const NamespaceCodec c = Codec(CodecId::kFp8);
  {
    auto lane = Lane();
    ASSERT_TRUE(lane);
    EXPECT_LE(lane->max_batch_bytes() * (lane->stages() + 1), lane->capacity());
  }
  std::vector<Object> objects;
  std::vector<std::vector<gpu::DevPtr>> pages;
  for (int i = 0; i < 8; ++i) {
    objects.push_back(Make(c, 70 + i));
    pages.push_back({Poisoned(kSlot0), Poisoned(kSlot1)});
  }
  Histogram enqueues(LatencyBuckets());
  // Two objects per batch by bytes; max_frames would take all eight.
  auto lane = Lane(/*max_frames=*/64, 2 * AlignUp(objects[0].size, 4096), &enqueues);
  ASSERT_TRUE(lane);
  Pending p;
  std::vector<GpuDecodeLane::Task> tasks;
  for (int i = 0; i < 8; ++i) {
    tasks.push_back(Task(*lane, c, objects[i], {0, 1}, pages[i], p.One(i)));
  }
  lane->SubmitBatch(std::move(tasks));
  const std::vector<Status> st = p.Wait();
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(st[i].ok()) << i << ": " << st[i].ToString();
    EXPECT_EQ(Get(pages[i][0], kSlot0), objects[i].decoded[0]) << i;
    EXPECT_EQ(Get(pages[i][1], kSlot1), objects[i].decoded[1]) << i;
  }
  EXPECT_EQ(enqueues.Snap().count, 4u);
  lane.reset();
  EXPECT_EQ(budget->reserved(), 0u);
}

}  // namespace
}  // namespace orbitkv
