#include "orbitkv/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <type_traits>

#include "orbitkv/logging.h"

namespace orbitkv {

// ---- Histogram --------------------------------------------------------------

namespace {

std::vector<double> CleanBounds(std::vector<double> b) {
  b.erase(std::remove_if(b.begin(), b.end(), [](double x) { return !std::isfinite(x); }), b.end());
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

}  // namespace

static_assert(std::atomic<double>::is_always_lock_free, "Histogram::Observe must not take a lock");

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(CleanBounds(std::move(bounds))),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double v) {
  // "le" is inclusive: v goes to the first bound >= v. NaN compares false with
  // everything, so it is sent to +Inf explicitly.
  size_t i = std::isnan(v)
                 ? bounds_.size()
                 : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                       bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  // One NaN or Inf would poison the sum for the life of the process.
  if (std::isfinite(v)) sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LatencyBuckets() {
  return {1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2,
          2e-2, 5e-2, 0.1,  0.2,  0.5,  1,    2,    5,    10};
}

// ---- Registry ---------------------------------------------------------------

namespace {

enum class MetricType { kCounter, kGauge, kHistogram, kUntyped };

std::string_view TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
    case MetricType::kUntyped:
      return "untyped";
  }
  return "untyped";
}

std::optional<MetricType> ParseType(std::string_view s) {
  for (MetricType t :
       {MetricType::kCounter, MetricType::kGauge, MetricType::kHistogram, MetricType::kUntyped}) {
    if (s == TypeName(t)) return t;
  }
  return std::nullopt;
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    if (!(IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c)))) return false;
  }
  return true;
}

// [a-zA-Z_][a-zA-Z0-9_]*, and "__" prefixes are reserved for Prometheus itself.
bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.starts_with("__")) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    if (!(IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c)))) return false;
  }
  return true;
}

Labels Sorted(Labels labels) {
  std::sort(labels.begin(), labels.end());
  return labels;
}

// Empty when `sorted` is a usable label set; else what is wrong with it.
std::string LabelProblem(const Labels& sorted, bool allow_le) {
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& k = sorted[i].first;
    if (!ValidLabelName(k)) return fmt::format("invalid label name '{}'", k);
    if (i > 0 && sorted[i - 1].first == k) return fmt::format("label '{}' given twice", k);
    if (!allow_le && k == "le") return "label 'le' is reserved for histogram buckets";
  }
  return {};
}

void AppendEscaped(std::string* out, std::string_view s, bool quotes) {
  for (char c : s) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '"' && quotes) {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest round-trip form; integral values print without ".0"
}

