#include "store/shard_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "orbitkv/logging.h"
#include "orbitkv/units.h"

namespace orbitkv {
namespace {

constexpr char kMagic[16] = {'O', 'R', 'B', 'I', 'T', 'K', 'V', ' ',
                             'S', 'S', 'D', 'S', 'H', 'A', 'R', 'D'};
// Layout: magic[16] version:u32 header_size:u32 index:u32 count:u32
//         capacity:u64 created:u64 crc32:u32 (over bytes [0, 56)).
constexpr size_t kCrcOffset = 56;

template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts only (x86_64, aarch64)
}
template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint32_t Crc(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(crc32(0L, p, static_cast<uInt>(n)));
}

}  // namespace

void EncodeShardHeader(const ShardHeader& h, std::span<uint8_t, kShardHeaderSize> out) {
  std::memset(out.data(), 0, out.size());
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, sizeof kMagic);
  Put<uint32_t>(p + 16, h.version);
  Put<uint32_t>(p + 20, static_cast<uint32_t>(kShardHeaderSize));
  Put<uint32_t>(p + 24, h.shard_index);
  Put<uint32_t>(p + 28, h.shard_count);
  Put<uint64_t>(p + 32, h.data_capacity);
  Put<uint64_t>(p + 40, h.created_unix_ns);
  Put<uint32_t>(p + kCrcOffset, Crc(p, kCrcOffset));
}

Result<ShardHeader> DecodeShardHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return Status::NotFound("no OrbitKV shard magic");
  }
  if (bytes.size() < kCrcOffset + 4) return Status::Corruption("shard header truncated");
  const uint8_t* p = bytes.data();
  if (Get<uint32_t>(p + kCrcOffset) != Crc(p, kCrcOffset)) {
    return Status::Corruption("shard header checksum mismatch");
  }
  ShardHeader h;
  h.version = Get<uint32_t>(p + 16);
  uint32_t header_size = Get<uint32_t>(p + 20);
  h.shard_index = Get<uint32_t>(p + 24);
  h.shard_count = Get<uint32_t>(p + 28);
  h.data_capacity = Get<uint64_t>(p + 32);
  h.created_unix_ns = Get<uint64_t>(p + 40);
  if (header_size != kShardHeaderSize) return Status::Corruption("shard header size mismatch");
  if (h.shard_count == 0 || h.shard_index >= h.shard_count) {
    return Status::Corruption("shard index out of range");
  }
  return h;
}

std::vector<std::string> ShardPaths(const std::string& base, uint32_t count) {
  std::vector<std::string> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i)
    out.push_back(i == 0 ? base : base + "." + std::to_string(i));
  return out;
}

Status CheckShardPath(FileSystem* fs, const std::string& path) {
  ORBITKV_ASSIGN_OR_RETURN(FileInfo info, fs->Stat(path));
  if (!info.exists) return Status::OK();
  auto refuse = [&](std::string_view what) {
    return Status::FailedPrecondition("refusing SSD cache path " + path + ": it is " +
                                      std::string(what) + ", not an OrbitKV cache file");
  };
  if (info.is_symlink) return refuse("a symbolic link");
  if (info.is_directory) return refuse("a directory");
  if (info.is_block_device) return refuse("a block device");
  if (!info.is_regular) return refuse("a special file");
  if (info.size < kShardHeaderSize)
    return refuse("a file of " + std::to_string(info.size) + " bytes");
  ORBITKV_ASSIGN_OR_RETURN(int fd, fs->Open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0));
  std::array<uint8_t, kShardHeaderSize> buf{};
  Status st = ReadFull(fs, fd, buf.data(), buf.size(), 0, path);
  fs->Close(fd).IgnoreError("read-only fd");
  ORBITKV_RETURN_IF_ERROR(st);
  Result<ShardHeader> h = DecodeShardHeader(buf);
  if (h.status().IsNotFound()) return refuse("another program's file");
  if (!h.ok()) {
    return Status::FailedPrecondition("refusing SSD cache path " + path +
                                      ": OrbitKV shard header is damaged (" +
                                      std::string(h.status().message()) + "); remove it by hand");
  }
  return Status::OK();
}

