// Clock: the time seam. Leases, deadlines and latency metrics read time through
// a Clock so tests can drive it with ManualClock. Implementations are thread-safe.
#pragma once

#include <atomic>
#include <chrono>

namespace orbitkv {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // The process-wide steady clock.
  static Clock* Real();
};

// Seconds as a double (for histograms).
inline double ToSeconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

// A clock that moves only when told. Starts at an arbitrary non-zero epoch.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_ns_.load())); }
  void Advance(Duration d) { now_ns_.fetch_add(d.count()); }

 private:
  std::atomic<int64_t> now_ns_{1'000'000'000};
};

}  // namespace orbitkv