struct Family {
  std::string help;
  MetricType type = MetricType::kUntyped;
  // Keyed by sorted labels. Only the map matching `type` is used.
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

template <typename T>
std::map<Labels, std::unique_ptr<T>>& SeriesOf(Family& f) {
  if constexpr (std::is_same_v<T, Counter>) {
    return f.counters;
  } else if constexpr (std::is_same_v<T, Gauge>) {
    return f.gauges;
  } else {
    return f.histograms;
  }
}

// What the collectors wrote during one render, in call order.
class CollectingWriter final : public MetricWriter {
 public:
  struct Decl {
    std::string name, help, type;
  };
  struct Value {
    std::string name;
    Labels labels;
    double value;
  };
  void Family(std::string_view name, std::string_view help, std::string_view type) override {
    decls.push_back({std::string(name), std::string(help), std::string(type)});
  }
  void Sample(std::string_view name, const Labels& labels, double value) override {
    samples.push_back({std::string(name), labels, value});
  }
  std::vector<Decl> decls;
  std::vector<Value> samples;
};

// Orders a family's samples the way Prometheus clients print them: series by
// labels; within a histogram series the buckets by bound, then _sum, _count.
struct SampleKey {
  Labels labels;  // sorted; "le" taken out for buckets
  int part = 0;   // 0 plain value, 1 _bucket, 2 _sum, 3 _count
  double le = 0;  // bucket bound, +inf for the +Inf bucket
  std::string name;
  friend bool operator<(const SampleKey& a, const SampleKey& b) {
    return std::tie(a.labels, a.part, a.le, a.name) < std::tie(b.labels, b.part, b.le, b.name);
  }
};
struct SampleText {
  std::string le;  // bucket bound as printed; empty unless part == 1
  std::string value;
};
struct RenderFamily {
  std::string help;
  MetricType type = MetricType::kUntyped;
  std::map<SampleKey, SampleText> samples;
};
using RenderMap = std::map<std::string, RenderFamily>;

constexpr struct {
  std::string_view suffix;
  int part;
} kHistogramParts[] = {{"_bucket", 1}, {"_sum", 2}, {"_count", 3}};

std::string Format(const RenderMap& families) {
  std::string out;
  for (const auto& [name, fam] : families) {
    if (!fam.help.empty()) {
      out += "# HELP " + name + " ";
      AppendEscaped(&out, fam.help, /*quotes=*/false);
      out += '\n';
    }
    out += fmt::format("# TYPE {} {}\n", name, TypeName(fam.type));
    for (const auto& [key, text] : fam.samples) {
      out += key.name;
      if (!key.labels.empty() || key.part == 1) {
        out += '{';
        bool first = true;
        for (const auto& [k, v] : key.labels) {
          if (!first) out += ',';
          first = false;
          out += k + "=\"";
          AppendEscaped(&out, v, /*quotes=*/true);
          out += '"';
        }
        if (key.part == 1) out += std::string(first ? "" : ",") + "le=\"" + text.le + "\"";
        out += '}';
      }
      out += ' ';
      out += text.value;
      out += '\n';
    }
  }
  return out;
}

}  // namespace

struct MetricsRegistry::Impl {
  // Lock order: render_mu before mu. Collectors run under render_mu only, so
  // they may call Get*.
  mutable std::mutex render_mu;
  // Guarded by render_mu.
  std::map<uint64_t, std::function<void(MetricWriter&)>> collectors;
  uint64_t next_collector_id = 1;
  mutable std::set<std::string> warned;  // collector problems already logged

  mutable std::mutex mu;
  // Guarded by mu.
  std::map<std::string, Family, std::less<>> families;
  // Series handed out for bad declarations; never rendered or read.
  std::map<std::pair<std::string, MetricType>, Family> dummies;

  template <typename T, typename Make>
  T* GetSeries(std::string_view name, std::string_view help, MetricType type, const Labels& labels,
               Make make);

  // REQUIRES: render_mu held.
  CollectingWriter RunCollectors() const;
  void WarnOnce(const std::string& key, const std::string& msg) const;
  void MergeCollected(const CollectingWriter& c, RenderMap* out) const;
  void AddRegistered(RenderMap* out) const;
};

template <typename T, typename Make>
T* MetricsRegistry::Impl::GetSeries(std::string_view name, std::string_view help, MetricType type,
                                    const Labels& labels, Make make) {
  Labels sorted = Sorted(labels);
  std::string problem = ValidMetricName(name)
                            ? LabelProblem(sorted, /*allow_le=*/type != MetricType::kHistogram)
                            : "invalid metric name";
  std::lock_guard lock(mu);
  Family* fam = nullptr;
  if (problem.empty()) {
    auto it = families.find(name);
    if (it == families.end()) {
      Family f;
      f.help = std::string(help);
      f.type = type;
      it = families.emplace(std::string(name), std::move(f)).first;
    }
    if (it->second.type == type) {
      fam = &it->second;
    } else {
      problem = fmt::format("already declared as a {}", TypeName(it->second.type));
    }
  }
  if (fam == nullptr) {
    // A programming error, but metrics must never take the server down: log it
    // and hand out a working series that nobody scrapes.
    OKV_LOG_ERROR("metrics: cannot declare {} '{}': {}; it will not be exported", TypeName(type),
                  name, problem);
    fam = &dummies[{std::string(name), type}];
    fam->type = type;
  }
  std::unique_ptr<T>& slot = SeriesOf<T>(*fam)[std::move(sorted)];
  if (!slot) slot = make();
  return slot.get();
}

