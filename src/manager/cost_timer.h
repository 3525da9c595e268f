// CostTimer: one opt-in cost observation (ORBITKV_COST_OBSERVATIONS,
// orbitkv_cost_seconds{path}). With no histogram (observations off) it reads
// no clock, so it may sit on hot paths. Not thread-safe; one per timed span.
#pragma once

#include <chrono>

#include "orbitkv/metrics.h"

namespace orbitkv {

class CostTimer {
 public:
  explicit CostTimer(Histogram* h) : h_(h) {
    if (h_) start_ = std::chrono::steady_clock::now();
  }
  // Observes the seconds since construction (nothing when off).
  void Observe() const {
    if (h_) {
      h_->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  Histogram* const h_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace orbitkv
