#include "store/lock_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_name.h"

namespace orbitkv {

Result<uint32_t> LockMemory(void* base, uint64_t bytes, const LockMemoryOptions& options) {
  if (bytes == 0) return 0u;
  constexpr uint64_t kPage = 4096;
  const uint64_t cpus = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t by_size = std::max<uint64_t>(1, bytes / std::max(options.min_part_bytes, kPage));
  const auto parts = static_cast<uint32_t>(
      std::min<uint64_t>({std::max<uint32_t>(1, options.max_threads), cpus, by_size}));
  const uint64_t part = (bytes / parts + kPage - 1) / kPage * kPage;
  std::vector<int> errors(parts, 0);
  std::vector<std::thread> threads;
  auto* p = static_cast<uint8_t*>(base);
  auto lock = [&](uint32_t i) {
    if (i > 0) SetThreadName(ThreadName("okv-mlock", int(i)));
    const uint64_t begin = uint64_t{i} * part;
    if (begin >= bytes) return;
    const uint64_t len = std::min(part, bytes - begin);
    if (::mlock(p + begin, len) != 0) errors[i] = errno;
  };
  for (uint32_t i = 1; i < parts; ++i) threads.emplace_back(lock, i);
  lock(0);
  for (std::thread& t : threads) t.join();
  for (int err : errors) {
    if (err != 0) {
      (void)::munlock(base, bytes);
      return Status::ResourceExhausted(std::string("mlock: ") + std::strerror(err) + " (errno " +
                                       std::to_string(err) + ")");
    }
  }
  return parts;
}

}  // namespace orbitkv