CollectingWriter MetricsRegistry::Impl::RunCollectors() const {
  CollectingWriter w;
  for (const auto& [id, fn] : collectors) fn(w);
  return w;
}

void MetricsRegistry::Impl::WarnOnce(const std::string& key, const std::string& msg) const {
  if (warned.insert(key).second) OKV_LOG_WARN("metrics: {}", msg);
}

void MetricsRegistry::Impl::AddRegistered(RenderMap* out) const {
  std::lock_guard lock(mu);
  for (const auto& [name, fam] : families) {
    RenderFamily& rf = (*out)[name];
    rf.help = fam.help;
    rf.type = fam.type;
    for (const auto& [labels, c] : fam.counters) {
      rf.samples.emplace(SampleKey{labels, 0, 0, name}, SampleText{{}, std::to_string(c->Value())});
    }
    for (const auto& [labels, g] : fam.gauges) {
      rf.samples.emplace(SampleKey{labels, 0, 0, name}, SampleText{{}, std::to_string(g->Value())});
    }
    for (const auto& [labels, h] : fam.histograms) {
      Histogram::Snapshot s = h->Snap();
      const std::string bucket = name + "_bucket";
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        rf.samples.emplace(SampleKey{labels, 1, s.bounds[i], bucket},
                           SampleText{FormatDouble(s.bounds[i]), std::to_string(s.cumulative[i])});
      }
      rf.samples.emplace(SampleKey{labels, 1, std::numeric_limits<double>::infinity(), bucket},
                         SampleText{"+Inf", std::to_string(s.count)});
      rf.samples.emplace(SampleKey{labels, 2, 0, name + "_sum"},
                         SampleText{{}, FormatDouble(s.sum)});
      rf.samples.emplace(SampleKey{labels, 3, 0, name + "_count"},
                         SampleText{{}, std::to_string(s.count)});
    }
  }
}

void MetricsRegistry::Impl::MergeCollected(const CollectingWriter& c, RenderMap* out) const {
  for (const auto& d : c.decls) {
    std::optional<MetricType> type = ParseType(d.type);
    if (!ValidMetricName(d.name) || !type) {
      WarnOnce(
          "decl:" + d.name,
          fmt::format("collector family '{}' of type '{}' is invalid; ignored", d.name, d.type));
      continue;
    }
    auto [it, inserted] = out->try_emplace(d.name);
    if (inserted) {
      it->second.help = d.help;
      it->second.type = *type;
    } else if (it->second.type != *type) {
      WarnOnce("type:" + d.name,
               fmt::format("collector declares '{}' as a {} but it is a {}; keeping {}", d.name,
                           d.type, TypeName(it->second.type), TypeName(it->second.type)));
    }
  }
  for (const auto& s : c.samples) {
    // A sample belongs to the family of its name, or to histogram family F
    // when it is F_bucket, F_sum or F_count. Undeclared names become untyped.
    RenderFamily* fam = nullptr;
    int part = 0;
    auto it = out->find(s.name);
    if (it != out->end() && it->second.type != MetricType::kHistogram) {
      fam = &it->second;
    } else if (it == out->end()) {
      std::string_view name = s.name;
      for (const auto& p : kHistogramParts) {
        if (!name.ends_with(p.suffix)) continue;
        auto h = out->find(std::string(name.substr(0, name.size() - p.suffix.size())));
        if (h != out->end() && h->second.type == MetricType::kHistogram) {
          fam = &h->second;
          part = p.part;
        }
        break;
      }
    }
    if (fam == nullptr) {
      if (it != out->end()) {
        WarnOnce("sample:" + s.name,
                 fmt::format("collector sample '{}' names a histogram; write {}_bucket, _sum or "
                             "_count instead; ignored",
                             s.name, s.name));
        continue;
      }
      if (!ValidMetricName(s.name)) {
        WarnOnce("sample:" + s.name,
                 fmt::format("collector sample '{}' has an invalid name; ignored", s.name));
        continue;
      }
      fam = &(*out)[s.name];  // untyped, no HELP
    }
    SampleKey key{Sorted(s.labels), part, 0, s.name};
    // "le" is an ordinary label outside histograms, required on buckets and
    // reserved on _sum and _count.
    std::string problem = LabelProblem(key.labels, /*allow_le=*/part <= 1);
    SampleText text{{}, FormatDouble(s.value)};
    if (problem.empty() && part == 1) {
      auto le = std::find_if(key.labels.begin(), key.labels.end(),
                             [](const auto& kv) { return kv.first == "le"; });
      char* end = nullptr;
      double bound = le == key.labels.end() ? NAN : std::strtod(le->second.c_str(), &end);
      if (std::isnan(bound) || *end != '\0') {
        problem = "bucket without a numeric 'le' label";
      } else {
        key.le = bound;
        text.le = FormatDouble(bound);
        key.labels.erase(le);
      }
    }
    if (!problem.empty()) {
      WarnOnce("labels:" + s.name,
               fmt::format("collector sample '{}': {}; ignored", s.name, problem));
      continue;
    }
    // A series the registry already has wins over a collector's duplicate.
    fam->samples.emplace(std::move(key), std::move(text));
  }
}

