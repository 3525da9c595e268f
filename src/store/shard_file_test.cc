#include "store/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "testing/temp_dir.h"

namespace orbitkv {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

ShardSetOptions Opts(const std::string& base, uint32_t count = 3, uint64_t cap = 1 << 20) {
  ShardSetOptions o;
  o.base_path = base;
  o.count = count;
  o.data_capacity = cap;
  return o;
}

TEST(ShardHeader, RoundTripsAndRejectsForeignBytes) {
  std::array<uint8_t, kShardHeaderSize> buf{};
  EncodeShardHeader({kShardFormatVersion, 2, 4, 1 << 30, 77}, buf);
  Result<ShardHeader> h = DecodeShardHeader(buf);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->shard_index, 2u);
  EXPECT_EQ(h->shard_count, 4u);
  EXPECT_EQ(h->data_capacity, 1u << 30);
  EXPECT_EQ(h->created_unix_ns, 77u);

  std::array<uint8_t, kShardHeaderSize> junk{};
  junk.fill('x');
  EXPECT_TRUE(DecodeShardHeader(junk).status().IsNotFound());
  buf[30] ^= 1;  // flip a bit covered by the checksum
  EXPECT_EQ(DecodeShardHeader(buf).status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(DecodeShardHeader(std::span<const uint8_t>(buf.data(), 3)).status().IsNotFound());
}

TEST(ShardPaths, DerivedFromBase) {
  EXPECT_EQ(ShardPaths("/a/cache.bin", 3),
            (std::vector<std::string>{"/a/cache.bin", "/a/cache.bin.1", "/a/cache.bin.2"}));
}

TEST(ShardSet, CreatesSizedShardsWithHeaders) {
  testing::TempDir dir;
  auto set = ShardSet::Create(FileSystem::Default(), Opts(dir.File("sub/cache.bin")));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->count(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    struct stat st;
    ASSERT_EQ(::stat((*set)->path(i).c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), kShardHeaderSize + (1u << 20));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_TRUE(CheckShardPath(FileSystem::Default(), (*set)->path(i)).ok());
  }
  // Recreating over our own files works (the cache restarts empty).
  set->reset();
  EXPECT_TRUE(ShardSet::Create(FileSystem::Default(), Opts(dir.File("sub/cache.bin"))).ok());
}

TEST(ShardSet, RefusesForeignFileAndLeavesEverythingUntouched) {
  testing::TempDir dir;
  const std::string base = dir.File("cache.bin");
  const std::string foreign(10000, 'u');
  WriteAll(base + ".2", foreign);  // someone else's file at shard 2's path
  auto set = ShardSet::Create(FileSystem::Default(), Opts(base));
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find(base + ".2"), std::string::npos) << set.status().ToString();
  EXPECT_NE(set.status().message().find("not an OrbitKV cache file"), std::string::npos);
  EXPECT_EQ(ReadAll(base + ".2"), foreign);
  // Shards 0 and 1 were not created: nothing was written before the check.
  EXPECT_FALSE(std::filesystem::exists(base));
  EXPECT_FALSE(std::filesystem::exists(base + ".1"));
}

TEST(ShardSet, RefusesSmallFileDirectorySymlinkAndBlockDevice) {
  testing::TempDir dir;
  WriteAll(dir.File("small"), "abc");
  EXPECT_FALSE(ShardSet::Create(FileSystem::Default(), Opts(dir.File("small"), 1)).ok());
  EXPECT_EQ(ReadAll(dir.File("small")), "abc");

  std::filesystem::create_directory(dir.File("d"));
  auto st = ShardSet::Create(FileSystem::Default(), Opts(dir.File("d"), 1)).status();
  EXPECT_NE(st.message().find("a directory"), std::string::npos) << st.ToString();

  ASSERT_EQ(::symlink(dir.File("small").c_str(), dir.File("link").c_str()), 0);
  st = ShardSet::Create(FileSystem::Default(), Opts(dir.File("link"), 1)).status();
  EXPECT_NE(st.message().find("symbolic link"), std::string::npos) << st.ToString();
  EXPECT_EQ(ReadAll(dir.File("small")), "abc");

  if (std::filesystem::exists("/dev/loop0") || std::filesystem::exists("/dev/vda")) {
    std::string dev = std::filesystem::exists("/dev/loop0") ? "/dev/loop0" : "/dev/vda";
    if (std::filesystem::is_block_file(dev)) {
      st = CheckShardPath(FileSystem::Default(), dev);
      EXPECT_NE(st.message().find("block device"), std::string::npos) << st.ToString();
    }
  }
}

TEST(ShardSet, DamagedOwnHeaderIsRefusedNotOverwritten) {
  testing::TempDir dir;
  const std::string base = dir.File("cache.bin");
  { ASSERT_TRUE(ShardSet::Create(FileSystem::Default(), Opts(base, 1)).ok()); }
  std::string bytes = ReadAll(base);
  bytes[30] ^= 1;
  WriteAll(base, bytes);
  auto st = ShardSet::Create(FileSystem::Default(), Opts(base, 1)).status();
  EXPECT_NE(st.message().find("damaged"), std::string::npos) << st.ToString();
  EXPECT_EQ(ReadAll(base), bytes);
}

