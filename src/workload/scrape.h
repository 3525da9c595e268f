// Scrape: reads the Manager's /metrics (Prometheus text) over plain HTTP on
// 127.0.0.1 and looks series up by name and labels.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "orbitkv/status.h"

namespace orbitkv::demo {

class MetricsSnapshot {
 public:
  // Parses Prometheus text exposition (comments skipped).
  static MetricsSnapshot Parse(const std::string& text);
  // The sample of `name` whose labels include every given pair; 0 if none.
  double Value(const std::string& name,
               const std::map<std::string, std::string>& labels = {}) const;
  // Label values of `label` over the series of `name` (e.g. every route).
  std::vector<std::string> LabelValues(const std::string& name, const std::string& label) const;
  bool empty() const { return series_.empty(); }

 private:
  struct Series {
    std::map<std::string, std::string> labels;
    double value = 0;
  };
  std::multimap<std::string, Series> series_;
};

// GET http://127.0.0.1:port/metrics.
Result<MetricsSnapshot> ScrapeMetrics(uint16_t port);

}  // namespace orbitkv::demo
