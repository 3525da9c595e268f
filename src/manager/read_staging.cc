#include "manager/read_staging.h"

#include <algorithm>

#include "orbitkv/units.h"

namespace orbitkv {

Status ReadStaging::AllocateAll(const std::vector<uint64_t>& sizes, std::vector<DramView>* out,
                                std::chrono::milliseconds wait) {
  uint64_t total = 0;
  for (uint64_t n : sizes) total += AlignUp(n, 4096);
  const uint64_t capacity = pool_->stats().capacity;
  if (total > capacity) {
    return Status::ResourceExhausted("objects of " + FormatByteSize(total) +
                                     " exceed the SSD read staging of " + FormatByteSize(capacity));
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  MutexLock l(mu_);
  while (true) {
    out->clear();
    for (uint64_t n : sizes) {
      Result<DramView> v = pool_->AllocateScratch(n);
      if (!v.ok()) break;
      out->push_back(*v);
    }
    if (out->size() == sizes.size()) return Status::OK();
    for (const DramView& v : *out) pool_->ReleaseScratch(v);
    out->clear();
    if (!released_.WaitUntil(mu_, deadline)) {
      return Status::ResourceExhausted("SSD read staging stayed full for " +
                                       std::to_string(wait.count() / 1000) + " s");
    }
  }
}

void ReadStaging::Release(const DramView& view) {
  pool_->ReleaseScratch(view);
  MutexLock l(mu_);
  released_.NotifyAll();
}

std::vector<std::pair<size_t, size_t>> ReadStaging::Runs(const std::vector<uint64_t>& sizes) const {
  std::vector<std::pair<size_t, size_t>> runs;
  uint64_t total = 0;
  for (uint64_t n : sizes) total += AlignUp(n, 4096);
  // At most run_bytes_ and half the staging, and at least two runs when there
  // are two objects: the first run's copy then overlaps the second's read.
  const uint64_t cap =
      std::min({run_bytes_, pool_->stats().capacity / 2, std::max<uint64_t>(total / 2, 1)});
  size_t begin = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t n = AlignUp(sizes[i], 4096);
    if (i > begin && bytes + n > cap) {
      runs.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += n;
  }
  if (begin < sizes.size()) runs.emplace_back(begin, sizes.size());
  return runs;
}

}  // namespace orbitkv