Result<std::unique_ptr<ShardSet>> ShardSet::Create(FileSystem* fs, const ShardSetOptions& o) {
  if (o.base_path.empty()) return Status::InvalidArgument("SSD cache path is empty");
  if (o.count == 0) return Status::InvalidArgument("shard count must be at least 1");
  if (o.data_capacity == 0 || o.data_capacity % 4096 != 0) {
    return Status::InvalidArgument("shard capacity must be a positive multiple of 4096 bytes");
  }
  std::vector<std::string> paths = ShardPaths(o.base_path, o.count);
  // Check every path before writing any: a refused path leaves everything untouched.
  for (const std::string& p : paths) ORBITKV_RETURN_IF_ERROR(CheckShardPath(fs, p));

  std::filesystem::path parent = std::filesystem::path(o.base_path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return Status::IOError("create directory " + parent.string(), ec.value());
  }

  // One Manager per path: the lock file first (its pid names the holder),
  // then every shard, before any byte of a shard is touched.
  ORBITKV_ASSIGN_OR_RETURN(int lock_fd, LockCachePath(fs, o.base_path));
  std::vector<bool> created;  // paths absent before this call
  for (const std::string& p : paths) {
    Result<FileInfo> info = fs->Stat(p);
    created.push_back(info.ok() && !info->exists);
  }

  const uint64_t file_size = kShardHeaderSize + o.data_capacity;
  std::vector<int> fds;
  auto release = [&](size_t reserved_upto) {
    // Truncate what was reserved so a failed start does not keep the space,
    // and remove the shard files this start created.
    for (size_t i = 0; i < fds.size(); ++i) {
      if (i < reserved_upto) {
        Status st = fs->Truncate(fds[i], kShardHeaderSize);
        if (!st.ok()) OKV_LOG_ERROR("cleanup: truncating {} failed: {}", paths[i], st.ToString());
      }
      if (created[i]) {
        Status st = fs->Unlink(paths[i]);
        if (!st.ok()) OKV_LOG_ERROR("cleanup: removing {} failed: {}", paths[i], st.ToString());
      }
      fs->Close(fds[i]).IgnoreError("cleanup after failed start");
    }
    fds.clear();
    fs->Close(lock_fd).IgnoreError("cleanup after failed start");
  };

  const uint64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  for (uint32_t i = 0; i < o.count; ++i) {
    Result<int> fd = fs->Open(paths[i], O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (!fd.ok()) {
      release(fds.size());
      return fd.status();
    }
    fds.push_back(*fd);
    if (Status lk = fs->LockExclusive(*fd); !lk.ok()) {
      Status err = lk.IsBusy() ? Status::FailedPrecondition(
                                     "SSD shard " + paths[i] +
                                     " is in use by another OrbitKV Manager (its shard lock is "
                                     "held); give each Manager its own --ssd-cache-path")
                               : lk.WithContext("locking SSD shard " + paths[i]);
      created[i] = false;  // another Manager's file: never removed
      release(0);
      return err;
    }
    Status st = fs->Truncate(*fd, 0);
    std::array<uint8_t, kShardHeaderSize> header{};
    if (st.ok()) {
      EncodeShardHeader({kShardFormatVersion, i, o.count, o.data_capacity, now_ns}, header);
      st = WriteFull(fs, *fd, header.data(), header.size(), 0, paths[i]);
    }
    if (st.ok() && o.reserve_capacity) {
      st = fs->Fallocate(*fd, 0, file_size);
      if (!st.ok()) {
        Status err = Status::IOError("reserving " + FormatByteSize(file_size) + " (" +
                                         std::to_string(file_size) + " bytes) for SSD shard " +
                                         std::to_string(i) + " " + paths[i],
                                     st.err_no());
        release(fds.size());
        return err;
      }
    } else if (st.ok()) {
      st = fs->Truncate(*fd, file_size);  // logical size; blocks are allocated on write
    }
    if (!st.ok()) {
      release(o.reserve_capacity ? fds.size() : 0);
      return st.WithContext("creating SSD shard " + std::to_string(i));
    }
  }
  // Data I/O goes through O_DIRECT fds; the setup fds are closed.
  std::vector<int> data_fds;
  for (uint32_t i = 0; i < o.count; ++i) {
    int flags = O_RDWR | O_NOFOLLOW | O_CLOEXEC | (o.direct_io ? O_DIRECT : 0);
    Result<int> fd = fs->Open(paths[i], flags, 0);
    if (!fd.ok()) {
      for (int d : data_fds) fs->Close(d).IgnoreError("cleanup after failed start");
      release(o.reserve_capacity ? fds.size() : 0);
      if (fd.status().err_no() == EINVAL && o.direct_io) {
        return Status::Unavailable("the file system of " + paths[i] +
                                   " does not support O_DIRECT; choose an SSD-backed path");
      }
      return fd.status();
    }
    data_fds.push_back(*fd);
  }
  // The setup fds carry the shard locks: kept open for the set's lifetime.
  fds.push_back(lock_fd);
  auto set = std::unique_ptr<ShardSet>(new ShardSet(fs, std::move(paths), std::move(data_fds)));
  set->lock_fds_ = std::move(fds);
  set->created_ = std::move(created);
  return set;
}

Result<int> LockCachePath(FileSystem* fs, const std::string& base_path) {
  const std::string path = LockFilePath(base_path);
  ORBITKV_ASSIGN_OR_RETURN(FileInfo info, fs->Stat(path));
  if (info.exists && !info.is_regular) {
    return Status::FailedPrecondition("refusing SSD cache lock file " + path +
                                      ": it is not a regular file");
  }
  ORBITKV_ASSIGN_OR_RETURN(int fd, fs->Open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  Status lk = fs->LockExclusive(fd);
  if (!lk.ok()) {
    std::string holder = "pid unknown";
    char buf[32] = {};
    Result<size_t> n = fs->PRead(fd, buf, sizeof buf - 1, 0);
    if (n.ok() && *n > 0) {
      std::string text(buf, *n);
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
        holder = "pid " + text;
      }
    }
    fs->Close(fd).IgnoreError("lock refused");
    if (!lk.IsBusy()) return lk.WithContext("locking " + path);
    return Status::FailedPrecondition(
        "SSD cache path " + base_path + " is in use by another OrbitKV Manager (" + holder +
        ", lock file " + path + "); give each Manager its own --ssd-cache-path");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  Status st = fs->Truncate(fd, 0);
  if (st.ok()) st = WriteFull(fs, fd, pid.data(), pid.size(), 0, path);
  if (!st.ok()) {
    fs->Close(fd).IgnoreError("cleanup after failed lock");
    return st.WithContext("writing the pid into " + path);
  }
  return fd;
}

std::string LockFilePath(const std::string& base_path) { return base_path + ".lock"; }

Status ShardSet::Reserve(uint64_t data_capacity) {
  const uint64_t file_size = kShardHeaderSize + data_capacity;
  for (size_t i = 0; i < fds_.size(); ++i) {
    Status st = fs_->Fallocate(fds_[i], 0, file_size);
    if (st.ok()) continue;
    Status err = Status::IOError("reserving " + FormatByteSize(file_size) + " (" +
                                     std::to_string(file_size) + " bytes) for SSD shard " +
                                     std::to_string(i) + " " + paths_[i],
                                 st.err_no());
    for (size_t j = 0; j < fds_.size(); ++j) {
      Status t = fs_->Truncate(fds_[j], kShardHeaderSize);
      if (!t.ok()) OKV_LOG_ERROR("cleanup: truncating {} failed: {}", paths_[j], t.ToString());
      if (created_[j]) {
        Status u = fs_->Unlink(paths_[j]);
        if (!u.ok()) OKV_LOG_ERROR("cleanup: removing {} failed: {}", paths_[j], u.ToString());
      }
    }
    return err;
  }
  return Status::OK();
}

ShardSet::~ShardSet() {
  for (int fd : fds_) fs_->Close(fd).IgnoreError("shutdown");
  for (int fd : lock_fds_) fs_->Close(fd).IgnoreError("shutdown: releases the locks");
}

}  // namespace orbitkv
