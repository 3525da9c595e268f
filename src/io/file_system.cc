// POSIX FileSystem and the ReadFull/WriteFull helpers.
#include "io/file_system.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>

namespace orbitkv {
namespace {

std::string FdRange(std::string_view op, int fd, uint64_t offset, uint64_t len) {
  return fmt::format("{} fd {} [{}, +{})", op, fd, offset, len);
}

// Offsets and lengths arrive as uint64_t; off_t is signed. Values past its
// range would wrap into negative offsets, so they fail as EINVAL up front.
bool FitsOffT(uint64_t offset, uint64_t len) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<off_t>::max());
  return offset <= kMax && len <= kMax - offset;
}

class PosixFileSystem final : public FileSystem {
 public:
  Result<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    int rc;
    do {
      rc = ::lstat(path.c_str(), &st);
    } while (rc != 0 && errno == EINTR);
    FileInfo info;
    if (rc != 0) {
      // ENOTDIR: a prefix is a regular file, so the path cannot exist either.
      if (errno == ENOENT || errno == ENOTDIR) return info;
      return Status::IOError("stat " + path, errno);
    }
    info.exists = true;
    info.is_regular = S_ISREG(st.st_mode);
    info.is_directory = S_ISDIR(st.st_mode);
    info.is_block_device = S_ISBLK(st.st_mode);
    info.is_symlink = S_ISLNK(st.st_mode);
    info.size = static_cast<uint64_t>(st.st_size);
    return info;
  }

  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    int fd;
    do {
      fd = ::open(path.c_str(), flags, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Status::IOError("open " + path, errno);
    return fd;
  }

  Status Close(int fd) override {
    // Not retried on EINTR: Linux releases the descriptor before reporting
    // EINTR, and a second close could close a descriptor another thread just got.
    if (::close(fd) != 0 && errno != EINTR) {
      return Status::IOError(fmt::format("close fd {}", fd), errno);
    }
    return Status::OK();
  }

  Status Fallocate(int fd, uint64_t offset, uint64_t len) override {
    if (!FitsOffT(offset, len))
      return Status::IOError(FdRange("fallocate", fd, offset, len), EINVAL);
    int rc;
    do {
      rc = ::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(len));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return Status::IOError(FdRange("fallocate", fd, offset, len), errno);
    return Status::OK();
  }

  Status Truncate(int fd, uint64_t size) override {
    if (!FitsOffT(size, 0))
      return Status::IOError(fmt::format("truncate fd {} to {}", fd, size), EINVAL);
    int rc;
    do {
      rc = ::ftruncate(fd, static_cast<off_t>(size));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return Status::IOError(fmt::format("truncate fd {} to {}", fd, size), errno);
    return Status::OK();
  }

  Result<size_t> PRead(int fd, void* buf, size_t n, uint64_t offset) override {
    if (!FitsOffT(offset, n)) return Status::IOError(FdRange("pread", fd, offset, n), EINVAL);
    ssize_t got;
    do {
      got = ::pread(fd, buf, n, static_cast<off_t>(offset));
    } while (got < 0 && errno == EINTR);
    if (got < 0) return Status::IOError(FdRange("pread", fd, offset, n), errno);
    return static_cast<size_t>(got);
  }

  Result<size_t> PWrite(int fd, const void* buf, size_t n, uint64_t offset) override {
    if (!FitsOffT(offset, n)) return Status::IOError(FdRange("pwrite", fd, offset, n), EINVAL);
    ssize_t put;
    do {
      put = ::pwrite(fd, buf, n, static_cast<off_t>(offset));
    } while (put < 0 && errno == EINTR);
    if (put < 0) return Status::IOError(FdRange("pwrite", fd, offset, n), errno);
    return static_cast<size_t>(put);
  }

  Status Fsync(int fd) override {
    int rc;
    do {
      rc = ::fsync(fd);
    } while (rc != 0 && errno == EINTR);
    // A failed fsync may have dropped dirty pages: the data is not known durable.
    if (rc != 0) return Status::IOError(fmt::format("fsync fd {}", fd), errno, /*data_loss=*/true);
    return Status::OK();
  }

  Status Unlink(const std::string& path) override {
    int rc;
    do {
      rc = ::unlink(path.c_str());
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return Status::IOError("unlink " + path, errno);
    return Status::OK();
  }

  Status LockExclusive(int fd) override {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file; l_pid must be 0
    int rc;
    do {
      rc = ::fcntl(fd, F_OFD_SETLK, &fl);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) return Status::OK();
    if (errno == EAGAIN || errno == EACCES) {
      return Status::Busy(fmt::format("fd {} is locked by another open file description", fd));
    }
    return Status::IOError(fmt::format("fcntl(F_OFD_SETLK) fd {}", fd), errno);
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static PosixFileSystem* const fs = new PosixFileSystem();  // never destroyed
  return fs;
}

Status ReadFull(FileSystem* fs, int fd, void* buf, size_t n, uint64_t offset,
                std::string_view what) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    Result<size_t> got = fs->PRead(fd, p + done, n - done, offset + done);
    if (!got.ok()) {
      return got.status().WithContext(fmt::format("read {} [{}, +{})", what, offset, n));
    }
    if (*got == 0) {
      return Status::IOError(
          fmt::format("read {} [{}, +{}): short read, end of file after {} bytes", what, offset, n,
                      done),
          EIO);
    }
    done += *got;
  }
  return Status::OK();
}

Status WriteFull(FileSystem* fs, int fd, const void* buf, size_t n, uint64_t offset,
                 std::string_view what) {
  const auto* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    Result<size_t> put = fs->PWrite(fd, p + done, n - done, offset + done);
    if (!put.ok()) {
      return put.status().WithContext(fmt::format("write {} [{}, +{})", what, offset, n));
    }
    if (*put == 0) {
      return Status::IOError(
          fmt::format("write {} [{}, +{}): short write, no progress after {} bytes", what, offset,
                      n, done),
          EIO);
    }
    done += *put;
  }
  return Status::OK();
}

}  // namespace orbitkv
