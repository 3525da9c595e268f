#include "gpu/staged_copy_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/copy_options.h"

namespace orbitkv::gpu {
namespace {

uint64_t Addr(const uint8_t* p) { return reinterpret_cast<uint64_t>(p); }

// Runs `plan` on the CPU the way the CUDA mover does, with one staging buffer
// per chunk: to the device, span copies host -> staging then piece copies
// staging -> device; to the host, the reverse. Direct ops are copied as they are.
void Execute(const StagedCopyPlan& plan, CopyDirection dir, const StagingShape& shape) {
  const bool to_device = dir == CopyDirection::kToDevice;
  for (const StagedCopyPlan::Chunk& c : plan.chunks) {
    ASSERT_LE(c.staging_bytes, shape.chunk_bytes);
    std::vector<uint8_t> staging(c.staging_bytes, 0xEE);
    auto spans = [&] {
      for (size_t i = c.span_begin; i < c.span_end; ++i) {
        const auto& s = plan.spans[i];
        ASSERT_LE(s.staging_offset + s.bytes, c.staging_bytes);
        ASSERT_EQ(s.staging_offset % shape.align, s.host % shape.align);
        auto* host = reinterpret_cast<uint8_t*>(s.host);
        if (to_device) {
          std::memcpy(staging.data() + s.staging_offset, host, s.bytes);
        } else {
          std::memcpy(host, staging.data() + s.staging_offset, s.bytes);
        }
      }
    };
    auto pieces = [&] {
      for (size_t i = c.piece_begin; i < c.piece_end; ++i) {
        const auto& p = plan.pieces[i];
        ASSERT_LE(p.staging_offset + p.bytes, c.staging_bytes);
        auto* dev = reinterpret_cast<uint8_t*>(p.device);
        if (to_device) {
          std::memcpy(dev, staging.data() + p.staging_offset, p.bytes);
        } else {
          std::memcpy(staging.data() + p.staging_offset, dev, p.bytes);
        }
      }
    };
    if (to_device) {
      spans();
      pieces();
    } else {
      pieces();
      spans();
    }
  }
  for (const CopyOp& op : plan.direct) {
    std::memcpy(reinterpret_cast<void*>(op.dst), reinterpret_cast<const void*>(op.src), op.bytes);
  }
}

// Objects as the pool holds them (a header, then 512-aligned segments), each
// slot copied to its own page: what a restore (or, reversed, a publish) does.
struct Scene {
  std::vector<uint8_t> host, pages;
  std::vector<CopyOp> ops;  // to the device; swap src/dst for to the host
};

Scene MakeScene(std::mt19937_64& rng, uint32_t objects, uint32_t slots, uint64_t slot_bytes,
                uint64_t header_bytes, uint64_t object_gap) {
  Scene s;
  const uint64_t seg = (slot_bytes + 511) / 512 * 512;
  const uint64_t object = header_bytes + slots * seg;
  s.host.resize(objects * (object + object_gap) + 4096);
  s.pages.resize(uint64_t{objects} * slots * slot_bytes + 4096);
  for (auto& b : s.host) b = static_cast<uint8_t>(rng());
  std::vector<uint64_t> page_order(uint64_t{objects} * slots);
  for (uint64_t i = 0; i < page_order.size(); ++i) page_order[i] = i;
  std::shuffle(page_order.begin(), page_order.end(), rng);
  for (uint32_t o = 0; o < objects; ++o) {
    const uint64_t base = o * (object + object_gap);
    for (uint32_t k = 0; k < slots; ++k) {
      const uint64_t page = page_order[uint64_t{o} * slots + k];
      s.ops.push_back({Addr(s.pages.data()) + page * slot_bytes,
                       Addr(s.host.data()) + base + header_bytes + k * seg, slot_bytes});
    }
  }
  std::shuffle(s.ops.begin(), s.ops.end(), rng);
  return s;
}

// A random scene (1..max_objects objects of 1..64 slots of 1 byte to 40 KiB,
// apart by 0 to 20000 bytes) and a random staging shape for it: chunks of 1 to
// max_chunk_mib MiB, sometimes a low direct threshold (so that some ops of a
// call go direct), a gap of up to 8 KiB read along.
Scene MakeRandomScene(std::mt19937_64& rng, uint32_t max_objects, uint64_t max_chunk_mib,
                      StagingShape* shape) {
  const uint32_t objects = 1 + rng() % max_objects;
  const uint32_t slots = 1 + rng() % 64;
  const uint64_t slot_bytes = 1 + rng() % (rng() % 2 ? 4096 : (40 << 10));
  const uint64_t gap = rng() % 3 == 0 ? 0 : rng() % 20000;
  shape->chunk_bytes = (1 + rng() % max_chunk_mib) << 20;
  shape->direct_min_bytes =
      rng() % 3 == 0 ? 16 << 10 : std::min<uint64_t>(1 << 20, shape->chunk_bytes / 2);
  shape->max_gap = rng() % 8192;
  return MakeScene(rng, objects, slots, slot_bytes, 512 * (1 + rng() % 8), gap);
}

TEST(StagedCopyPlanTest, ContiguousObjectIsOneSpanPerChunk) {
  std::mt19937_64 rng(1);
  // An 8B model's block: 64 slots of 32 KiB after a 4 KiB header.
  Scene s = MakeScene(rng, 8, 64, 32 << 10, 4096, 1 << 20);
  StagingShape shape;
  const StagedCopyPlan plan = PlanStagedCopy(s.ops, CopyDirection::kToDevice, shape);
  EXPECT_EQ(plan.pieces.size(), s.ops.size());
  EXPECT_TRUE(plan.direct.empty());
  // 16 MiB of objects 1 MiB apart (never joined): chunks are packed full, so
  // an object at a chunk's end continues as a second span in the next chunk.
  EXPECT_EQ(plan.chunks.size(), 3u);
  EXPECT_EQ(plan.spans.size(), 8u + plan.chunks.size() - 1);
  EXPECT_EQ(plan.host_bytes, 8u * 64 * (32 << 10));
  for (const auto& c : plan.chunks) EXPECT_LE(c.staging_bytes, shape.chunk_bytes);
}

TEST(StagedCopyPlanTest, ToDeviceReadsGapsAlongToHostNever) {
  std::mt19937_64 rng(2);
  // 1000-byte slots: 24 bytes of padding after each segment.
  Scene s = MakeScene(rng, 4, 16, 1000, 4096, 0);
  StagingShape shape;
  const StagedCopyPlan in = PlanStagedCopy(s.ops, CopyDirection::kToDevice, shape);
  // One span per object: the 24-byte padding is read along, the next
  // object's 4 KiB header plus padding (4120 bytes) is over max_gap.
  EXPECT_EQ(in.spans.size(), 4u);
  shape.max_gap = 8192;
  EXPECT_EQ(PlanStagedCopy(s.ops, CopyDirection::kToDevice, shape).spans.size(), 1u);
  std::vector<CopyOp> out_ops;
  for (const CopyOp& op : s.ops) out_ops.push_back({op.src, op.dst, op.bytes});
  const StagedCopyPlan out = PlanStagedCopy(out_ops, CopyDirection::kToHost, shape);
  EXPECT_EQ(out.spans.size(), s.ops.size());  // never writes a padding byte
}

TEST(StagedCopyPlanTest, LargeOpsGoDirect) {
  std::vector<uint8_t> host(3 << 20), dev(3 << 20);
  const std::vector<CopyOp> ops = {
      {Addr(dev.data()), Addr(host.data()), 2 << 20},
      {Addr(dev.data()) + (2 << 20), Addr(host.data()) + (2 << 20), 4096}};
  StagingShape shape;
  const StagedCopyPlan plan = PlanStagedCopy(ops, CopyDirection::kToDevice, shape);
  ASSERT_EQ(plan.direct.size(), 1u);
  EXPECT_EQ(plan.direct[0].bytes, 2u << 20);
  EXPECT_EQ(plan.pieces.size(), 1u);
}

// Regression for the mover's contract: every staged byte lands exactly where
// the op says, and a copy to the host writes nothing outside the ops.
TEST(StagedCopyPlanTest, RandomScenesAreByteExactBothWays) {
  std::mt19937_64 rng(3);
  for (int round = 0; round < 40; ++round) {
    StagingShape shape;
    Scene s = MakeRandomScene(rng, /*max_objects=*/8, /*max_chunk_mib=*/4, &shape);
    // To the device.
    std::vector<uint8_t> want(s.pages.size(), 0x11);
    s.pages.assign(s.pages.size(), 0x11);
    for (const CopyOp& op : s.ops) {
      std::memcpy(want.data() + (op.dst - Addr(s.pages.data())),
                  reinterpret_cast<const void*>(op.src), op.bytes);
    }
    Execute(PlanStagedCopy(s.ops, CopyDirection::kToDevice, shape), CopyDirection::kToDevice,
            shape);
    ASSERT_EQ(s.pages, want) << "round " << round;
    // To the host: pages -> objects, into a host buffer of other bytes.
    for (auto& b : s.pages) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> host_want = s.host;
    std::vector<CopyOp> back;
    for (const CopyOp& op : s.ops) {
      back.push_back({op.src, op.dst, op.bytes});
      std::memcpy(host_want.data() + (op.src - Addr(s.host.data())),
                  reinterpret_cast<const void*>(op.dst), op.bytes);
    }
    Execute(PlanStagedCopy(back, CopyDirection::kToHost, shape), CopyDirection::kToHost, shape);
    ASSERT_EQ(s.host, host_want) << "round " << round;
  }
}

// The planner cuts a call into one run per object and concatenates the runs
// in host order when they do not interleave (instead of sorting every op):
// objects in any order, objects some of whose ops interleave with another's,
// and runs that join across objects (no gap between them) plan exactly as
// the same ops sorted by host address would, and copy byte for byte.
TEST(StagedCopyPlanTest, ObjectsInAnyOrderPlanAsTheSortedOps) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 30; ++round) {
    const uint32_t objects = 2 + rng() % 12, slots = 1 + rng() % 40;
    const uint64_t slot_bytes = 512 * (1 + rng() % 16);
    const uint64_t gap = round % 3 == 0 ? 0 : 4096 * (rng() % 4);
    StagingShape shape;
    shape.chunk_bytes = (1 + rng() % 2) << 20;
    shape.max_gap = rng() % 2 ? 0 : 4096;
    Scene s = MakeScene(rng, objects, slots, slot_bytes, 512 * (1 + rng() % 4), gap);
    std::sort(s.ops.begin(), s.ops.end(),
              [](const CopyOp& a, const CopyOp& b) { return a.src < b.src; });
    const StagedCopyPlan want = PlanStagedCopy(s.ops, CopyDirection::kToDevice, shape);
    // Objects as units in a shuffled order; in odd rounds two of them swap
    // one op each (their runs interleave).
    std::vector<std::vector<CopyOp>> units;
    for (uint32_t o = 0; o < objects; ++o) {
      units.emplace_back(s.ops.begin() + o * slots, s.ops.begin() + (o + 1) * slots);
    }
    std::shuffle(units.begin(), units.end(), rng);
    if (round % 2 == 1) std::swap(units[0].back(), units[1].front());
    std::vector<CopyOp> ops;
    for (const auto& u : units) ops.insert(ops.end(), u.begin(), u.end());
    const StagedCopyPlan got = PlanStagedCopy(ops, CopyDirection::kToDevice, shape);
    ASSERT_EQ(got.spans.size(), want.spans.size()) << "round " << round;
    for (size_t i = 0; i < got.spans.size(); ++i) {
      EXPECT_EQ(got.spans[i].host, want.spans[i].host) << round << " span " << i;
      EXPECT_EQ(got.spans[i].bytes, want.spans[i].bytes) << round << " span " << i;
      EXPECT_EQ(got.spans[i].staging_offset, want.spans[i].staging_offset) << round;
    }
    ASSERT_EQ(got.pieces.size(), want.pieces.size()) << "round " << round;
    for (size_t i = 0; i < got.pieces.size(); ++i) {
      EXPECT_EQ(got.pieces[i].device, want.pieces[i].device) << round << " piece " << i;
      EXPECT_EQ(got.pieces[i].staging_offset, want.pieces[i].staging_offset) << round;
    }
    ASSERT_EQ(got.chunks.size(), want.chunks.size()) << "round " << round;
    std::vector<uint8_t> expect(s.pages.size(), 0x22);
    s.pages.assign(s.pages.size(), 0x22);
    for (const CopyOp& op : ops) {
      std::memcpy(expect.data() + (op.dst - Addr(s.pages.data())),
                  reinterpret_cast<const void*>(op.src), op.bytes);
    }
    Execute(got, CopyDirection::kToDevice, shape);
    ASSERT_EQ(s.pages, expect) << "round " << round;
  }
}

