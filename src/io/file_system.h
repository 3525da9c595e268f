// FileSystem: the seam for every file system call the store makes outside the
// io engine (open, stat, fallocate, truncate, small header reads and writes).
// Default() is the real POSIX implementation. FileSystemWrapper forwards to a
// target, so a test double overrides only what it changes. FaultInjectingFileSystem
// fails, shortens or stalls the Nth call of a kind. Implementations are thread-safe.
// Errors name the path (or fd) and range: Status::IOError("fallocate /x.1 [0, +1 GB)", errno).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "orbitkv/status.h"

namespace orbitkv {

struct FileInfo {
  bool exists = false;
  bool is_regular = false;
  bool is_directory = false;
  bool is_block_device = false;
  bool is_symlink = false;
  uint64_t size = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // lstat(2): does not follow a final symlink. A missing path is {exists=false}, not an error.
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // open(2); returns the fd. Retries EINTR.
  virtual Result<int> Open(const std::string& path, int flags, mode_t mode) = 0;
  virtual Status Close(int fd) = 0;
  // fallocate(2) with mode 0 (reserve blocks, extend size).
  virtual Status Fallocate(int fd, uint64_t offset, uint64_t len) = 0;
  virtual Status Truncate(int fd, uint64_t size) = 0;
  // One pread/pwrite(2) call (may be short); EINTR retried.
  virtual Result<size_t> PRead(int fd, void* buf, size_t n, uint64_t offset) = 0;
  virtual Result<size_t> PWrite(int fd, const void* buf, size_t n, uint64_t offset) = 0;
  virtual Status Fsync(int fd) = 0;
  virtual Status Unlink(const std::string& path) = 0;
  // Takes an exclusive lock on the whole file through fd's open file
  // description (fcntl F_OFD_SETLK, F_WRLCK), without waiting. It is held
  // until the last fd of that description closes (or the process dies), and
  // conflicts with every other open file description, in this process too.
  // Busy when another one holds it.
  virtual Status LockExclusive(int fd) = 0;

  static FileSystem* Default();
};

// Reads exactly n bytes or fails (a short read at EOF is an IOError naming `what`).
Status ReadFull(FileSystem* fs, int fd, void* buf, size_t n, uint64_t offset,
                std::string_view what);
Status WriteFull(FileSystem* fs, int fd, const void* buf, size_t n, uint64_t offset,
                 std::string_view what);

class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(FileSystem* target) : target_(target) {}
  Result<FileInfo> Stat(const std::string& path) override { return target_->Stat(path); }
  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    return target_->Open(path, flags, mode);
  }
  Status Close(int fd) override { return target_->Close(fd); }
  Status Fallocate(int fd, uint64_t offset, uint64_t len) override {
    return target_->Fallocate(fd, offset, len);
  }
  Status Truncate(int fd, uint64_t size) override { return target_->Truncate(fd, size); }
  Result<size_t> PRead(int fd, void* buf, size_t n, uint64_t offset) override {
    return target_->PRead(fd, buf, n, offset);
  }
  Result<size_t> PWrite(int fd, const void* buf, size_t n, uint64_t offset) override {
    return target_->PWrite(fd, buf, n, offset);
  }
  Status Fsync(int fd) override { return target_->Fsync(fd); }
  Status Unlink(const std::string& path) override { return target_->Unlink(path); }
  Status LockExclusive(int fd) override { return target_->LockExclusive(fd); }

 protected:
  FileSystem* target() const { return target_; }

 private:
  FileSystem* target_;
};

// Injects faults into calls of one kind. "The Nth call" counts calls of that
// kind made after the rule is added, starting at 1. A rule fires once unless
// `every` is set (then every call from the Nth on). Counts every call per kind.
class FaultInjectingFileSystem : public FileSystemWrapper {
 public:
  enum class Op { kStat, kOpen, kClose, kFallocate, kTruncate, kPRead, kPWrite, kFsync, kUnlink };
  enum class Fault { kError, kShort, kStall };
  struct Rule {
    Op op;
    uint64_t nth = 1;
    Fault fault = Fault::kError;
    int err = 5;  // EIO
    bool every = false;
    std::chrono::milliseconds stall{0};  // kStall: sleep, then perform the call
  };
  explicit FaultInjectingFileSystem(FileSystem* target) : FileSystemWrapper(target) {}
  void AddRule(Rule rule);
  void FailNth(Op op, uint64_t nth, int err) { AddRule({op, nth, Fault::kError, err, false, {}}); }
  void ClearRules();
  uint64_t Calls(Op op) const;

  Result<FileInfo> Stat(const std::string& path) override;
  Result<int> Open(const std::string& path, int flags, mode_t mode) override;
  Status Close(int fd) override;
  Status Fallocate(int fd, uint64_t offset, uint64_t len) override;
  Status Truncate(int fd, uint64_t size) override;
  Result<size_t> PRead(int fd, void* buf, size_t n, uint64_t offset) override;
  Result<size_t> PWrite(int fd, const void* buf, size_t n, uint64_t offset) override;
  Status Fsync(int fd) override;
  Status Unlink(const std::string& path) override;

 private:
  // Returns the rule that fires on this call, if any; counts the call.
  std::optional<Rule> Next(Op op);
  mutable std::mutex mu_;
  std::map<Op, uint64_t> calls_;
  std::vector<std::pair<Rule, uint64_t>> rules_;  // rule, calls of its op when added
};

}  // namespace orbitkv
