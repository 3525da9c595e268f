// LaneCounter and LaneToken: how a part counts the work it has taken on, so
// Drain() can wait until none is left. A LaneToken is one unit of work: Start()
// hands one out and it is returned when the token dies (or Release() runs), on
// whatever thread finished the work; tokens move with the work (inside a queued
// job, a completion callback), never copied, so each unit ends exactly once.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>

#include "common/mutex.h"

namespace orbitkv {

class LaneCounter;

class [[nodiscard]] LaneToken {
 public:
  LaneToken() = default;
  LaneToken(LaneToken&& o) noexcept : counter_(std::exchange(o.counter_, nullptr)) {}
  LaneToken& operator=(LaneToken&& o) noexcept {
    if (this != &o) {
      Release();
      counter_ = std::exchange(o.counter_, nullptr);
    }
    return *this;
  }
  LaneToken(const LaneToken&) = delete;
  LaneToken& operator=(const LaneToken&) = delete;
  ~LaneToken() { Release(); }
  // The work is finished (idempotent).
  inline void Release();
  bool held() const { return counter_ != nullptr; }

 private:
  friend class LaneCounter;
  explicit LaneToken(LaneCounter* c) : counter_(c) {}
  LaneCounter* counter_ = nullptr;
};

class LaneCounter {
 public:
  LaneToken Start() {
    work_.fetch_add(1);
    return LaneToken(this);
  }
  // Waits until every token handed out so far was released.
  void Drain() EXCLUDES(mu_) {
    MutexLock l(mu_);
    while (work_.load() != 0) cv_.Wait(mu_);
  }
  // Drain, until `deadline` at most: true when none was left.
  bool DrainUntil(std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_) {
    MutexLock l(mu_);
    while (work_.load() != 0) {
      if (!cv_.WaitUntil(mu_, deadline)) return work_.load() == 0;
    }
    return true;
  }
  int64_t outstanding() const { return work_.load(); }

 private:
  friend class LaneToken;
  void Done() EXCLUDES(mu_) {
    if (work_.fetch_sub(1) == 1) {
      MutexLock l(mu_);  // pairs with Drain's check
      cv_.NotifyAll();
    }
  }
  std::atomic<int64_t> work_{0};
  Mutex mu_;
  CondVar cv_;
};

void LaneToken::Release() {
  if (LaneCounter* c = std::exchange(counter_, nullptr)) c->Done();
}

}  // namespace orbitkv
