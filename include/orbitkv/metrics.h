// Metrics: a registry of Prometheus counters, gauges and histograms, rendered as
// Prometheus text (exposition format 0.0.4) for /metrics.
// Each metric family is declared once (name, help, type); a family may carry
// labels, each label set is one series. Get* calls are idempotent and return a
// pointer that stays valid for the registry's lifetime, so hot paths look a
// series up once and then only touch atomics. All methods are thread-safe.
// Collectors are callbacks that add values computed at scrape time (gauges read
// from a store's state); they run under the registry's render lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace orbitkv {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void Add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  void Sub(int64_t d) { v_.fetch_sub(d, std::memory_order_relaxed); }
  int64_t Value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// Cumulative histogram with fixed upper bounds (seconds or bytes). Bounds are
// sorted and de-duplicated; non-finite ones are dropped (+Inf is implicit).
// Observe is lock-free. NaN and +/-Inf are counted but kept out of the sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Snap() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  // A double, not fixed-point micro-units: a uint64 of micro-bytes wraps after
  // 18 TB observed. C++20 atomic<double>::fetch_add is lock-free (a CAS loop).
  // The count is the sum of the buckets, so _count always equals the +Inf bucket.
  std::atomic<double> sum_{0};
};

// Default latency buckets: 10 us .. 10 s.
std::vector<double> LatencyBuckets();

// What a collector writes at scrape time.
class MetricWriter {
 public:
  virtual ~MetricWriter() = default;
  // Declares a family (once per render; repeated declarations are ignored).
  virtual void Family(std::string_view name, std::string_view help, std::string_view type) = 0;
  virtual void Sample(std::string_view name, const Labels& labels, double value) = 0;
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter* GetCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge* GetGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram* GetHistogram(std::string_view name, std::string_view help,
                          std::vector<double> bounds = LatencyBuckets(), const Labels& labels = {});
  // Returns an id for RemoveCollector. Collectors run in the order added.
  uint64_t AddCollector(std::function<void(MetricWriter&)> fn);
  // Waits for a render in progress; once it returns, fn is never called again.
  void RemoveCollector(uint64_t id);

  std::string RenderPrometheus() const;
  // Value of one counter or gauge series, the count of a histogram series, or
  // a collector sample; -1 if absent. For tests and the demo's summary.
  // Collectors must not call RenderPrometheus, Read, AddCollector or
  // RemoveCollector (they run under the render lock); Get* is fine.
  double Read(std::string_view name, const Labels& labels = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace orbitkv
