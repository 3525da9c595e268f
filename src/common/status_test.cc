#include "orbitkv/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

namespace orbitkv {
namespace {

TEST(StatusTest, OkIsANullPointer) {
  static_assert(sizeof(Status) == sizeof(void*), "an OK Status must stay one pointer");
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_TRUE(s.message().empty());
  EXPECT_EQ(s.err_no(), 0);
  EXPECT_FALSE(s.retryable());
  EXPECT_FALSE(s.data_loss());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    std::string_view name;
  };
  Case cases[] = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {Status::NotFound("m"), StatusCode::kNotFound, "NotFound"},
      {Status::Busy("m"), StatusCode::kBusy, "Busy"},
      {Status::Unavailable("m"), StatusCode::kUnavailable, "Unavailable"},
      {Status::Cancelled("m"), StatusCode::kCancelled, "Cancelled"},
      {Status::DeadlineExceeded("m"), StatusCode::kDeadlineExceeded, "DeadlineExceeded"},
      {Status::Corruption("m"), StatusCode::kCorruption, "Corruption"},
      {Status::AlreadyExists("m"), StatusCode::kAlreadyExists, "AlreadyExists"},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition, "FailedPrecondition"},
      {Status::ResourceExhausted("m"), StatusCode::kResourceExhausted, "ResourceExhausted"},
      {Status::PermissionDenied("m"), StatusCode::kPermissionDenied, "PermissionDenied"},
      {Status::Internal("m"), StatusCode::kInternal, "Internal"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name));
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_TRUE(c.status == c.code);
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
    EXPECT_FALSE(c.status.retryable());
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_EQ(StatusCodeName(StatusCode::kIOError), "IOError");
  EXPECT_EQ(StatusCodeName(StatusCode::kNoSpace), "NoSpace");
  EXPECT_TRUE(Status::NotFound("k").IsNotFound());
  EXPECT_TRUE(Status::Busy("k").IsBusy());
  EXPECT_TRUE(Status::Cancelled("k").IsCancelled());
  EXPECT_FALSE(Status::Busy("k").IsNotFound());
}

TEST(StatusTest, IOErrorMapsFullStorageToNoSpace) {
  for (int err : {ENOSPC, EDQUOT}) {
    Status s = Status::IOError("write cache.bin.3", err);
    EXPECT_EQ(s.code(), StatusCode::kNoSpace) << err;
    EXPECT_TRUE(s.IsNoSpace());
    EXPECT_EQ(s.err_no(), err);
    EXPECT_FALSE(s.retryable());
  }
  Status eio = Status::IOError("read cache.bin.1", EIO);
  EXPECT_EQ(eio.code(), StatusCode::kIOError);
  EXPECT_FALSE(eio.IsNoSpace());
}

TEST(StatusTest, IOErrorRetryableAndDataLoss) {
  for (int err : {EINTR, EAGAIN, EBUSY}) {
    Status s = Status::IOError("read f", err);
    EXPECT_TRUE(s.retryable()) << err;
    EXPECT_EQ(s.code(), StatusCode::kIOError);
  }
  EXPECT_FALSE(Status::IOError("read f", EIO).retryable());
  EXPECT_FALSE(Status::IOError("read f", EIO).data_loss());
  Status lost = Status::IOError("write f", EIO, /*data_loss=*/true);
  EXPECT_TRUE(lost.data_loss());
  EXPECT_NE(lost.ToString().find("[data lost]"), std::string::npos);
}

TEST(StatusTest, ToStringIncludesErrnoText) {
  Status s = Status::IOError("read cache.bin.1 [4096, +8192)", EIO);
  EXPECT_EQ(s.ToString(), std::string("IOError: read cache.bin.1 [4096, +8192): ") +
                              std::strerror(EIO) + " (errno " + std::to_string(EIO) + ")");
  Status full = Status::IOError("write x", ENOSPC);
  EXPECT_NE(full.ToString().find(std::strerror(ENOSPC)), std::string::npos);
  EXPECT_EQ(full.ToString().rfind("NoSpace: write x", 0), 0u);
}

