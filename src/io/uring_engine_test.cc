#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/io_engine.h"

namespace orbitkv {
namespace {

constexpr size_t kBlock = 4096;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char[], FreeDeleter>;

AlignedBuffer Allocate(size_t bytes) {
  return AlignedBuffer(static_cast<char*>(std::aligned_alloc(kBlock, bytes)));
}

char PatternByte(uint64_t file_offset) {
  return static_cast<char>((file_offset * 131 + (file_offset >> 12) * 7) & 0xff);
}

void FillPattern(char* p, size_t n, uint64_t file_offset) {
  for (size_t i = 0; i < n; ++i) p[i] = PatternByte(file_offset + i);
}

// Index of the first byte that differs from the pattern, or -1.
long FirstMismatch(const char* p, size_t n, uint64_t file_offset) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(file_offset + i)) return static_cast<long>(i);
  }
  return -1;
}

// A temp file opened O_DIRECT where the file system allows it (not tmpfs), and
// an engine. Every test ends by checking the engine still runs a batch.
class UringEngineTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kQueueDepth = 8;

  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/orbitkv_uring.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
    path_ = dir_ + "/data.bin";
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd_ < 0 && errno == EINVAL) {
      direct_ = false;  // tmpfs and friends refuse O_DIRECT
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT, 0644);
    }
    ASSERT_GE(fd_, 0) << std::strerror(errno);
    auto engine = CreateUringEngine({.queue_depth = kQueueDepth, .faults = &faults_});
    if (!engine.ok() && engine.status().code() == StatusCode::kUnavailable) {
      GTEST_SKIP() << "io_uring unavailable: " << engine.status().ToString();
    }
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(engine).value();
  }

  void TearDown() override {
    if (engine_ != nullptr && !HasFatalFailure()) {
      faults_.Clear();
      ExpectEngineStillWorks();
    }
    engine_.reset();
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // `count` requests of `len` bytes each at consecutive offsets from `base`.
  std::vector<IoRequest> MakeBatch(IoOp op, char* buf, size_t count, size_t len,
                                   uint64_t base = 0) {
    std::vector<IoRequest> reqs(count);
    for (size_t i = 0; i < count; ++i) {
      reqs[i].op = op;
      reqs[i].fd = fd_;
      reqs[i].offset = base + i * len;
      reqs[i].buf = buf + i * len;
      reqs[i].len = len;
      reqs[i].file = path_;
    }
    return reqs;
  }

  // Writes the pattern over [base, base + count * len).
  void WritePattern(size_t count, size_t len, uint64_t base = 0) {
    AlignedBuffer buf = Allocate(count * len);
    FillPattern(buf.get(), count * len, base);
    std::vector<IoRequest> reqs = MakeBatch(IoOp::kWrite, buf.get(), count, len, base);
    Status st = engine_->Run(reqs);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (const auto& r : reqs) ASSERT_EQ(r.done, len);
  }

  std::string Range(uint64_t offset, size_t len) const {
    return path_ + " [" + std::to_string(offset) + ", +" + std::to_string(len) + ")";
  }

  // Proves the CQ was advanced and no submission is left over.
  void ExpectEngineStillWorks() {
    constexpr size_t kCount = 3 * kQueueDepth;
    WritePattern(kCount, kBlock, 64 << 20);
    AlignedBuffer buf = Allocate(kCount * kBlock);
    std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), kCount, kBlock, 64 << 20);
    Status st = engine_->Run(reqs);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(FirstMismatch(buf.get(), kCount * kBlock, 64 << 20), -1);
  }

  std::string dir_;
  std::string path_;
  int fd_ = -1;
  bool direct_ = true;
  ScriptedIoFaults faults_;
  std::unique_ptr<IoEngine> engine_;
};

