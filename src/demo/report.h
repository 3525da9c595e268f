// Report: the parent's view of the run. Tally adds up the engines' request
// records (the dense engines' and the hybrid engines' apart); Progress draws
// the live line (\r updates on a terminal, plain periodic lines otherwise);
// PrintSummary prints the final table from the tallies and the Manager's
// /metrics, with what the hybrid engines' recovery plans did not read.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "demo/record.h"
#include "workload/format.h"
#include "workload/live_line.h"
#include "workload/scrape.h"

namespace orbitkv::demo {

struct Tally {
  uint64_t requests = 0;
  uint64_t queried = 0, hit_dram = 0, hit_ssd = 0, failed = 0, missed = 0, mismatched = 0;
  uint64_t restore_bytes = 0, restore_ns = 0;
  uint64_t published = 0, stored = 0, skipped = 0, computed_tokens = 0;
  // Hybrid engines: the plans' prefix tokens, pieces restored byte-exact,
  // checkpoint bytes restored, bytes of [0, P) not read (RequestRecord's fields).
  uint64_t prefix_tokens = 0, pieces = 0, checkpoint_bytes = 0, not_needed_bytes = 0;
  std::vector<double> restore_ms;  // per request that restored something
  std::string first_error;         // first failed restore block's status

  void Add(const RequestRecord& r);
  uint64_t hits() const { return hit_dram + hit_ssd; }
  double HitRate() const { return queried ? double(hits()) / double(queried) : 0; }
};

class Progress {
 public:
  // `live`: redraw one line with \r (a terminal); else print a line every `period`.
  Progress(uint64_t total_requests, bool live, std::chrono::milliseconds period);
  // Redraws if due; `force` draws now. `h`: the hybrid engines' tally.
  void Update(const Tally& t, const Tally& h, bool force = false);
  // Ends the live line.
  void Finish(const Tally& t, const Tally& h);

 private:
  std::string Line(const Tally& t, const Tally& h) const;
  uint64_t total_;
  LiveLine line_;
};

struct SummaryInput {
  std::string shape;  // the workload line
  uint64_t block_bytes = 0;
  uint32_t block_tokens = 0;
  double compute_tokens_per_s = 0;  // per engine; 0: not paced
  double wall_seconds = 0;
  const Tally* tally = nullptr;
  const Tally* hybrid = nullptr;  // null: no hybrid engines
  std::string hybrid_shape;
  const MetricsSnapshot* metrics = nullptr;  // null: the scrape failed
  std::string metrics_error;
};

void PrintSummary(std::FILE* out, const SummaryInput& in);

}  // namespace orbitkv::demo
