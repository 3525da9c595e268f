#include "orbitkv/clock.h"

namespace orbitkv {
namespace {
class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override {
    return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
  }
};
}  // namespace

Clock* Clock::Real() {
  static SteadyClock clock;
  return &clock;
}

}  // namespace orbitkv