TEST(ScriptedIoFaultsTest, ShortKeepsProgressAndAlignmentWherePossible) {
  ScriptedIoFaults faults;
  faults.AddRule(
      {.op = IoOp::kRead, .nth = 1, .fault = ScriptedIoFaults::Fault::kShort, .every = true});
  IoRequest read;
  read.op = IoOp::kRead;
  EXPECT_EQ(faults.OnCompletion(read, 0, 65536, 65536), 32768);
  EXPECT_EQ(faults.OnCompletion(read, 0, 12288, 12288), 4096);
  EXPECT_EQ(faults.OnCompletion(read, 0, 4096, 4096), 2048);
  EXPECT_EQ(faults.OnCompletion(read, 0, 6144, 6144), 3072);
  EXPECT_EQ(faults.OnCompletion(read, 0, 1536, 1536), 512);
  EXPECT_EQ(faults.OnCompletion(read, 0, 100, 100), 50);
  EXPECT_EQ(faults.OnCompletion(read, 0, 3, 3), 1);
  EXPECT_EQ(faults.OnCompletion(read, 0, 1, 1), 1);
  EXPECT_EQ(faults.OnCompletion(read, 0, 4096, -EIO), -EIO);
  IoRequest write;
  write.op = IoOp::kWrite;
  EXPECT_EQ(faults.OnCompletion(write, 0, 4096, 4096), 4096);  // other op: untouched
  EXPECT_EQ(faults.Completions(IoOp::kRead), 9u);
  EXPECT_EQ(faults.Completions(IoOp::kWrite), 1u);
}

TEST(ScriptedIoFaultsTest, RulesCountFromWhenAdded) {
  ScriptedIoFaults faults;
  IoRequest read;
  read.op = IoOp::kRead;
  EXPECT_EQ(faults.OnCompletion(read, 0, 512, 512), 512);
  EXPECT_EQ(faults.OnCompletion(read, 0, 512, 512), 512);
  faults.AddRule({.op = IoOp::kRead, .nth = 2, .fault = ScriptedIoFaults::Fault::kZero});
  EXPECT_EQ(faults.OnCompletion(read, 0, 512, 512), 512);
  EXPECT_EQ(faults.OnCompletion(read, 0, 512, 512), 0);
  EXPECT_EQ(faults.OnCompletion(read, 0, 512, 512), 512);  // fired once
  faults.AddRule(
      {.op = IoOp::kRead, .nth = 1, .fault = ScriptedIoFaults::Fault::kError, .err = ENOSPC});
  EXPECT_EQ(faults.OnCompletion(read, 0, 512, 512), -ENOSPC);
  EXPECT_EQ(faults.Completions(IoOp::kRead), 6u);
}

TEST(UringEngineCreateTest, RejectsZeroQueueDepth) {
  auto engine = CreateUringEngine({.queue_depth = 0});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(UringEngineTest, ReportsQueueDepthAndRunsEmptyBatches) {
  EXPECT_EQ(engine_->queue_depth(), kQueueDepth);
  EXPECT_TRUE(engine_->Run({}).ok());
  IoRequest empty;
  empty.fd = fd_;
  empty.len = 0;
  empty.done = 99;
  EXPECT_TRUE(engine_->Run({&empty, 1}).ok());
  EXPECT_EQ(empty.done, 0u);
}

TEST_F(UringEngineTest, WritesAndReadsBackABatchLargerThanTheQueue) {
  constexpr size_t kCount = 200;
  constexpr size_t kLen = 4 * kBlock;
  WritePattern(kCount, kLen);
  EXPECT_EQ(faults_.Completions(IoOp::kWrite), kCount);

  AlignedBuffer buf = Allocate(kCount * kLen);
  std::memset(buf.get(), 0, kCount * kLen);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), kCount, kLen);
  Status st = engine_->Run(reqs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const auto& r : reqs) {
    EXPECT_TRUE(r.status.ok());
    EXPECT_EQ(r.done, kLen);
  }
  EXPECT_EQ(FirstMismatch(buf.get(), kCount * kLen, 0), -1);
  EXPECT_EQ(faults_.Completions(IoOp::kRead), kCount);
}

