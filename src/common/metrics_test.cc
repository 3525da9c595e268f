#include "orbitkv/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

namespace orbitkv {
namespace {

size_t CountOf(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(MetricsTest, GoldenRender) {
  MetricsRegistry reg;
  reg.GetCounter("okv_requests_total", "Requests served.", {{"op", "get"}})->Inc(3);
  reg.GetCounter("okv_requests_total", "Requests served.", {{"op", "put"}})->Inc();
  reg.GetGauge("okv_bytes_used", "Bytes in use.")->Set(4096);
  Histogram* h = reg.GetHistogram("okv_latency_seconds", "Latency.", {0.25, 1});
  h->Observe(0.25);  // "le" is inclusive
  h->Observe(0.5);
  h->Observe(2);
  EXPECT_EQ(reg.RenderPrometheus(),
            "# HELP okv_bytes_used Bytes in use.\n"
            "# TYPE okv_bytes_used gauge\n"
            "okv_bytes_used 4096\n"
            "# HELP okv_latency_seconds Latency.\n"
            "# TYPE okv_latency_seconds histogram\n"
            "okv_latency_seconds_bucket{le=\"0.25\"} 1\n"
            "okv_latency_seconds_bucket{le=\"1\"} 2\n"
            "okv_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "okv_latency_seconds_sum 2.75\n"
            "okv_latency_seconds_count 3\n"
            "# HELP okv_requests_total Requests served.\n"
            "# TYPE okv_requests_total counter\n"
            "okv_requests_total{op=\"get\"} 3\n"
            "okv_requests_total{op=\"put\"} 1\n");
}

TEST(MetricsTest, EmptyRegistryRendersNothing) {
  MetricsRegistry reg;
  EXPECT_EQ(reg.RenderPrometheus(), "");
}

TEST(MetricsTest, RenderIsDeterministic) {
  MetricsRegistry reg;
  for (const char* tier : {"ssd", "dram", "gpu", "nvme"}) {
    reg.GetGauge("okv_pages", "Pages.", {{"tier", tier}, {"pool", "a"}})->Set(1);
  }
  reg.AddCollector([](MetricWriter& w) {
    w.Sample("okv_extra", {{"z", "1"}}, 1);
    w.Sample("okv_extra", {{"a", "1"}}, 2);
  });
  std::string first = reg.RenderPrometheus();
  EXPECT_EQ(first, reg.RenderPrometheus());
  EXPECT_LT(first.find("okv_extra{a=\"1\"}"), first.find("okv_extra{z=\"1\"}"));
  EXPECT_LT(first.find("tier=\"dram\""), first.find("tier=\"gpu\""));
}

TEST(MetricsTest, EscapesHelpAndLabelValues) {
  MetricsRegistry reg;
  reg.GetCounter("okv_escape_total", "back\\slash \"quoted\"\nnext line",
                 {{"path", "C:\\dir\n\"x\""}})
      ->Inc();
  std::string text = reg.RenderPrometheus();
  // HELP escapes only backslash and newline.
  EXPECT_NE(text.find("# HELP okv_escape_total back\\\\slash \"quoted\"\\nnext line\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("okv_escape_total{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n"), std::string::npos)
      << text;
}

TEST(MetricsTest, LabelsAreSortedAndKeySeries) {
  MetricsRegistry reg;
  Counter* a = reg.GetCounter("okv_ops_total", "Ops.", {{"b", "1"}, {"a", "2"}});
  Counter* b = reg.GetCounter("okv_ops_total", "Ops.", {{"a", "2"}, {"b", "1"}});
  EXPECT_EQ(a, b);
  a->Inc(5);
  EXPECT_NE(reg.RenderPrometheus().find("okv_ops_total{a=\"2\",b=\"1\"} 5\n"), std::string::npos);
  EXPECT_EQ(reg.Read("okv_ops_total", {{"b", "1"}, {"a", "2"}}), 5);
}

TEST(MetricsTest, GetIsIdempotent) {
  MetricsRegistry reg;
  Counter* c = reg.GetCounter("okv_c", "C.");
  EXPECT_EQ(c, reg.GetCounter("okv_c", "other help is ignored"));
  EXPECT_NE(reg.GetCounter("okv_c", "C."), reg.GetCounter("okv_c", "C.", {{"k", "v"}}));
  EXPECT_EQ(reg.GetGauge("okv_g", "G.", {{"k", "v"}}), reg.GetGauge("okv_g", "G.", {{"k", "v"}}));
  Histogram* h = reg.GetHistogram("okv_h", "H.", {1, 2});
  // An existing series keeps its bounds.
  EXPECT_EQ(h, reg.GetHistogram("okv_h", "H.", {5, 6, 7}));
  EXPECT_EQ(h->Snap().bounds, (std::vector<double>{1, 2}));
  std::string text = reg.RenderPrometheus();
  EXPECT_EQ(CountOf(text, "# HELP okv_c C.\n"), 1u);
  EXPECT_EQ(CountOf(text, "# TYPE okv_c counter\n"), 1u);
}

TEST(MetricsTest, TypeConflictReturnsUnexportedSeries) {
  MetricsRegistry reg;
  reg.GetCounter("okv_x", "X.")->Inc(2);
  Gauge* g = reg.GetGauge("okv_x", "X as a gauge.");
  ASSERT_NE(g, nullptr);
  g->Set(-7);  // must be usable
  EXPECT_EQ(g, reg.GetGauge("okv_x", "X as a gauge."));
  Histogram* h = reg.GetHistogram("okv_x", "X as a histogram.");
  ASSERT_NE(h, nullptr);
  h->Observe(1);
  std::string text = reg.RenderPrometheus();
  EXPECT_EQ(text, "# HELP okv_x X.\n# TYPE okv_x counter\nokv_x 2\n");
  EXPECT_EQ(reg.Read("okv_x"), 2);
}

TEST(MetricsTest, InvalidNamesAreNotExported) {
  MetricsRegistry reg;
  Counter* bad_name = reg.GetCounter("okv bad", "Spaces.");
  ASSERT_NE(bad_name, nullptr);
  bad_name->Inc();
  ASSERT_NE(reg.GetCounter("9okv", "Leading digit."), nullptr);
  ASSERT_NE(reg.GetCounter("okv_l", "Bad label.", {{"bad-label", "v"}}), nullptr);
  ASSERT_NE(reg.GetCounter("okv_l", "Reserved label.", {{"__name__", "v"}}), nullptr);
  ASSERT_NE(reg.GetCounter("okv_l", "Twice.", {{"k", "1"}, {"k", "2"}}), nullptr);
  ASSERT_NE(reg.GetHistogram("okv_hl", "le is reserved.", {1}, {{"le", "1"}}), nullptr);
  EXPECT_EQ(reg.RenderPrometheus(), "");
  // "le" is an ordinary label outside histograms, and ':' is legal in names.
  reg.GetGauge("okv:ratio", "R.", {{"le", "x"}})->Set(1);
  EXPECT_EQ(reg.RenderPrometheus(),
            "# HELP okv:ratio R.\n# TYPE okv:ratio gauge\nokv:ratio{le=\"x\"} 1\n");
}

TEST(MetricsTest, CountersAndGaugesRenderAsIntegers) {
  MetricsRegistry reg;
  reg.GetCounter("okv_big_total", "Big.")->Inc((1ULL << 53) + 1);  // not representable as a double
  reg.GetGauge("okv_neg", "Negative.")->Set(-3);
  std::string text = reg.RenderPrometheus();
  EXPECT_NE(text.find("okv_big_total 9007199254740993\n"), std::string::npos) << text;
  EXPECT_NE(text.find("okv_neg -3\n"), std::string::npos) << text;
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  MetricsRegistry reg;
  // Unsorted, duplicated and infinite bounds are cleaned up.
  Histogram* h =
      reg.GetHistogram("okv_size_bytes", "Sizes.", {5, 1, 2, 2, INFINITY}, {{"tier", "ssd"}});
  for (double v : {0.5, 1.0, 1.5, 3.0, 10.0}) h->Observe(v);
  h->Observe(NAN);  // counted in +Inf, kept out of the sum
  Histogram::Snapshot s = h->Snap();
  EXPECT_EQ(s.bounds, (std::vector<double>{1, 2, 5}));
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 6}));
  EXPECT_EQ(s.count, 6u);
  EXPECT_DOUBLE_EQ(s.sum, 16);
  EXPECT_EQ(reg.Read("okv_size_bytes", {{"tier", "ssd"}}), 6);
  std::string text = reg.RenderPrometheus();
  EXPECT_NE(text.find("okv_size_bytes_bucket{tier=\"ssd\",le=\"1\"} 2\n"
                      "okv_size_bytes_bucket{tier=\"ssd\",le=\"2\"} 3\n"
                      "okv_size_bytes_bucket{tier=\"ssd\",le=\"5\"} 4\n"
                      "okv_size_bytes_bucket{tier=\"ssd\",le=\"+Inf\"} 6\n"
                      "okv_size_bytes_sum{tier=\"ssd\"} 16\n"
                      "okv_size_bytes_count{tier=\"ssd\"} 6\n"),
            std::string::npos)
      << text;
}

TEST(MetricsTest, HistogramSeriesAreGroupedAndBucketsOrderedNumerically) {
  MetricsRegistry reg;
  std::vector<double> bounds = {0.5, 2, 10};  // "10" < "2" as text
  reg.GetHistogram("okv_h", "H.", bounds, {{"op", "b"}})->Observe(3);
  reg.GetHistogram("okv_h", "H.", bounds, {{"op", "a"}})->Observe(1);
  std::string text = reg.RenderPrometheus();
  EXPECT_NE(text.find("okv_h_bucket{op=\"a\",le=\"0.5\"} 0\n"
                      "okv_h_bucket{op=\"a\",le=\"2\"} 1\n"
                      "okv_h_bucket{op=\"a\",le=\"10\"} 1\n"
                      "okv_h_bucket{op=\"a\",le=\"+Inf\"} 1\n"
                      "okv_h_sum{op=\"a\"} 1\n"
                      "okv_h_count{op=\"a\"} 1\n"
                      "okv_h_bucket{op=\"b\",le=\"0.5\"} 0\n"),
            std::string::npos)
      << text;
}

TEST(MetricsTest, LatencyBucketsSpan10usTo10s) {
  std::vector<double> b = LatencyBuckets();
  ASSERT_GE(b.size(), 10u);
  EXPECT_DOUBLE_EQ(b.front(), 1e-5);
  EXPECT_DOUBLE_EQ(b.back(), 10);
  for (size_t i = 1; i < b.size(); ++i) {
    double ratio = b[i] / b[i - 1];
    EXPECT_GE(ratio, 2 - 1e-9) << i;
    EXPECT_LE(ratio, 2.5 + 1e-9) << i;
  }
  MetricsRegistry reg;
  reg.GetHistogram("okv_lat_seconds", "L.")->Observe(3e-5);
  std::string text = reg.RenderPrometheus();
  EXPECT_NE(text.find("okv_lat_seconds_bucket{le=\"2e-05\"} 0\n"
                      "okv_lat_seconds_bucket{le=\"5e-05\"} 1\n"),
            std::string::npos)
      << text;
}

TEST(MetricsTest, CollectorAddsFamiliesAtRenderTime) {
  MetricsRegistry reg;
  int64_t pages = 10;
  uint64_t id = reg.AddCollector([&pages](MetricWriter& w) {
    w.Family("okv_store_pages", "Pages by tier.", "gauge");
    w.Family("okv_store_pages", "Repeated declarations are ignored.", "gauge");
    w.Sample("okv_store_pages", {{"tier", "ssd"}}, static_cast<double>(pages));
    w.Sample("okv_store_pages", {{"tier", "dram"}}, 0.5);
  });
  EXPECT_EQ(reg.RenderPrometheus(),
            "# HELP okv_store_pages Pages by tier.\n"
            "# TYPE okv_store_pages gauge\n"
            "okv_store_pages{tier=\"dram\"} 0.5\n"
            "okv_store_pages{tier=\"ssd\"} 10\n");
  pages = 11;  // read at scrape time
  EXPECT_EQ(reg.Read("okv_store_pages", {{"tier", "ssd"}}), 11);
  EXPECT_EQ(reg.Read("okv_store_pages", {{"tier", "gpu"}}), -1);
  reg.RemoveCollector(id);
  reg.RemoveCollector(id);  // unknown ids are ignored
  EXPECT_EQ(reg.RenderPrometheus(), "");
  EXPECT_EQ(reg.Read("okv_store_pages", {{"tier", "ssd"}}), -1);
}

TEST(MetricsTest, CollectorMergesIntoRegisteredFamily) {
  MetricsRegistry reg;
  reg.GetGauge("okv_bytes", "Bytes by tier.", {{"tier", "dram"}})->Set(100);
  reg.AddCollector([](MetricWriter& w) {
    w.Family("okv_bytes", "Different help.", "gauge");
    w.Sample("okv_bytes", {{"tier", "ssd"}}, 200);
    w.Sample("okv_bytes", {{"tier", "dram"}}, 999);  // the registered series wins
  });
  EXPECT_EQ(reg.RenderPrometheus(),
            "# HELP okv_bytes Bytes by tier.\n"
            "# TYPE okv_bytes gauge\n"
            "okv_bytes{tier=\"dram\"} 100\n"
            "okv_bytes{tier=\"ssd\"} 200\n");
  EXPECT_EQ(reg.Read("okv_bytes", {{"tier", "ssd"}}), 200);
  EXPECT_EQ(reg.Read("okv_bytes", {{"tier", "dram"}}), 100);
}

TEST(MetricsTest, CollectorTypeConflictKeepsRegisteredType) {
  MetricsRegistry reg;
  reg.GetCounter("okv_evictions_total", "Evictions.")->Inc(4);
  reg.AddCollector([](MetricWriter& w) {
    w.Family("okv_evictions_total", "As a gauge.", "gauge");
    w.Family("okv_weird", "Bad type.", "summary-ish");
    w.Sample("okv_evictions_total", {{"tier", "ssd"}}, 1);
  });
  EXPECT_EQ(reg.RenderPrometheus(),
            "# HELP okv_evictions_total Evictions.\n"
            "# TYPE okv_evictions_total counter\n"
            "okv_evictions_total 4\n"
            "okv_evictions_total{tier=\"ssd\"} 1\n");
}

TEST(MetricsTest, CollectorHistogramAndUntypedSamples) {
  MetricsRegistry reg;
  reg.AddCollector([](MetricWriter& w) {
    w.Family("okv_io_seconds", "IO time.", "histogram");
    // Written out of order; rendered buckets by bound, then _sum, _count.
    w.Sample("okv_io_seconds_count", {}, 3);
    w.Sample("okv_io_seconds_bucket", {{"le", "+Inf"}}, 3);
    w.Sample("okv_io_seconds_sum", {}, 4.5);
    w.Sample("okv_io_seconds_bucket", {{"le", "10"}}, 3);
    w.Sample("okv_io_seconds_bucket", {{"le", "2"}}, 2);
    w.Sample("okv_io_seconds_bucket", {}, 1);        // no le: dropped
    w.Sample("okv_io_seconds", {}, 1);               // bare histogram name: dropped
    w.Sample("okv_undeclared", {{"k", "v"}}, 1e-5);  // becomes untyped
    w.Sample("bad name", {}, 1);                     // dropped
  });
  EXPECT_EQ(reg.RenderPrometheus(),
            "# HELP okv_io_seconds IO time.\n"
            "# TYPE okv_io_seconds histogram\n"
            "okv_io_seconds_bucket{le=\"2\"} 2\n"
            "okv_io_seconds_bucket{le=\"10\"} 3\n"
            "okv_io_seconds_bucket{le=\"+Inf\"} 3\n"
            "okv_io_seconds_sum 4.5\n"
            "okv_io_seconds_count 3\n"
            "# TYPE okv_undeclared untyped\n"
            "okv_undeclared{k=\"v\"} 1e-05\n");
}

TEST(MetricsTest, CollectorSpecialValues) {
  MetricsRegistry reg;
  reg.AddCollector([](MetricWriter& w) {
    w.Family("okv_v", "V.", "gauge");
    w.Sample("okv_v", {{"k", "inf"}}, INFINITY);
    w.Sample("okv_v", {{"k", "nan"}}, NAN);
    w.Sample("okv_v", {{"k", "ninf"}}, -INFINITY);
  });
  std::string text = reg.RenderPrometheus();
  EXPECT_NE(text.find("okv_v{k=\"inf\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("okv_v{k=\"nan\"} NaN\n"), std::string::npos) << text;
  EXPECT_NE(text.find("okv_v{k=\"ninf\"} -Inf\n"), std::string::npos) << text;
}

TEST(MetricsTest, CollectorMayRegisterSeries) {
  MetricsRegistry reg;
  reg.AddCollector([&reg](MetricWriter& w) {
    reg.GetCounter("okv_scrapes_total", "Scrapes.")
        ->Inc();  // Get* inside a collector must not deadlock
  });
  reg.RenderPrometheus();
  EXPECT_NE(reg.RenderPrometheus().find("okv_scrapes_total 2\n"), std::string::npos);
}

TEST(MetricsTest, ReadAbsentIsMinusOne) {
  MetricsRegistry reg;
  EXPECT_EQ(reg.Read("okv_nothing"), -1);
  reg.GetCounter("okv_c_total", "C.", {{"k", "v"}});
  EXPECT_EQ(reg.Read("okv_c_total"), -1);
  EXPECT_EQ(reg.Read("okv_c_total", {{"k", "v"}}), 0);
}

TEST(MetricsTest, ConcurrentIncrementsAreExact) {
  MetricsRegistry reg;
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::atomic<bool> stop{false};
  std::thread scraper([&] {
    double last = -1;
    while (!stop.load()) {
      EXPECT_FALSE(reg.RenderPrometheus().empty() && last >= 0);
      double v = reg.Read("okv_hits_total");  // -1 until a thread declares it
      EXPECT_GE(v, last);
      last = v;
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&reg, t] {
      Counter* c = reg.GetCounter("okv_hits_total", "Hits.");
      Histogram* h = reg.GetHistogram("okv_op_seconds", "Op time.", {0.5, 1});
      Gauge* g = reg.GetGauge("okv_inflight", "In flight.");
      for (int i = 0; i < kIters; ++i) {
        c->Inc();
        h->Observe(i % 2 == 0 ? 0.25 : 1.0);
        g->Add(1);
        g->Sub(1);
        if (i % 1000 == 0) {
          // Lookups race with other threads' lookups and with renders.
          EXPECT_EQ(c, reg.GetCounter("okv_hits_total", "Hits."));
          reg.GetCounter("okv_per_thread_total", "Per thread.", {{"t", std::to_string(t)}})->Inc();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  scraper.join();
  constexpr uint64_t kTotal = uint64_t{kThreads} * kIters;
  EXPECT_EQ(reg.Read("okv_hits_total"), kTotal);
  EXPECT_EQ(reg.Read("okv_op_seconds"), kTotal);
  Histogram::Snapshot s = reg.GetHistogram("okv_op_seconds", "Op time.")->Snap();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{kTotal / 2, kTotal, kTotal}));
  EXPECT_DOUBLE_EQ(s.sum, kTotal / 2 * 0.25 + kTotal / 2 * 1.0);  // exact in binary
  EXPECT_EQ(reg.Read("okv_inflight"), 0);
  EXPECT_NE(reg.RenderPrometheus().find("okv_hits_total " + std::to_string(kTotal) + "\n"),
            std::string::npos);
}

}  // namespace
}  // namespace orbitkv
