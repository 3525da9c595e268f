#include "io/file_system.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace orbitkv {
namespace {

using Op = FaultInjectingFileSystem::Op;
using Fault = FaultInjectingFileSystem::Fault;

// A fresh directory under $TMPDIR (or /tmp), removed after the test.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/orbitkv_fs_test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // Opens (creating) a file through `fs` and closes it at teardown.
  int OpenFile(FileSystem* fs, const std::string& name) {
    Result<int> fd = fs->Open(Path(name), O_RDWR | O_CREAT, 0644);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (!fd.ok()) return -1;
    fds_.push_back(*fd);
    return *fd;
  }

  FileSystem* fs_ = FileSystem::Default();
  std::string dir_;
  std::vector<int> fds_;
};

using PosixFileSystemTest = TempDirTest;

TEST_F(PosixFileSystemTest, StatMissingPathIsNotAnError) {
  Result<FileInfo> info = fs_->Stat(Path("missing"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_FALSE(info->exists);
  EXPECT_FALSE(info->is_regular);
}

TEST_F(PosixFileSystemTest, StatBelowARegularFileIsMissing) {
  OpenFile(fs_, "file");
  Result<FileInfo> info = fs_->Stat(Path("file/child"));  // ENOTDIR
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_FALSE(info->exists);
}

TEST_F(PosixFileSystemTest, StatRegularFile) {
  int fd = OpenFile(fs_, "file");
  ASSERT_TRUE(WriteFull(fs_, fd, "hello", 5, 0, "file").ok());
  Result<FileInfo> info = fs_->Stat(Path("file"));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->exists);
  EXPECT_TRUE(info->is_regular);
  EXPECT_FALSE(info->is_directory);
  EXPECT_FALSE(info->is_symlink);
  EXPECT_FALSE(info->is_block_device);
  EXPECT_EQ(info->size, 5u);
}

TEST_F(PosixFileSystemTest, StatDirectory) {
  Result<FileInfo> info = fs_->Stat(dir_);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->exists);
  EXPECT_TRUE(info->is_directory);
  EXPECT_FALSE(info->is_regular);
}

TEST_F(PosixFileSystemTest, StatDoesNotFollowSymlinks) {
  OpenFile(fs_, "target");
  ASSERT_EQ(::symlink(Path("target").c_str(), Path("link").c_str()), 0);
  ASSERT_EQ(::symlink(Path("nowhere").c_str(), Path("dangling").c_str()), 0);
  for (const char* name : {"link", "dangling"}) {
    Result<FileInfo> info = fs_->Stat(Path(name));
    ASSERT_TRUE(info.ok()) << name;
    EXPECT_TRUE(info->exists) << name;
    EXPECT_TRUE(info->is_symlink) << name;
    EXPECT_FALSE(info->is_regular) << name;
  }
}

TEST_F(PosixFileSystemTest, OpenMissingFileNamesThePath) {
  Result<int> fd = fs_->Open(Path("missing"), O_RDONLY, 0);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kIOError);
  EXPECT_EQ(fd.status().err_no(), ENOENT);
  EXPECT_NE(fd.status().message().find(Path("missing")), std::string_view::npos);
}

TEST_F(PosixFileSystemTest, FallocateExtendsAndTruncateShrinks) {
  int fd = OpenFile(fs_, "file");
  Status st = fs_->Fallocate(fd, 0, 1 << 20);
  if (st.err_no() == EOPNOTSUPP) GTEST_SKIP() << "fallocate unsupported here";
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(fs_->Stat(Path("file"))->size, 1u << 20);
  ASSERT_TRUE(fs_->Truncate(fd, 4096).ok());
  EXPECT_EQ(fs_->Stat(Path("file"))->size, 4096u);
  ASSERT_TRUE(fs_->Fsync(fd).ok());
}

TEST_F(PosixFileSystemTest, ErrorsNameTheFdAndRange) {
  Status st = fs_->Fallocate(-1, 4096, 8192);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err_no(), EBADF);
  EXPECT_EQ(st.message(), "fallocate fd -1 [4096, +8192)");
  char buf[16];
  Result<size_t> got = fs_->PRead(-1, buf, sizeof(buf), 0);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(), "pread fd -1 [0, +16)");
  EXPECT_EQ(fs_->Close(-1).err_no(), EBADF);
}