TEST_F(UringEngineTest, InjectedErrorFailsOnlyThatRequest) {
  constexpr size_t kCount = 20;
  WritePattern(kCount, kBlock);
  faults_.AddRule(
      {.op = IoOp::kRead, .nth = 3, .fault = ScriptedIoFaults::Fault::kError, .err = EIO});
  AlignedBuffer buf = Allocate(kCount * kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), kCount, kBlock);
  Status st = engine_->Run(reqs);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err_no(), EIO);

  int failed = 0;
  for (const auto& r : reqs) {
    if (r.status.ok()) {
      EXPECT_EQ(r.done, kBlock);
      EXPECT_EQ(FirstMismatch(static_cast<char*>(r.buf), kBlock, r.offset), -1);
      continue;
    }
    ++failed;
    EXPECT_EQ(r.status.code(), StatusCode::kIOError);
    EXPECT_EQ(r.status.err_no(), EIO);
    EXPECT_EQ(r.status.message(), "read " + Range(r.offset, kBlock));
    EXPECT_EQ(st.message(), r.status.message());  // the only failure is the one returned
  }
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(faults_.Completions(IoOp::kRead), kCount);
}

TEST_F(UringEngineTest, ShortReadIsContinuedUntilComplete) {
  constexpr size_t kCount = 12;
  constexpr size_t kLen = 16 * kBlock;
  WritePattern(kCount, kLen);
  faults_.AddRule({.op = IoOp::kRead, .nth = 2, .fault = ScriptedIoFaults::Fault::kShort});
  AlignedBuffer buf = Allocate(kCount * kLen);
  std::memset(buf.get(), 0, kCount * kLen);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), kCount, kLen);
  Status st = engine_->Run(reqs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const auto& r : reqs) EXPECT_EQ(r.done, kLen);
  EXPECT_EQ(FirstMismatch(buf.get(), kCount * kLen, 0), -1);
  EXPECT_EQ(faults_.Completions(IoOp::kRead), kCount + 1);  // one continuation
}

TEST_F(UringEngineTest, RepeatedShortWritesAreContinued) {
  // Three write completions are cut to half (4 KiB multiples here), wherever
  // they fall; the data must still land exactly. (Cutting every completion
  // would end below the O_DIRECT block size.)
  for (uint64_t nth : {1, 2, 3}) {
    faults_.AddRule({.op = IoOp::kWrite, .nth = nth, .fault = ScriptedIoFaults::Fault::kShort});
  }
  constexpr size_t kCount = 10;
  constexpr size_t kLen = 8 * kBlock;
  WritePattern(kCount, kLen);
  EXPECT_EQ(faults_.Completions(IoOp::kWrite), kCount + 3);
  faults_.Clear();
  AlignedBuffer buf = Allocate(kCount * kLen);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), kCount, kLen);
  ASSERT_TRUE(engine_->Run(reqs).ok());
  EXPECT_EQ(FirstMismatch(buf.get(), kCount * kLen, 0), -1);
}

TEST_F(UringEngineTest, ZeroByteCompletionFailsAsShortRead) {
  constexpr size_t kCount = 10;
  WritePattern(kCount, kBlock);
  faults_.AddRule({.op = IoOp::kRead, .nth = 5, .fault = ScriptedIoFaults::Fault::kZero});
  AlignedBuffer buf = Allocate(kCount * kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), kCount, kBlock);
  Status st = engine_->Run(reqs);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_EQ(st.err_no(), EIO);
  EXPECT_NE(st.message().find("short read"), std::string_view::npos) << st.ToString();
  int failed = 0;
  for (const auto& r : reqs) {
    if (r.status.ok()) continue;
    ++failed;
    EXPECT_EQ(r.status.message().find("read " + Range(r.offset, kBlock)), 0u);
  }
  EXPECT_EQ(failed, 1);
}

