// WorkQueue<T>: a bounded multi-producer queue drained by a fixed set of
// worker threads (a "lane"). TryPush never blocks: a full queue is reported so
// the caller can drop or fail the work and count it. Close() stops intake,
// lets workers drain what is queued, and joins them. Thread-safe. Its threads
// are named after the lane (common/thread_name.h), with an index when several.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_name.h"

namespace orbitkv {

template <typename T>
class WorkQueue {
 public:
  // `worker(index, items)` runs on one of `threads` threads with 1..max_batch
  // items taken in queue order (a writer batches them into one submission).
  // `init(index)` runs first on each thread. The threads are named `name`
  // ("okv-<lane>"), followed by their index when there are several.
  WorkQueue(std::string name, size_t capacity, size_t threads,
            std::function<void(size_t, std::vector<T>&)> worker, size_t max_batch = 1,
            std::function<void(size_t)> init = {})
      : capacity_(capacity),
        max_batch_(max_batch == 0 ? 1 : max_batch),
        worker_(std::move(worker)) {
    for (size_t i = 0; i < threads; ++i) {
      threads_.emplace_back([this, i, init, name = threads > 1 ? ThreadName(name, int(i)) : name] {
        SetThreadName(name);
        if (init) init(i);
        Loop(i);
      });
    }
  }
  ~WorkQueue() { Close(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // False if the queue is full or closed; `item` is left untouched then.
  bool TryPush(T& item) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_ || items_.size() >= capacity_) return false;
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
    return true;
  }

  // Removes queued (not yet started) items matching `pred` and returns them.
  std::vector<T> RemoveIf(const std::function<bool(const T&)>& pred) {
    std::vector<T> out;
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = items_.begin(); it != items_.end();) {
      if (pred(*it)) {
        out.push_back(std::move(*it));
        it = items_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  size_t size() const {
    std::lock_guard<std::mutex> l(mu_);
    return items_.size();
  }

  void Close() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_ && threads_.empty()) return;
      closed_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Loop(size_t index) {
    while (true) {
      std::vector<T> batch;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return closed_ || !items_.empty(); });
        if (items_.empty()) return;  // closed and drained
        while (!items_.empty() && batch.size() < max_batch_) {
          batch.push_back(std::move(items_.front()));
          items_.pop_front();
        }
      }
      worker_(index, batch);
    }
  }

  const size_t capacity_;
  const size_t max_batch_;
  const std::function<void(size_t, std::vector<T>&)> worker_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> items_;  // guarded by mu_
  bool closed_ = false;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace orbitkv