TEST(ShardSet, ReservationFailureNamesShardAndSizeAndRemovesTheShardsItCreated) {
  for (int err : {ENOSPC, EDQUOT, EOPNOTSUPP}) {
    testing::TempDir dir;
    FaultInjectingFileSystem fs(FileSystem::Default());
    fs.FailNth(FaultInjectingFileSystem::Op::kFallocate, 3, err);  // shard 2 fails
    ShardSetOptions o = Opts(dir.File("cache.bin"));
    o.reserve_capacity = true;
    auto set = ShardSet::Create(&fs, o);
    ASSERT_FALSE(set.ok());
    EXPECT_EQ(set.status().err_no(), err);
    const std::string msg(set.status().message());
    EXPECT_NE(msg.find("shard 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(kShardHeaderSize + (1u << 20))), std::string::npos) << msg;
    for (const std::string& p : ShardPaths(o.base_path, 3)) {
      struct stat st;
      EXPECT_NE(::stat(p.c_str(), &st), 0) << p << " was created by the failed start and is left";
    }
  }
}

TEST(ShardSet, FailedStartKeepsShardsOfAnEarlierRunTruncated) {
  testing::TempDir dir;
  ShardSetOptions o = Opts(dir.File("cache.bin"), 2);
  ASSERT_TRUE(ShardSet::Create(FileSystem::Default(), o).ok());  // an earlier run's shards
  FaultInjectingFileSystem fs(FileSystem::Default());
  fs.FailNth(FaultInjectingFileSystem::Op::kFallocate, 3, ENOSPC);  // shard 2, created now
  o.count = 3;
  o.reserve_capacity = true;
  ASSERT_EQ(ShardSet::Create(&fs, o).status().err_no(), ENOSPC);
  const std::vector<std::string> paths = ShardPaths(o.base_path, 3);
  for (size_t i = 0; i < 2; ++i) {
    struct stat st;
    ASSERT_EQ(::stat(paths[i].c_str(), &st), 0) << paths[i];
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), kShardHeaderSize) << paths[i];
  }
  struct stat st;
  EXPECT_NE(::stat(paths[2].c_str(), &st), 0) << "created by the failed start";
}

TEST(ShardSet, LateReservationFailureRemovesTheShardsCreateMade) {
  testing::TempDir dir;
  FaultInjectingFileSystem fs(FileSystem::Default());
  auto set = ShardSet::Create(&fs, Opts(dir.File("cache.bin"), 2));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  fs.FailNth(FaultInjectingFileSystem::Op::kFallocate, 2, ENOSPC);
  Status st = (*set)->Reserve(1u << 20);
  EXPECT_EQ(st.err_no(), ENOSPC) << st.ToString();
  for (const std::string& p : ShardPaths(dir.File("cache.bin"), 2)) {
    struct stat sb;
    EXPECT_NE(::stat(p.c_str(), &sb), 0) << p;
  }
}

TEST(ShardSet, SecondSetOnThePathIsRefusedNamingTheHoldersPidAndChangesNothing) {
  testing::TempDir dir;
  const std::string base = dir.File("cache.bin");
  auto first = ShardSet::Create(FileSystem::Default(), Opts(base, 2));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string header = ReadAll(base).substr(0, kShardHeaderSize);
  auto second = ShardSet::Create(FileSystem::Default(), Opts(base, 2));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg(second.status().message());
  EXPECT_NE(msg.find("in use by another OrbitKV Manager"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << msg;
  EXPECT_EQ(ReadAll(base).substr(0, kShardHeaderSize), header);
  EXPECT_EQ(ReadAll(LockFilePath(base)), std::to_string(::getpid()) + "\n");

  // A path whose shard 0 is the first set's shard 1: its own lock file is
  // free, the shard lock is not.
  auto overlap = ShardSet::Create(FileSystem::Default(), Opts(base + ".1", 1));
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(std::string(overlap.status().message()).find("shard " + base + ".1 is in use"),
            std::string::npos)
      << overlap.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat((base + ".1").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kShardHeaderSize + (1u << 20));

  first->reset();  // the locks go with the set
  EXPECT_TRUE(ShardSet::Create(FileSystem::Default(), Opts(base, 2)).ok());
}

TEST(ShardSet, ReservedShardsAreAllocatedAndSparseOnesAreNot) {
  testing::TempDir dir;
  ShardSetOptions o = Opts(dir.File("r.bin"), 1, 8 << 20);
  o.reserve_capacity = true;
  ASSERT_TRUE(ShardSet::Create(FileSystem::Default(), o).ok());
  struct stat st;
  ASSERT_EQ(::stat(o.base_path.c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8u << 20);

  o.base_path = dir.File("s.bin");
  o.reserve_capacity = false;
  ASSERT_TRUE(ShardSet::Create(FileSystem::Default(), o).ok());
  ASSERT_EQ(::stat(o.base_path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kShardHeaderSize + (8u << 20));
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 1u << 20);
}

TEST(ShardSet, RejectsBadOptions) {
  testing::TempDir dir;
  EXPECT_FALSE(ShardSet::Create(FileSystem::Default(), Opts(dir.File("x"), 0)).ok());
  EXPECT_FALSE(ShardSet::Create(FileSystem::Default(), Opts(dir.File("x"), 1, 1000)).ok());
  EXPECT_FALSE(ShardSet::Create(FileSystem::Default(), Opts("", 1)).ok());
}

}  // namespace
}  // namespace orbitkv
