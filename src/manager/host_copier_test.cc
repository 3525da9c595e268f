// HostCopier: every byte lands whoever copies it (caller, helpers, a full
// helper lane), and concurrent callers do not mix their jobs.
#include "manager/host_copier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "orbitkv/metrics.h"

namespace orbitkv {
namespace {

struct Case {
  std::vector<uint8_t> src, dst;
  std::vector<gpu::CopyOp> ops;
};

// `n` ops of the given sizes between distinct, shuffled places of two buffers.
Case MakeCase(const std::vector<uint64_t>& sizes, uint32_t seed) {
  Case c;
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  c.src.resize(total);
  c.dst.assign(total, 0xEE);
  std::mt19937 rng(seed);
  for (auto& b : c.src) b = static_cast<uint8_t>(rng());
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint64_t> dst_at(sizes.size());
  uint64_t at = 0;
  for (size_t i : order) {
    dst_at[i] = at;
    at += sizes[i];
  }
  at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    c.ops.push_back({reinterpret_cast<gpu::DevPtr>(c.dst.data() + dst_at[i]),
                     reinterpret_cast<gpu::DevPtr>(c.src.data() + at), sizes[i]});
    at += sizes[i];
  }
  return c;
}

bool Landed(const Case& c) {
  for (const gpu::CopyOp& op : c.ops) {
    if (std::memcmp(reinterpret_cast<const void*>(op.dst), reinterpret_cast<const void*>(op.src),
                    op.bytes) != 0) {
      return false;
    }
  }
  return true;
}

TEST(HostCopier, EveryByteLandsWithAnyNumberOfHelpers) {
  const std::vector<uint64_t> sizes = {32768, 1000, 4096, 3u << 20, 37u << 20, 1, 65536, 24676};
  for (uint32_t threads : {0u, 1u, 3u, 8u}) {
    MetricsRegistry reg;
    HostCopier copier({threads, 1u << 20, reg.GetCounter("helped", "h")});
    Case c = MakeCase(sizes, threads);
    copier.Copy(c.ops);
    EXPECT_TRUE(Landed(c)) << threads << " helpers";
  }
}

TEST(HostCopier, ASmallCopyStaysOnTheCallersThread) {
  MetricsRegistry reg;
  Counter* helped = reg.GetCounter("helped", "h");
  HostCopier copier({4, 4u << 20, helped});
  Case c = MakeCase({32768, 32768, 65536}, 1);  // under one chunk
  copier.Copy(c.ops);
  EXPECT_TRUE(Landed(c));
  EXPECT_EQ(helped->Value(), 0u);
}

TEST(HostCopier, HelpersTakeChunksOfALargeCopy) {
  MetricsRegistry reg;
  Counter* helped = reg.GetCounter("helped", "h");
  HostCopier copier({3, 64u << 10, helped});
  uint64_t total = 0;
  for (int round = 0; round < 50 && helped->Value() == 0; ++round) {
    Case c = MakeCase(std::vector<uint64_t>(64, 1u << 20), round);
    copier.Copy(c.ops);
    ASSERT_TRUE(Landed(c)) << "round " << round;
    total += 64u << 20;
  }
  EXPECT_GT(helped->Value(), 0u) << "no helper took a chunk of " << total << " bytes";
  EXPECT_LE(helped->Value(), total);
}

TEST(HostCopier, ConcurrentCallersEachGetTheirOwnBytes) {
  MetricsRegistry reg;
  HostCopier copier({2, 256u << 10, reg.GetCounter("helped", "h")});
  std::vector<std::thread> callers;
  std::vector<int> ok(6, 0);
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        Case c = MakeCase({3u << 20, 32768, 1u << 20, 5000}, 100 * t + i);
        copier.Copy(c.ops);
        if (!Landed(c)) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& th : callers) th.join();
  for (int t = 0; t < 6; ++t) EXPECT_EQ(ok[t], 1) << "caller " << t;
}

TEST(HostCopier, AnEmptyCopyIsNothing) {
  HostCopier copier({2, 1u << 20, nullptr});
  copier.Copy({});
}

}  // namespace
}  // namespace orbitkv