TEST(StatusTest, WithContextPrefixesMessage) {
  Status s = Status::IOError("read f", EINTR, /*data_loss=*/true);
  Status c = s.WithContext("load page 7");
  EXPECT_EQ(c.message(), "load page 7: read f");
  // Everything else is kept.
  EXPECT_EQ(c.code(), StatusCode::kIOError);
  EXPECT_EQ(c.err_no(), EINTR);
  EXPECT_TRUE(c.retryable());
  EXPECT_TRUE(c.data_loss());
  EXPECT_EQ(s.message(), "read f");  // the original is unchanged
  EXPECT_TRUE(Status::OK().WithContext("ctx").ok());
  EXPECT_EQ(Status::NotFound("k").WithContext("a").WithContext("b").message(), "b: a: k");
}

TEST(StatusTest, CopyIsDeepAndMovesLeaveOk) {
  Status a = Status::IOError("read f", EAGAIN);
  Status b(a);
  EXPECT_EQ(b.code(), a.code());
  EXPECT_EQ(b.message(), a.message());
  EXPECT_EQ(b.err_no(), EAGAIN);
  EXPECT_TRUE(b.retryable());
  EXPECT_NE(a.message().data(), b.message().data());  // own copy of the message
  b = b.WithContext("x");
  EXPECT_EQ(a.message(), "read f");

  Status c = Status::NotFound("k");
  c = a;  // copy-assign over an error
  EXPECT_EQ(c.code(), StatusCode::kIOError);
  c = Status::OK();
  EXPECT_TRUE(c.ok());
  Status ok;
  Status ok_copy(ok);
  EXPECT_TRUE(ok_copy.ok());
  Status& self = a;
  a = self;  // self-assignment keeps the state
  EXPECT_EQ(a.message(), "read f");

  Status moved(std::move(a));
  EXPECT_EQ(moved.message(), "read f");
}

Result<int> Half(int v) {
  if (v % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(v));
  return v / 2;
}

Status CheckPositive(int v) {
  return v > 0 ? Status::OK() : Status::InvalidArgument("not positive");
}

Result<int> Quarter(int v) {
  ORBITKV_RETURN_IF_ERROR(CheckPositive(v));
  ORBITKV_ASSIGN_OR_RETURN(int h, Half(v));
  int q = 0;
  ORBITKV_ASSIGN_OR_RETURN(q, Half(h));  // assigns an existing variable too
  return q;
}

Status UsesMoveOnly(std::unique_ptr<int>* out) {
  auto make = []() -> Result<std::unique_ptr<int>> { return std::make_unique<int>(42); };
  ORBITKV_ASSIGN_OR_RETURN(*out, make());
  return Status::OK();
}

TEST(ResultTest, ValueAndError) {
  Result<int> r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 4);
  EXPECT_EQ(*r, 4);
  EXPECT_EQ(r.value_or(-1), 4);

  Result<int> e = Half(3);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "odd: 3");
  EXPECT_EQ(e.value_or(-1), -1);

  Result<std::string> s = std::string("abc");
  EXPECT_EQ(s->size(), 3u);
}

TEST(ResultTest, OkStatusBecomesInternalError) {
  Result<int> r = Status::OK();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
  std::unique_ptr<int> out;
  ASSERT_TRUE(UsesMoveOnly(&out).ok());
  EXPECT_EQ(*out, 42);
}

TEST(ResultTest, Macros) {
  Result<int> q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
  // ASSIGN_OR_RETURN propagates the first failure.
  Result<int> odd = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "odd: 3");
  // RETURN_IF_ERROR stops before anything else runs.
  Result<int> neg = Quarter(-4);
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().message(), "not positive");
}

}  // namespace
}  // namespace orbitkv
