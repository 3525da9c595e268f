// NaiveStore: the baseline route, doing what simple KV offloaders do. Blocks
// live in one file on the same file system as the Manager's SSD cache, opened
// O_DIRECT (so neither side is served by the page cache), in fixed slots of
// the block size rounded up to 4 KiB, indexed in memory. Publish gathers a
// block into a host buffer and writes it with one pwrite; restore reads it with
// one pread into a host buffer and copies it into the page (one memcpy per
// slot). No DRAM tier, no batching, no queue depth beyond one per engine
// thread. A full store drops further publishes (counted); it never overwrites.
// Thread-safe: engines share one store; the index is under a mutex and the
// I/O runs outside it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "orbitkv/cache_api.h"
#include "orbitkv/status.h"

namespace orbitkv::bench {

class NaiveStore {
 public:
  // Creates (truncating) `path` with room for capacity / slot-size blocks.
  static Result<std::unique_ptr<NaiveStore>> Create(const std::string& path, uint64_t capacity,
                                                    uint64_t block_bytes);
  ~NaiveStore();  // closes and deletes the file

  uint64_t slot_bytes() const { return slot_bytes_; }
  // Length of the longest prefix of `keys` that is stored.
  uint32_t Prefix(std::span<const BlockKey> keys) const;
  bool Contains(const BlockKey& key) const;
  // Writes `key`'s block from buf[0, slot_bytes()) (4 KiB aligned). AlreadyExists
  // if stored; ResourceExhausted when the store is full (counted in dropped()).
  Status Write(const BlockKey& key, const uint8_t* buf);
  // Reads `key`'s block into buf[0, slot_bytes()) (4 KiB aligned). NotFound if absent.
  Status Read(const BlockKey& key, uint8_t* buf) const;
  uint64_t dropped() const;

 private:
  NaiveStore(std::string path, int fd, uint64_t slots, uint64_t slot_bytes)
      : path_(std::move(path)), fd_(fd), slots_(slots), slot_bytes_(slot_bytes) {}
  const std::string path_;
  const int fd_;
  const uint64_t slots_;
  const uint64_t slot_bytes_;
  mutable std::mutex mu_;
  std::map<BlockKey, uint64_t> index_;    // guarded by mu_: visible slots
  std::map<BlockKey, uint64_t> writing_;  // guarded by mu_: reserved, being written
  uint64_t next_slot_ = 0;                // guarded by mu_
  uint64_t dropped_ = 0;                  // guarded by mu_
};

}  // namespace orbitkv::bench