TEST_F(PosixFileSystemTest, ReadWriteFullRoundTrip) {
  int fd = OpenFile(fs_, "file");
  std::vector<char> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(WriteFull(fs_, fd, data.data(), data.size(), 512, "file").ok());
  std::vector<char> back(data.size());
  ASSERT_TRUE(ReadFull(fs_, fd, back.data(), back.size(), 512, "file").ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(ReadFull(fs_, fd, back.data(), 0, 1 << 30, "file").ok());  // n == 0
}

TEST_F(PosixFileSystemTest, ReadFullPastEndOfFileFailsNamingTheFile) {
  int fd = OpenFile(fs_, "file");
  std::vector<char> buf(200, 'x');
  ASSERT_TRUE(WriteFull(fs_, fd, buf.data(), 100, 0, Path("file")).ok());
  Status st = ReadFull(fs_, fd, buf.data(), 200, 0, Path("file"));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_EQ(st.err_no(), EIO);
  const std::string msg(st.message());
  EXPECT_NE(msg.find("read " + Path("file") + " [0, +200)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("short read"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 100 bytes"), std::string::npos) << msg;
}

TEST_F(PosixFileSystemTest, UnlinkRemovesAndReportsMissing) {
  OpenFile(fs_, "file");
  ASSERT_TRUE(fs_->Unlink(Path("file")).ok());
  EXPECT_FALSE(fs_->Stat(Path("file"))->exists);
  Status st = fs_->Unlink(Path("file"));
  EXPECT_EQ(st.err_no(), ENOENT);
  EXPECT_NE(st.message().find(Path("file")), std::string_view::npos);
}

using FaultInjectingFileSystemTest = TempDirTest;

TEST_F(FaultInjectingFileSystemTest, NthCallFailsOnceWithNoSpace) {
  FaultInjectingFileSystem faulty(fs_);
  int fd = OpenFile(&faulty, "file");
  faulty.FailNth(Op::kPWrite, 2, ENOSPC);
  char data[4096] = {};
  EXPECT_TRUE(faulty.PWrite(fd, data, sizeof(data), 0).ok());
  Result<size_t> second = faulty.PWrite(fd, data, sizeof(data), 4096);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(second.status().IsNoSpace()) << second.status().ToString();
  EXPECT_EQ(second.status().err_no(), ENOSPC);
  EXPECT_NE(second.status().message().find("[4096, +4096)"), std::string_view::npos);
  EXPECT_TRUE(faulty.PWrite(fd, data, sizeof(data), 8192).ok());
  EXPECT_EQ(faulty.Calls(Op::kPWrite), 3u);
  EXPECT_EQ(faulty.Calls(Op::kOpen), 1u);
  EXPECT_EQ(faulty.Calls(Op::kFsync), 0u);
  EXPECT_EQ(fs_->Stat(Path("file"))->size, 3u * 4096);  // the failed write did not happen
}

TEST_F(FaultInjectingFileSystemTest, NthCountsFromWhenTheRuleWasAdded) {
  FaultInjectingFileSystem faulty(fs_);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(faulty.Stat(dir_).ok());
  faulty.FailNth(Op::kStat, 1, EIO);
  Result<FileInfo> info = faulty.Stat(dir_);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().err_no(), EIO);
  EXPECT_NE(info.status().message().find(dir_), std::string_view::npos);
  EXPECT_TRUE(faulty.Stat(dir_).ok());
  EXPECT_EQ(faulty.Calls(Op::kStat), 7u);
}

TEST_F(FaultInjectingFileSystemTest, EveryFailsFromTheNthOnUntilCleared) {
  FaultInjectingFileSystem faulty(fs_);
  int fd = OpenFile(&faulty, "file");
  faulty.AddRule({.op = Op::kFsync, .nth = 2, .fault = Fault::kError, .err = EIO, .every = true});
  EXPECT_TRUE(faulty.Fsync(fd).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(faulty.Fsync(fd).err_no(), EIO);
  faulty.ClearRules();
  EXPECT_TRUE(faulty.Fsync(fd).ok());
  EXPECT_EQ(faulty.Calls(Op::kFsync), 5u);
}

TEST_F(FaultInjectingFileSystemTest, ShortTransfersAreCompletedByTheFullHelpers) {
  FaultInjectingFileSystem faulty(fs_);
  int fd = OpenFile(&faulty, "file");
  std::vector<char> data(8192);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 251);

  faulty.AddRule({.op = Op::kPWrite, .nth = 1, .fault = Fault::kShort});
  Result<size_t> put = faulty.PWrite(fd, data.data(), data.size(), 0);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(*put, 4096u);

  faulty.AddRule({.op = Op::kPWrite, .nth = 1, .fault = Fault::kShort, .every = true});
  ASSERT_TRUE(WriteFull(&faulty, fd, data.data(), data.size(), 0, "file").ok());
  faulty.ClearRules();
  EXPECT_EQ(faulty.Calls(Op::kPWrite), 1u + 14u);  // 8192 halves 13 times, then 1 byte

  faulty.AddRule({.op = Op::kPRead, .nth = 1, .fault = Fault::kShort, .every = true});
  std::vector<char> back(data.size());
  ASSERT_TRUE(ReadFull(&faulty, fd, back.data(), back.size(), 0, "file").ok());
  EXPECT_EQ(back, data);
  EXPECT_GT(faulty.Calls(Op::kPRead), 2u);
}

TEST_F(FaultInjectingFileSystemTest, ReadFullReportsInjectedErrorWithContext) {
  FaultInjectingFileSystem faulty(fs_);
  int fd = OpenFile(&faulty, "file");
  char buf[64] = {};
  ASSERT_TRUE(WriteFull(&faulty, fd, buf, sizeof(buf), 0, "file").ok());
  faulty.FailNth(Op::kPRead, 1, EIO);
  Status st = ReadFull(&faulty, fd, buf, sizeof(buf), 0, "shard.3");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err_no(), EIO);
  EXPECT_EQ(st.message().substr(0, 20), "read shard.3 [0, +64");
}

TEST_F(FaultInjectingFileSystemTest, StallSleepsThenPerformsTheCall) {
  FaultInjectingFileSystem faulty(fs_);
  faulty.AddRule(
      {.op = Op::kStat, .nth = 1, .fault = Fault::kStall, .stall = std::chrono::milliseconds(50)});
  auto start = std::chrono::steady_clock::now();
  Result<FileInfo> info = faulty.Stat(dir_);
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->is_directory);
  EXPECT_GE(elapsed, std::chrono::milliseconds(50));
  EXPECT_EQ(faulty.Calls(Op::kStat), 1u);
}

TEST_F(FaultInjectingFileSystemTest, CountsCallsFromManyThreads) {
  FaultInjectingFileSystem faulty(fs_);
  faulty.FailNth(Op::kStat, 100, EIO);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        if (!faulty.Stat(dir_).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(faulty.Calls(Op::kStat), 200u);
  EXPECT_EQ(failures.load(), 1);
}

}  // namespace
}  // namespace orbitkv