TEST_F(UringEngineTest, InjectedNoSpaceOnWriteIsNoSpace) {
  faults_.AddRule(
      {.op = IoOp::kWrite, .nth = 1, .fault = ScriptedIoFaults::Fault::kError, .err = ENOSPC});
  constexpr size_t kCount = 4;
  AlignedBuffer buf = Allocate(kCount * kBlock);
  FillPattern(buf.get(), kCount * kBlock, 0);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kWrite, buf.get(), kCount, kBlock);
  Status st = engine_->Run(reqs);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(st.IsNoSpace()) << st.ToString();
  EXPECT_EQ(st.err_no(), ENOSPC);
  EXPECT_EQ(st.message().substr(0, 6), "write ");
  int failed = 0;
  for (const auto& r : reqs) failed += r.status.IsNoSpace() ? 1 : 0;
  EXPECT_EQ(failed, 1);
}

TEST_F(UringEngineTest, RetryableErrorsAreResubmitted) {
  WritePattern(4, kBlock);
  faults_.AddRule(
      {.op = IoOp::kRead, .nth = 1, .fault = ScriptedIoFaults::Fault::kError, .err = EAGAIN});
  faults_.AddRule(
      {.op = IoOp::kRead, .nth = 2, .fault = ScriptedIoFaults::Fault::kError, .err = EINTR});
  AlignedBuffer buf = Allocate(4 * kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), 4, kBlock);
  Status st = engine_->Run(reqs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FirstMismatch(buf.get(), 4 * kBlock, 0), -1);
  EXPECT_EQ(faults_.Completions(IoOp::kRead), 6u);
}

TEST_F(UringEngineTest, EndlessRetryableErrorsEventuallyFail) {
  WritePattern(1, kBlock);
  faults_.AddRule({.op = IoOp::kRead,
                   .nth = 1,
                   .fault = ScriptedIoFaults::Fault::kError,
                   .err = EAGAIN,
                   .every = true});
  AlignedBuffer buf = Allocate(kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), 1, kBlock);
  Status st = engine_->Run(reqs);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err_no(), EAGAIN);
  EXPECT_TRUE(st.retryable());
}

TEST_F(UringEngineTest, ReadingBeyondEndOfFileFailsCleanly) {
  WritePattern(4, kBlock);  // the file is 16 KiB
  AlignedBuffer buf = Allocate(4 * kBlock);
  std::vector<IoRequest> reqs(3);
  for (auto& r : reqs) {
    r.op = IoOp::kRead;
    r.fd = fd_;
    r.file = path_;
  }
  reqs[0].offset = 0;  // inside: succeeds
  reqs[0].len = kBlock;
  reqs[0].buf = buf.get();
  reqs[1].offset = 1 << 20;  // past the end: no progress at all
  reqs[1].len = kBlock;
  reqs[1].buf = buf.get() + kBlock;
  reqs[2].offset = 3 * kBlock;  // straddles the end: half, then nothing
  reqs[2].len = 2 * kBlock;
  reqs[2].buf = buf.get() + 2 * kBlock;
  Status st = engine_->Run(reqs);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(reqs[0].status.ok());
  EXPECT_EQ(FirstMismatch(buf.get(), kBlock, 0), -1);
  EXPECT_EQ(reqs[1].status.err_no(), EIO);
  EXPECT_EQ(reqs[1].status.message(),
            "read " + Range(1 << 20, kBlock) + ": short read, no progress after 0 of 4096 bytes");
  EXPECT_EQ(reqs[2].done, kBlock);
  EXPECT_EQ(reqs[2].status.message(), "read " + Range(3 * kBlock, 2 * kBlock) +
                                          ": short read, no progress after 4096 of 8192 bytes");
  EXPECT_EQ(st.message(), reqs[1].status.message());  // first failure in request order
}

