// Status and Result<T>: OrbitKV's one error type. No exceptions cross a module
// boundary; every fallible call returns one of these.
// An OK Status is a null pointer (cheap to return and test). An error carries a
// code, a message, and for I/O the errno, whether a retry may succeed, and
// whether data was lost. Thread-compatible: distinct objects on distinct threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace orbitkv {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kIOError,
  kNoSpace,      // ENOSPC / EDQUOT: storage is full
  kBusy,         // a resource is pinned or in use; trying elsewhere may work
  kUnavailable,  // a capability (GPU, cuFile, shard) is not there
  kCancelled,
  kDeadlineExceeded,
  kCorruption,
  kAlreadyExists,
  kFailedPrecondition,
  kResourceExhausted,
  kPermissionDenied,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // OK
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Busy(std::string msg) { return {StatusCode::kBusy, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) {
    return {StatusCode::kDeadlineExceeded, std::move(msg)};
  }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
  }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  // A status of any code (kOk gives OK); for decoders and error mappers.
  static Status FromCode(StatusCode code, std::string msg) {
    return code == StatusCode::kOk ? Status() : Status(code, std::move(msg));
  }
  // An I/O failure. `what` names the file (and range); err is the errno.
  // ENOSPC/EDQUOT map to kNoSpace. EINTR/EAGAIN/EBUSY are marked retryable.
  static Status IOError(std::string what, int err, bool data_loss = false);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  std::string_view message() const {
    return state_ ? std::string_view(state_->msg) : std::string_view();
  }
  int err_no() const { return state_ ? state_->err_no : 0; }
  bool retryable() const { return state_ && state_->retryable; }
  bool data_loss() const { return state_ && state_->data_loss; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsNoSpace() const { return code() == StatusCode::kNoSpace; }
  bool IsBusy() const { return code() == StatusCode::kBusy; }
  bool IsCancelled() const { return code() == StatusCode::kCancelled; }

  // "IOError: read cache.bin.1 [4096, +8192): Input/output error (errno 5)".
  std::string ToString() const;
  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;
  // A deliberately ignored status. `why` documents the reason at the call site.
  void IgnoreError(std::string_view why = {}) const {}

 private:
  struct State {
    StatusCode code;
    int err_no = 0;
    bool retryable = false;
    bool data_loss = false;
    std::string msg;
  };
  Status(StatusCode code, std::string msg);
  std::unique_ptr<State> state_;
};

inline bool operator==(const Status& a, StatusCode c) { return a.code() == c; }

// Result<T>: a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                       // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { Normalize(); }  // NOLINT
  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  // REQUIRES: ok().
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T value_or(T alt) const& { return ok() ? std::get<0>(v_) : std::move(alt); }

 private:
  void Normalize() {
    if (std::get<1>(v_).ok()) v_ = Status::Internal("Result constructed from an OK Status");
  }
  std::variant<T, Status> v_;
};

}  // namespace orbitkv

#define ORBITKV_CONCAT_INNER_(a, b) a##b
#define ORBITKV_CONCAT_(a, b) ORBITKV_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define ORBITKV_RETURN_IF_ERROR(expr)   \
  do {                                  \
    ::orbitkv::Status _okv_st = (expr); \
    if (!_okv_st.ok()) return _okv_st;  \
  } while (0)

// `lhs = value of expr`, or returns its status.
#define ORBITKV_ASSIGN_OR_RETURN(lhs, expr) \
  ORBITKV_ASSIGN_OR_RETURN_IMPL_(ORBITKV_CONCAT_(_okv_res_, __LINE__), lhs, expr)
#define ORBITKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
