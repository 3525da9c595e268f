// Shard files: the SSD cache is split across N files derived from the
// configured path: shard 0 is the path itself, shard i > 0 is "<path>.<i>".
// Each file starts with a 4 KiB header that identifies it as OrbitKV's; data
// extents follow at kShardHeaderSize. Startup recreates every shard empty (the
// SSD cache is a best-effort cache), but only after checking that every path is
// absent or already an OrbitKV shard: another file, a directory, a symlink or a
// block device is refused and never written. Not thread-safe during Create;
// afterwards fds are read-only state.
//
// Exclusive use: a ShardSet holds, for its lifetime, an OFD lock
// (FileSystem::LockExclusive) on "<path>.lock", into which it writes its pid,
// and one on every shard, all taken before any shard byte is written. A second
// Manager on the same path (another process, or another ShardSet in this
// one) fails Create with FailedPrecondition naming the holder's pid (read from
// the lock file: OFD locks report no pid) and changes nothing. The lock file
// stays after exit; a lock dies with its holder, so a stale file never blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "orbitkv/status.h"

namespace orbitkv {

inline constexpr uint64_t kShardHeaderSize = 4096;
inline constexpr uint32_t kShardFormatVersion = 1;

struct ShardHeader {
  uint32_t version = kShardFormatVersion;
  uint32_t shard_index = 0;
  uint32_t shard_count = 1;
  uint64_t data_capacity = 0;
  uint64_t created_unix_ns = 0;
};

// Encodes into exactly kShardHeaderSize bytes (rest zero).
void EncodeShardHeader(const ShardHeader& h, std::span<uint8_t, kShardHeaderSize> out);
// Parses untrusted bytes. NotFound if the magic is absent (not an OrbitKV file);
// Corruption if the magic is there but the rest does not check out.
Result<ShardHeader> DecodeShardHeader(std::span<const uint8_t> bytes);

std::vector<std::string> ShardPaths(const std::string& base, uint32_t count);

// OK if `path` does not exist or holds an OrbitKV shard header. Reads at most
// the header; never writes. The error names the path and what it is.
Status CheckShardPath(FileSystem* fs, const std::string& path);

struct ShardSetOptions {
  std::string base_path;
  uint32_t count = 4;
  uint64_t data_capacity = 0;     // per shard, multiple of 4096
  bool reserve_capacity = false;  // fallocate the whole file (cuFile modes)
  bool direct_io = true;          // data fds opened O_DIRECT
};

// The open shard files. Closes its fds on destruction.
class ShardSet {
 public:
  // Checks every path, locks the path and every shard, then recreates every
  // shard. With reserve_capacity, each shard is fallocate'd; ENOSPC/EDQUOT/
  // EOPNOTSUPP fails with the shard and size, after truncating the shards
  // already reserved. Any failure removes the shard files this call created
  // (cleanup errors are logged).
  static Result<std::unique_ptr<ShardSet>> Create(FileSystem* fs, const ShardSetOptions& options);
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  uint32_t count() const { return static_cast<uint32_t>(fds_.size()); }
  int fd(uint32_t shard) const { return fds_[shard]; }
  const std::string& path(uint32_t shard) const { return paths_[shard]; }
  // Reserves the physical space of every shard (fallocate of header + data
  // capacity) after a sparse Create: the cuFile modes call this once every
  // shard registered with cuFile. ENOSPC/EDQUOT/EOPNOTSUPP (any failure) names
  // the shard and size; every shard is then truncated to its header to give
  // the space back and the shard files Create made are removed (cleanup
  // errors are logged). The caller fails startup.
  Status Reserve(uint64_t data_capacity);
  // File offset of a data-region offset.
  static uint64_t FileOffset(uint64_t data_offset) { return kShardHeaderSize + data_offset; }

 private:
  ShardSet(FileSystem* fs, std::vector<std::string> paths, std::vector<int> fds)
      : fs_(fs), paths_(std::move(paths)), fds_(std::move(fds)) {}
  FileSystem* fs_;
  std::vector<std::string> paths_;
  std::vector<int> fds_;
  std::vector<int> lock_fds_;  // hold the shard locks and the lock file's
  std::vector<bool> created_;  // per shard: Create made the file
};

// "<base_path>.lock".
std::string LockFilePath(const std::string& base_path);
// Opens (creating, 0600) and OFD-locks the lock file of `base_path`, then
// writes this process's pid into it; returns the fd, which holds the lock.
// FailedPrecondition naming the holder's pid when another holds it.
Result<int> LockCachePath(FileSystem* fs, const std::string& base_path);

}  // namespace orbitkv