TEST_F(UringEngineTest, KernelErrorsFailOnlyTheirRequest) {
  WritePattern(2, kBlock);
  AlignedBuffer buf = Allocate(3 * kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), 3, kBlock);
  reqs[1].fd = 1 << 20;  // not an open descriptor
  reqs[1].file = {};
  Status st = engine_->Run(reqs);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err_no(), EBADF);
  EXPECT_EQ(st.message(), "read fd 1048576 [4096, +4096)");
  EXPECT_TRUE(reqs[0].status.ok());
  EXPECT_FALSE(reqs[2].status.ok());  // past the end of the 8 KiB file
  EXPECT_TRUE(reqs[1].status.message().find("fd") != std::string_view::npos);
}

TEST_F(UringEngineTest, StallDelaysButCompletes) {
  WritePattern(4, kBlock);
  faults_.AddRule({.op = IoOp::kRead,
                   .nth = 2,
                   .fault = ScriptedIoFaults::Fault::kStall,
                   .stall = std::chrono::milliseconds(60)});
  AlignedBuffer buf = Allocate(4 * kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), 4, kBlock);
  auto start = std::chrono::steady_clock::now();
  Status st = engine_->Run(reqs);
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(elapsed, std::chrono::milliseconds(60));
  EXPECT_EQ(FirstMismatch(buf.get(), 4 * kBlock, 0), -1);
}

TEST_F(UringEngineTest, RunResetsOutputsOfReusedRequests) {
  WritePattern(2, kBlock);
  faults_.AddRule({.op = IoOp::kRead, .nth = 1, .fault = ScriptedIoFaults::Fault::kError});
  AlignedBuffer buf = Allocate(2 * kBlock);
  std::vector<IoRequest> reqs = MakeBatch(IoOp::kRead, buf.get(), 2, kBlock);
  ASSERT_FALSE(engine_->Run(reqs).ok());
  ASSERT_TRUE(engine_->Run(reqs).ok());
  for (const auto& r : reqs) {
    EXPECT_TRUE(r.status.ok());
    EXPECT_EQ(r.done, kBlock);
  }
}

}  // namespace
}  // namespace orbitkv

namespace orbitkv {
namespace {

// Vectored requests: one file range gathered from / scattered into several
// buffers, continued correctly across a short completion that ends inside an
// iovec.
TEST_F(UringEngineTest, VectoredReadsAndWritesSurviveShortCompletions) {
  constexpr size_t kPieces = 5;
  constexpr size_t kLen = kPieces * 3 * kBlock;
  std::vector<AlignedBuffer> pieces;
  std::vector<iovec> iov;
  for (size_t i = 0; i < kPieces; ++i) {
    pieces.push_back(Allocate(3 * kBlock));
    FillPattern(pieces.back().get(), 3 * kBlock, i * 3 * kBlock);
    iov.push_back({pieces.back().get(), 3 * kBlock});
  }
  IoRequest w;
  w.op = IoOp::kWrite;
  w.fd = fd_;
  w.len = kLen;
  w.iov = iov;
  w.file = path_;
  faults_.AddRule({.op = IoOp::kWrite, .nth = 1, .fault = ScriptedIoFaults::Fault::kShort});
  ASSERT_TRUE(engine_->Run({&w, 1}).ok());
  EXPECT_EQ(w.done, kLen);

  for (auto& p : pieces) std::memset(p.get(), 0, 3 * kBlock);
  IoRequest r = w;
  r.op = IoOp::kRead;
  faults_.AddRule({.op = IoOp::kRead, .nth = 1, .fault = ScriptedIoFaults::Fault::kShort});
  ASSERT_TRUE(engine_->Run({&r, 1}).ok());
  EXPECT_EQ(r.done, kLen);
  for (size_t i = 0; i < kPieces; ++i) {
    EXPECT_EQ(FirstMismatch(pieces[i].get(), 3 * kBlock, i * 3 * kBlock), -1) << i;
  }
  EXPECT_EQ(faults_.Completions(IoOp::kRead), 2u);

  r.len = kLen - kBlock;  // iovec lengths disagree with len
  EXPECT_EQ(engine_->Run({&r, 1}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace orbitkv