// Fills `bytes` with random bytes, eight per draw.
void Scribble(std::mt19937_64& rng, std::vector<uint8_t>& bytes) {
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(bytes.data() + i, &r, std::min<size_t>(8, bytes.size() - i));
  }
}

// A chunk as the mover enqueues it: its spans and pieces, by value.
struct ChunkCopy {
  std::vector<StagedCopyPlan::Span> spans;
  std::vector<StagedCopyPlan::Piece> pieces;
  uint64_t staging_bytes = 0;
};

ChunkCopy CopyChunk(const StagedCopyPlan& plan, size_t i) {
  const StagedCopyPlan::Chunk& c = plan.chunks[i];
  return {{plan.spans.begin() + c.span_begin, plan.spans.begin() + c.span_end},
          {plan.pieces.begin() + c.piece_begin, plan.pieces.begin() + c.piece_end},
          c.staging_bytes};
}

void ExpectSameChunk(const ChunkCopy& a, const ChunkCopy& b, const std::string& where) {
  ASSERT_EQ(a.spans.size(), b.spans.size()) << where;
  ASSERT_EQ(a.pieces.size(), b.pieces.size()) << where;
  EXPECT_EQ(a.staging_bytes, b.staging_bytes) << where;
  for (size_t i = 0; i < a.spans.size(); ++i) {
    EXPECT_EQ(a.spans[i].host, b.spans[i].host) << where;
    EXPECT_EQ(a.spans[i].bytes, b.spans[i].bytes) << where;
    EXPECT_EQ(a.spans[i].staging_offset, b.spans[i].staging_offset) << where;
  }
  for (size_t i = 0; i < a.pieces.size(); ++i) {
    EXPECT_EQ(a.pieces[i].device, b.pieces[i].device) << where;
    EXPECT_EQ(a.pieces[i].staging_offset, b.pieces[i].staging_offset) << where;
    EXPECT_EQ(a.pieces[i].bytes, b.pieces[i].bytes) << where;
  }
}

