#include "bench/phase_gate.h"

namespace orbitkv::bench {

bool PhaseGate::WaitOpen(size_t k) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return aborted_ || open_ > k; });
  return !aborted_;
}

void PhaseGate::Done(size_t k) {
  std::lock_guard<std::mutex> l(mu_);
  ++done_.at(k);
}

void PhaseGate::Open(size_t k) {
  {
    std::lock_guard<std::mutex> l(mu_);
    open_ = k + 1;
  }
  cv_.notify_all();
}

bool PhaseGate::AllDone(size_t k) const {
  std::lock_guard<std::mutex> l(mu_);
  return done_.at(k) >= engines_;
}

void PhaseGate::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!aborted_) reason_ = reason;
    aborted_ = true;
  }
  cv_.notify_all();
}

bool PhaseGate::aborted() const {
  std::lock_guard<std::mutex> l(mu_);
  return aborted_;
}

std::string PhaseGate::reason() const {
  std::lock_guard<std::mutex> l(mu_);
  return reason_;
}

}  // namespace orbitkv::bench
