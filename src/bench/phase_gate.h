// PhaseGate: keeps a route run's engine threads in step. The driver opens
// phase k; every engine runs its part of it and reports done; the driver waits
// (polling, so it can draw progress and scrape /metrics) until all are done,
// then may drain the Manager before it opens phase k+1. Abort wakes everyone:
// engines stop at their next request. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace orbitkv::bench {

class PhaseGate {
 public:
  PhaseGate(uint32_t engines, size_t phases) : engines_(engines), done_(phases, 0) {}

  // Engine: waits until phase k is open; false if the run was aborted.
  bool WaitOpen(size_t k);
  // Engine: finished its part of phase k.
  void Done(size_t k);
  // Driver: opens phase k. REQUIRES: k < phases, opened in order.
  void Open(size_t k);
  // Driver: every engine is done with phase k.
  bool AllDone(size_t k) const;
  // Anyone: stops the run; the first reason is kept.
  void Abort(const std::string& reason);
  bool aborted() const;
  std::string reason() const;

 private:
  const uint32_t engines_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> done_;  // guarded by mu_
  size_t open_ = 0;             // guarded by mu_: phases < open_ are open
  bool aborted_ = false;        // guarded by mu_
  std::string reason_;          // guarded by mu_
};

}  // namespace orbitkv::bench