// CudaDevice::CopyAsync plans a call one window of ops at a time and enqueues
// each window's final chunks before planning the next. So: a chunk reported
// final never changes afterwards (the mover has already copied it), and the
// plan of the whole call, however it was cut into windows, copies every byte
// where its op says and, to the host, nothing else. One planner serves every
// round (Reset keeps its vectors), as the per-thread one does.
TEST(StagedCopyPlanTest, PlannerFedInWindowsKeepsFinalChunksAndIsByteExact) {
  std::mt19937_64 rng(11);
  StagedCopyPlanner planner;
  for (int round = 0; round < 40; ++round) {
    StagingShape shape;
    Scene s = MakeRandomScene(rng, /*max_objects=*/6, /*max_chunk_mib=*/2, &shape);
    // Objects in order, their slots in order (as a Restore's ops come), or
    // shuffled (any order is allowed).
    if (round % 2 == 0) {
      std::sort(s.ops.begin(), s.ops.end(),
                [](const CopyOp& a, const CopyOp& b) { return a.src < b.src; });
    }
    for (const CopyDirection dir : {CopyDirection::kToDevice, CopyDirection::kToHost}) {
      const bool to_device = dir == CopyDirection::kToDevice;
      std::vector<CopyOp> ops = s.ops;
      if (!to_device) {
        for (CopyOp& op : ops) std::swap(op.src, op.dst);
      }
      Scribble(rng, s.pages);
      Scribble(rng, s.host);
      std::vector<uint8_t> want_pages = s.pages, want_host = s.host;
      for (const CopyOp& op : ops) {
        std::vector<uint8_t>& into = to_device ? want_pages : want_host;
        const uint8_t* base = to_device ? s.pages.data() : s.host.data();
        std::memcpy(into.data() + (op.dst - Addr(base)), reinterpret_cast<const void*>(op.src),
                    op.bytes);
      }
      planner.Reset(dir, shape);
      std::vector<ChunkCopy> finals;  // as reported final, in order
      const std::string where = "round " + std::to_string(round) + (to_device ? " in" : " out");
      for (size_t begin = 0; begin < ops.size();) {
        const size_t n = 1 + rng() % (rng() % 4 == 0 ? ops.size() : 40);
        const size_t end = std::min(ops.size(), begin + n);
        planner.Add(std::span<const CopyOp>(ops).subspan(begin, end - begin));
        begin = end;
        if (begin == ops.size()) planner.Finish();
        ASSERT_GE(planner.final_chunks(), finals.size()) << where;
        for (size_t c = finals.size(); c < planner.final_chunks(); ++c) {
          finals.push_back(CopyChunk(planner.plan(), c));
        }
      }
      const StagedCopyPlan& plan = planner.plan();
      ASSERT_EQ(finals.size(), plan.chunks.size()) << where;
      uint64_t pieces = 0, piece_bytes = 0;
      for (size_t c = 0; c < finals.size(); ++c) {
        ExpectSameChunk(finals[c], CopyChunk(plan, c), where + " chunk " + std::to_string(c));
        for (const auto& p : finals[c].pieces) piece_bytes += p.bytes;
        pieces += finals[c].pieces.size();
      }
      uint64_t direct_bytes = 0, op_bytes = 0;
      for (const CopyOp& op : plan.direct) direct_bytes += op.bytes;
      for (const CopyOp& op : ops) op_bytes += op.bytes;
      EXPECT_EQ(pieces + plan.direct.size(), ops.size()) << where;
      EXPECT_EQ(piece_bytes + direct_bytes, op_bytes) << where;
      Execute(plan, dir, shape);
      ASSERT_EQ(s.pages, want_pages) << where;
      ASSERT_EQ(s.host, want_host) << where;
    }
  }
}