MetricsRegistry::MetricsRegistry() : impl_(std::make_unique<Impl>()) {}
MetricsRegistry::~MetricsRegistry() = default;

Counter* MetricsRegistry::GetCounter(std::string_view name, std::string_view help,
                                     const Labels& labels) {
  return impl_->GetSeries<Counter>(name, help, MetricType::kCounter, labels,
                                   [] { return std::make_unique<Counter>(); });
}

Gauge* MetricsRegistry::GetGauge(std::string_view name, std::string_view help,
                                 const Labels& labels) {
  return impl_->GetSeries<Gauge>(name, help, MetricType::kGauge, labels,
                                 [] { return std::make_unique<Gauge>(); });
}

Histogram* MetricsRegistry::GetHistogram(std::string_view name, std::string_view help,
                                         std::vector<double> bounds, const Labels& labels) {
  // Bounds only matter for a new series; an existing one keeps its own.
  return impl_->GetSeries<Histogram>(name, help, MetricType::kHistogram, labels, [&bounds] {
    return std::make_unique<Histogram>(std::move(bounds));
  });
}

uint64_t MetricsRegistry::AddCollector(std::function<void(MetricWriter&)> fn) {
  std::lock_guard lock(impl_->render_mu);
  uint64_t id = impl_->next_collector_id++;
  impl_->collectors.emplace(id, std::move(fn));
  return id;
}

void MetricsRegistry::RemoveCollector(uint64_t id) {
  std::lock_guard lock(impl_->render_mu);
  impl_->collectors.erase(id);
}

std::string MetricsRegistry::RenderPrometheus() const {
  std::lock_guard render_lock(impl_->render_mu);
  CollectingWriter collected = impl_->RunCollectors();
  RenderMap families;
  impl_->AddRegistered(&families);  // first, so Get* families keep their HELP and TYPE
  impl_->MergeCollected(collected, &families);
  return Format(families);
}

double MetricsRegistry::Read(std::string_view name, const Labels& labels) const {
  Labels sorted = Sorted(labels);
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->families.find(name);
    if (it != impl_->families.end()) {
      const Family& f = it->second;
      if (auto c = f.counters.find(sorted); c != f.counters.end()) {
        return static_cast<double>(c->second->Value());
      }
      if (auto g = f.gauges.find(sorted); g != f.gauges.end()) {
        return static_cast<double>(g->second->Value());
      }
      if (auto h = f.histograms.find(sorted); h != f.histograms.end()) {
        return static_cast<double>(h->second->Snap().count);
      }
    }
  }
  std::lock_guard render_lock(impl_->render_mu);
  CollectingWriter collected = impl_->RunCollectors();
  for (const auto& s : collected.samples) {
    if (s.name == name && Sorted(s.labels) == sorted) return s.value;
  }
  return -1;
}

}  // namespace orbitkv
