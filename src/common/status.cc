#include "orbitkv/status.h"

#include <cerrno>
#include <cstring>

namespace orbitkv {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kNoSpace:
      return "NoSpace";
    case StatusCode::kBusy:
      return "Busy";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string msg)
    : state_(std::make_unique<State>(State{code, 0, false, false, std::move(msg)})) {}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

Status Status::IOError(std::string what, int err, bool data_loss) {
  StatusCode code = (err == ENOSPC || err == EDQUOT) ? StatusCode::kNoSpace : StatusCode::kIOError;
  Status s(code, std::move(what));
  s.state_->err_no = err;
  s.state_->retryable = err == EINTR || err == EAGAIN || err == EBUSY;
  s.state_->data_loss = data_loss;
  return s;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(state_->code));
  out += ": ";
  out += state_->msg;
  if (state_->err_no != 0) {
    out += ": ";
    out += std::strerror(state_->err_no);
    out += " (errno " + std::to_string(state_->err_no) + ")";
  }
  if (state_->data_loss) out += " [data lost]";
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  Status s(*this);
  s.state_->msg = std::string(context) + ": " + s.state_->msg;
  return s;
}

}  // namespace orbitkv