// A later window's op below the open span's start (windows are sorted only
// within themselves) must start a span of its own: joining would place it at
// a staging offset before the span's (an unsigned underflow), copying other
// bytes into its page.
TEST(StagedCopyPlanTest, PlannerNeverJoinsALaterWindowsOpBelowTheOpenSpan) {
  std::vector<uint8_t> host(3 * 4096), pages(2 * 4096, 0);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  const CopyOp high{Addr(pages.data()), Addr(host.data()) + 8192, 4096};
  const CopyOp low{Addr(pages.data()) + 4096, Addr(host.data()), 4096};
  StagingShape shape;
  shape.max_gap = 8192;  // within the gap of each other: one span if sorted together
  StagedCopyPlanner planner;
  planner.Reset(CopyDirection::kToDevice, shape);
  planner.Add(std::span<const CopyOp>(&high, 1));
  planner.Add(std::span<const CopyOp>(&low, 1));
  planner.Finish();
  EXPECT_EQ(planner.plan().spans.size(), 2u);
  Execute(planner.plan(), CopyDirection::kToDevice, shape);
  EXPECT_EQ(0, std::memcmp(pages.data(), host.data() + 8192, 4096));
  EXPECT_EQ(0, std::memcmp(pages.data() + 4096, host.data(), 4096));
}

