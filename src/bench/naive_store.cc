#include "bench/naive_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "orbitkv/units.h"

namespace orbitkv::bench {
namespace {

// One pread/pwrite; a short transfer is continued (O_DIRECT keeps alignment
// since slots and buffers are 4 KiB multiples).
Status FullIo(bool write, int fd, uint8_t* buf, uint64_t bytes, uint64_t offset,
              const std::string& path) {
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = write ? ::pwrite(fd, buf + done, bytes - done, offset + done)
                            : ::pread(fd, buf + done, bytes - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::IOError(
          (write ? "pwrite " : "pread ") + path + " at " + std::to_string(offset + done),
          n == 0 ? EIO : errno);
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<NaiveStore>> NaiveStore::Create(const std::string& path, uint64_t capacity,
                                                       uint64_t block_bytes) {
  const uint64_t slot = AlignUp(block_bytes, 4096);
  const uint64_t slots = capacity / slot;
  if (slots == 0) return Status::InvalidArgument("the SSD capacity holds no block");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("open " + path + " (O_DIRECT)", errno);
  if (::ftruncate(fd, static_cast<off_t>(slots * slot)) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::IOError("ftruncate " + path, e);
  }
  return std::unique_ptr<NaiveStore>(new NaiveStore(path, fd, slots, slot));
}

NaiveStore::~NaiveStore() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

uint32_t NaiveStore::Prefix(std::span<const BlockKey> keys) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  while (n < keys.size() && index_.count(keys[n])) ++n;
  return n;
}

bool NaiveStore::Contains(const BlockKey& key) const {
  std::lock_guard<std::mutex> l(mu_);
  return index_.count(key) > 0;
}

Status NaiveStore::Write(const BlockKey& key, const uint8_t* buf) {
  uint64_t slot = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (index_.count(key) || writing_.count(key)) return Status::AlreadyExists("stored");
    if (next_slot_ == slots_) {
      ++dropped_;
      return Status::ResourceExhausted("the naive store is full");
    }
    slot = next_slot_++;
    writing_[key] = slot;
  }
  Status st = FullIo(true, fd_, const_cast<uint8_t*>(buf), slot_bytes_, slot * slot_bytes_, path_);
  std::lock_guard<std::mutex> l(mu_);
  writing_.erase(key);
  if (st.ok()) index_[key] = slot;  // visible only once every byte is written
  return st;
}

Status NaiveStore::Read(const BlockKey& key, uint8_t* buf) const {
  uint64_t slot = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return Status::NotFound("not stored");
    slot = it->second;
  }
  return FullIo(false, fd_, buf, slot_bytes_, slot * slot_bytes_, path_);
}

uint64_t NaiveStore::dropped() const {
  std::lock_guard<std::mutex> l(mu_);
  return dropped_;
}

}  // namespace orbitkv::bench
