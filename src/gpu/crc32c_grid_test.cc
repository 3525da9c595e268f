// The GPU CRC32C's decomposition (gpu/crc32c_grid.h) run on the CPU over an
// emulated grid, exactly as gpu/crc32c_kernel.cu runs it: launches planned
// kCrcOpsPerLaunch ranges at a time, every block of the piece kernel (each
// thread's leaf contribution, XORed over the block), then the combine kernel;
// the results against ISA-L's CRC32C (store/crc32c.h) for edge lengths around
// leaf and piece boundaries, thousands of random lengths and start offsets
// (every alignment), and batches with empty ranges. Needs no GPU.
#include "gpu/crc32c_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "store/crc32c.h"

namespace orbitkv::gpu {
namespace {

struct Range {
  const uint8_t* data;
  uint64_t bytes;
};

const CrcSliceTables& Tables() {
  static const CrcSliceTables t = [] {
    CrcSliceTables s{};
    for (uint32_t b = 0; b < 256; ++b) FillCrcSliceEntry(&s, b);
    return s;
  }();
  return t;
}

constexpr CrcShiftTables kShifts = MakeCrcShiftTables();

// LaunchCrc32c with the kernels' bodies run block by block, thread by thread.
std::vector<uint32_t> EmulateLaunchCrc32c(const std::vector<Range>& ranges) {
  std::vector<uint64_t> data, bytes;
  for (const Range& r : ranges) {
    data.push_back(reinterpret_cast<uint64_t>(r.data));
    bytes.push_back(r.bytes);
  }
  std::vector<uint32_t> out(ranges.size(), 0xdeadbeef);
  for (size_t first = 0; first < ranges.size(); first += kCrcOpsPerLaunch) {
    const size_t n = std::min(kCrcOpsPerLaunch, ranges.size() - first);
    CrcLaunch l;
    EXPECT_TRUE(PlanCrcLaunch(data.data() + first, bytes.data() + first, n, &l));
    const uint32_t pieces = l.first_piece[n];
    std::vector<uint32_t> partial(pieces);
    for (uint32_t g = 0; g < pieces; ++g) {  // CrcPieceKernel
      uint32_t v = 0;
      for (uint32_t t = 0; t < kCrcThreads; ++t)
        v ^= CrcLeafContribution(Tables(), kShifts, l, g, t);
      partial[g] = v;
    }
    for (uint32_t r = 0; r < n; ++r) {  // CrcCombineKernel
      uint32_t acc = 0;
      const uint64_t count = l.first_piece[r + 1] - l.first_piece[r];
      EXPECT_EQ(count, CrcPieces(l.bytes[r]));
      for (uint64_t q = 0; q < count; ++q) {
        acc ^= CrcPieceContribution(kShifts, l, r, q, partial[l.first_piece[r] + q]);
      }
      out[first + r] = CrcFinish(l, r, acc);
    }
  }
  return out;
}

void ExpectEqualsIsal(const std::vector<Range>& ranges, const uint8_t* base) {
  const std::vector<uint32_t> got = EmulateLaunchCrc32c(ranges);
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_EQ(got[i], Crc32c({ranges[i].data, ranges[i].bytes}))
        << "range " << i << ": " << ranges[i].bytes << " bytes at offset " << ranges[i].data - base;
  }
}

std::vector<uint8_t> RandomBuffer(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Crc32cGridTest, ShiftTablesAreTheOperatorsTheyName) {
  for (uint32_t k = 0; k < kCrcThreads; ++k) {
    EXPECT_EQ(kShifts.leaf[k], crc32c::ShiftOperator(uint64_t{k} * kCrcLeafBytes)) << k;
  }
  for (int b = 0; b < 40; ++b) {
    EXPECT_EQ(kShifts.piece_pow[b], crc32c::ShiftOperator(kCrcPieceBytes << b)) << b;
  }
}

TEST(Crc32cGridTest, CheckValue) {
  const uint8_t s[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  EXPECT_EQ(EmulateLaunchCrc32c({{s, 9}})[0], 0xE3069283u);
}

TEST(Crc32cGridTest, EdgeLengthsAtEveryAlignment) {
  const std::vector<uint8_t> buf = RandomBuffer(4 * kCrcPieceBytes + 64, 1);
  std::vector<uint64_t> lengths = {0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65};
  for (uint64_t b : {uint64_t{kCrcLeafBytes}, 2 * uint64_t{kCrcLeafBytes}, kCrcPieceBytes,
                     2 * kCrcPieceBytes, 3 * kCrcPieceBytes + kCrcLeafBytes}) {
    for (int64_t d = -17; d <= 17; ++d) lengths.push_back(b + d);
  }
  std::vector<Range> ranges;
  for (uint64_t n : lengths) {
    for (uint64_t align = 0; align < 16; ++align) ranges.push_back({buf.data() + align, n});
  }
  ASSERT_GT(ranges.size(), 2 * kCrcOpsPerLaunch);  // several launches
  ExpectEqualsIsal(ranges, buf.data());
}

TEST(Crc32cGridTest, RandomLengthsAndOffsets) {
  constexpr size_t kBuffer = 5u << 20;
  const std::vector<uint8_t> buf = RandomBuffer(kBuffer, 2);
  std::mt19937_64 rng(3);
  std::vector<Range> ranges;
  for (int i = 0; i < 4000; ++i) {
    // Mostly within a few pieces; some of several MiB; some tiny.
    const uint64_t n = i % 400 == 0 ? rng() % (4u << 20)
                       : i % 3 == 0 ? rng() % 64
                                    : rng() % (3 * kCrcPieceBytes);
    ranges.push_back({buf.data() + rng() % (kBuffer - n + 1), n});
  }
  ExpectEqualsIsal(ranges, buf.data());
}

// The object gather kernel's CRC of one slot (gpu/gather_kernel.cu): every
// thread's CrcLeafOfShortRange, XORed over the block, complemented.
TEST(Crc32cGridTest, ShortRangeLeavesGiveTheCrcOfEveryLengthAndAlignment) {
  const std::vector<uint8_t> buf = RandomBuffer(kCrcPieceBytes + 64, 4);
  std::vector<uint64_t> lengths = {1, 2, 3, 4, 5, 15, 16, 17, 4095, 4096, 4097, kCrcPieceBytes};
  for (uint64_t b : {uint64_t{kCrcLeafBytes}, kCrcPieceBytes - kCrcLeafBytes}) {
    for (int64_t d = -3; d <= 3; ++d) lengths.push_back(b + d);
  }
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200; ++i) lengths.push_back(1 + rng() % kCrcPieceBytes);
  for (uint64_t n : lengths) {
    for (uint64_t align : {0, 1, 4, 8, 15}) {
      const uint8_t* data = buf.data() + align;
      uint32_t v = 0;
      for (uint32_t t = 0; t < kCrcThreads; ++t) {
        v ^= CrcLeafOfShortRange(Tables(), kShifts, data, n, t);
      }
      ASSERT_EQ(~v, Crc32c({data, n})) << n << " bytes at offset " << align;
    }
  }
}

TEST(Crc32cGridTest, EmptyRangesAmongOthersInOneLaunch) {
  const std::vector<uint8_t> buf = RandomBuffer(3 * kCrcPieceBytes, 4);
  std::vector<Range> ranges;
  for (size_t i = 0; i < kCrcOpsPerLaunch; ++i) {
    // Runs of empty ranges at the start, the middle and the end.
    const bool empty = i < 3 || (i >= 60 && i < 64) || i + 2 >= kCrcOpsPerLaunch;
    ranges.push_back({buf.data() + i, empty ? 0 : (i * 997) % (2 * kCrcPieceBytes) + 1});
  }
  ExpectEqualsIsal(ranges, buf.data());
  // A launch of empty ranges only: no pieces at all.
  EXPECT_EQ(EmulateLaunchCrc32c({{nullptr, 0}, {buf.data(), 0}}), (std::vector<uint32_t>{0, 0}));
}

TEST(Crc32cGridTest, RangeOfPieceSkipsEmptyRanges) {
  const uint64_t data[] = {0, 0, 0, 0, 0};
  const uint64_t bytes[] = {0, kCrcPieceBytes + 1, 0, 0, 1};
  CrcLaunch l;
  ASSERT_TRUE(PlanCrcLaunch(data, bytes, 5, &l));
  ASSERT_EQ(l.first_piece[5], 3u);
  EXPECT_EQ(CrcRangeOfPiece(l, 0), 1u);
  EXPECT_EQ(CrcRangeOfPiece(l, 1), 1u);
  EXPECT_EQ(CrcRangeOfPiece(l, 2), 4u);
}

TEST(Crc32cGridTest, PlanRefusesMorePiecesThanAGrid) {
  const uint64_t data[] = {1, 1};
  const uint64_t bytes[] = {kCrcPieceBytes << 30, kCrcPieceBytes << 30};
  CrcLaunch l;
  EXPECT_FALSE(PlanCrcLaunch(data, bytes, 2, &l));
}

}  // namespace
}  // namespace orbitkv::gpu