TEST(GpuCopyOptionsTest, DefaultsAndErrors) {
  Result<GpuCopyOptions> d = ParseGpuCopyOptions(nullptr, nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->mode, HostCopyMode::kStaged);
  EXPECT_EQ(d->staging_bytes, 8u << 20);
  EXPECT_EQ(d->StagingBudget(), 32u << 20);
  Result<GpuCopyOptions> e = ParseGpuCopyOptions("engines", "16mib");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->mode, HostCopyMode::kEngines);
  EXPECT_EQ(e->staging_bytes, 16u << 20);
  EXPECT_EQ(e->StagingBudget(), 0u);
  EXPECT_EQ(ParseGpuCopyOptions("kernel", "")->mode, HostCopyMode::kKernel);
  Result<GpuCopyOptions> bad = ParseGpuCopyOptions("dma", nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ORBITKV_GPU_COPY='dma'"), std::string::npos);
  EXPECT_FALSE(ParseGpuCopyOptions(nullptr, "512kib").ok());
  EXPECT_FALSE(ParseGpuCopyOptions(nullptr, "lots").ok());
  EXPECT_EQ(d->direct_bytes, 32u << 10);
  EXPECT_EQ(ParseGpuCopyOptions(nullptr, nullptr, "1mib")->direct_bytes, 1u << 20);
  Result<GpuCopyOptions> small = ParseGpuCopyOptions(nullptr, nullptr, "1kib");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("ORBITKV_GPU_COPY_DIRECT='1kib'"), std::string::npos);
  EXPECT_EQ(d->wait_spin_us, 100u);
  EXPECT_EQ(ParseGpuCopyOptions(nullptr, nullptr, nullptr, "0")->wait_spin_us, 0u);
  EXPECT_EQ(ParseGpuCopyOptions(nullptr, nullptr, nullptr, "2500")->wait_spin_us, 2500u);
  for (const char* v : {"-1", "100001", "50us", " 5", "lots"}) {
    Result<GpuCopyOptions> spin = ParseGpuCopyOptions(nullptr, nullptr, nullptr, v);
    ASSERT_FALSE(spin.ok()) << v;
    EXPECT_NE(spin.status().message().find("ORBITKV_GPU_WAIT_SPIN_US"), std::string::npos) << v;
  }
  EXPECT_EQ(d->engine_first_batch, 32u);
  EXPECT_EQ(ParseGpuCopyOptions(nullptr, nullptr, nullptr, nullptr, "0")->engine_first_batch, 0u);
  EXPECT_EQ(ParseGpuCopyOptions(nullptr, nullptr, nullptr, nullptr, "8")->engine_first_batch, 8u);
  EXPECT_EQ(ParseGpuCopyOptions(nullptr, nullptr, nullptr, nullptr, "128")->engine_first_batch,
            128u);
  for (const char* v : {"-1", "129", "8ops", ""}) {
    Result<GpuCopyOptions> batch = ParseGpuCopyOptions(nullptr, nullptr, nullptr, nullptr, v);
    if (*v == '\0') {
      EXPECT_TRUE(batch.ok());  // unset
      continue;
    }
    ASSERT_FALSE(batch.ok()) << v;
    EXPECT_NE(batch.status().message().find("ORBITKV_GPU_COPY_FIRST_BATCH='"), std::string::npos)
        << v;
  }
}

}  // namespace
}  // namespace orbitkv::gpu
