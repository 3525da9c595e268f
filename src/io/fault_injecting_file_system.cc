// FaultInjectingFileSystem: counts calls per kind and applies the first rule
// that matches the call. kShort halves PRead/PWrite and is a no-op elsewhere.
#include "io/file_system.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace orbitkv {
namespace {

const char* OpName(FaultInjectingFileSystem::Op op) {
  using Op = FaultInjectingFileSystem::Op;
  switch (op) {
    case Op::kStat:
      return "stat";
    case Op::kOpen:
      return "open";
    case Op::kClose:
      return "close";
    case Op::kFallocate:
      return "fallocate";
    case Op::kTruncate:
      return "truncate";
    case Op::kPRead:
      return "pread";
    case Op::kPWrite:
      return "pwrite";
    case Op::kFsync:
      return "fsync";
    case Op::kUnlink:
      return "unlink";
  }
  return "?";
}

Status Injected(const FaultInjectingFileSystem::Rule& rule, std::string_view what) {
  return Status::IOError(fmt::format("injected fault: {} {}", OpName(rule.op), what), rule.err);
}

std::string Fd(int fd) { return fmt::format("fd {}", fd); }
std::string FdRange(int fd, uint64_t offset, uint64_t len) {
  return fmt::format("fd {} [{}, +{})", fd, offset, len);
}

// kShort: half the bytes, but at least one so the caller still progresses.
size_t Shorten(size_t n) { return n > 1 ? n / 2 : n; }

void MaybeStall(const FaultInjectingFileSystem::Rule& rule) {
  if (rule.fault == FaultInjectingFileSystem::Fault::kStall && rule.stall.count() > 0) {
    std::this_thread::sleep_for(rule.stall);
  }
}

}  // namespace

void FaultInjectingFileSystem::AddRule(Rule rule) {
  rule.nth = std::max<uint64_t>(rule.nth, 1);
  std::lock_guard<std::mutex> lock(mu_);
  rules_.emplace_back(rule, calls_[rule.op]);
}

void FaultInjectingFileSystem::ClearRules() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

uint64_t FaultInjectingFileSystem::Calls(Op op) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

std::optional<FaultInjectingFileSystem::Rule> FaultInjectingFileSystem::Next(Op op) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t count = ++calls_[op];
  for (const auto& [rule, base] : rules_) {
    if (rule.op != op) continue;
    const uint64_t nth_since_added = count - base;
    if (rule.every ? nth_since_added >= rule.nth : nth_since_added == rule.nth) return rule;
  }
  return std::nullopt;
}

Result<FileInfo> FaultInjectingFileSystem::Stat(const std::string& path) {
  if (auto rule = Next(Op::kStat)) {
    if (rule->fault == Fault::kError) return Injected(*rule, path);
    MaybeStall(*rule);
  }
  return target()->Stat(path);
}

Result<int> FaultInjectingFileSystem::Open(const std::string& path, int flags, mode_t mode) {
  if (auto rule = Next(Op::kOpen)) {
    if (rule->fault == Fault::kError) return Injected(*rule, path);
    MaybeStall(*rule);
  }
  return target()->Open(path, flags, mode);
}

Status FaultInjectingFileSystem::Close(int fd) {
  if (auto rule = Next(Op::kClose)) {
    if (rule->fault == Fault::kError) return Injected(*rule, Fd(fd));
    MaybeStall(*rule);
  }
  return target()->Close(fd);
}

Status FaultInjectingFileSystem::Fallocate(int fd, uint64_t offset, uint64_t len) {
  if (auto rule = Next(Op::kFallocate)) {
    if (rule->fault == Fault::kError) return Injected(*rule, FdRange(fd, offset, len));
    MaybeStall(*rule);
  }
  return target()->Fallocate(fd, offset, len);
}

Status FaultInjectingFileSystem::Truncate(int fd, uint64_t size) {
  if (auto rule = Next(Op::kTruncate)) {
    if (rule->fault == Fault::kError) {
      return Injected(*rule, fmt::format("fd {} to {}", fd, size));
    }
    MaybeStall(*rule);
  }
  return target()->Truncate(fd, size);
}

Result<size_t> FaultInjectingFileSystem::PRead(int fd, void* buf, size_t n, uint64_t offset) {
  if (auto rule = Next(Op::kPRead)) {
    if (rule->fault == Fault::kError) return Injected(*rule, FdRange(fd, offset, n));
    if (rule->fault == Fault::kShort) return target()->PRead(fd, buf, Shorten(n), offset);
    MaybeStall(*rule);
  }
  return target()->PRead(fd, buf, n, offset);
}

Result<size_t> FaultInjectingFileSystem::PWrite(int fd, const void* buf, size_t n,
                                                uint64_t offset) {
  if (auto rule = Next(Op::kPWrite)) {
    if (rule->fault == Fault::kError) return Injected(*rule, FdRange(fd, offset, n));
    if (rule->fault == Fault::kShort) return target()->PWrite(fd, buf, Shorten(n), offset);
    MaybeStall(*rule);
  }
  return target()->PWrite(fd, buf, n, offset);
}

Status FaultInjectingFileSystem::Fsync(int fd) {
  if (auto rule = Next(Op::kFsync)) {
    if (rule->fault == Fault::kError) return Injected(*rule, Fd(fd));
    MaybeStall(*rule);
  }
  return target()->Fsync(fd);
}

Status FaultInjectingFileSystem::Unlink(const std::string& path) {
  if (auto rule = Next(Op::kUnlink)) {
    if (rule->fault == Fault::kError) return Injected(*rule, path);
    MaybeStall(*rule);
  }
  return target()->Unlink(path);
}

}  // namespace orbitkv
