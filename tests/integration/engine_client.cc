// orbitkv-test-engine: a minimal engine process for the cross-process
// integration test (manager_process_test.cc). It connects to a Manager over
// its Unix socket with the C++ Client, registers host pages (sealed memfds,
// testing::HostPages) and runs one subcommand:
//
//   publish         fill the pages of keys A..B with their pattern and publish
//                   them (optionally as slot fragments, in batches, retrying
//                   keys the pool had no room for; --linger-ms keeps the session,
//                   and with it the unsealed fragments, open that long)
//   restore-verify  query keys A..B (plus one key nobody published), optionally
//                   poll until every source is DRAM or SSD, restore the prefix
//                   into other pages and check every byte
//   query           query keys A..B and print the prefix and sources
//   hold-restore    query A..B and --hold-keys C..D, start restoring the first
//                   query on a thread, print "@ restoring" and wait to be killed
//
// Key ranges are half-open: --keys 3..7 is keys 3, 4, 5, 6 (--stride 2: 3, 5).
// The i-th key uses page --page-base + i (restores: --dst-page + i). Key k's pages hold
// HostPages::Fill(SeedOf(--seed, k)); slot sizes, layout and held slots come
// from --slots, --layout and --hold-slots. Results are printed as lines
// starting with "@ " (the test parses them); errors go to stderr.
// Exit status: 0 success, 1 a check failed, 2 usage, 3 a Manager call failed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine_common.h"
#include "orbitkv/client.h"
#include "testing/host_pages.h"

namespace orbitkv::integration {
namespace {

constexpr int kOk = 0, kCheckFailed = 1, kUsage = 2, kCallFailed = 3;

struct Options {
  std::string command;
  std::string socket;
  std::string ns = "model-a";
  uint32_t rank = 0;
  LayoutSpec layout;
  uint64_t key_begin = 0, key_end = 0;
  uint64_t hold_begin = 0, hold_end = 0;
  uint64_t stride = 1;  // keys A, A+stride, ... below B
  uint64_t seed = 1;
  uint64_t page_base = 0;
  int64_t dst_page = -1;                         // -1: pages / 2
  std::vector<std::vector<uint32_t>> fragments;  // empty: one Publish of every held slot
  uint64_t batch = 0;                            // keys per Publish; 0: all
  int retry_ms = 0;  // publish: retry keys the pool had no room for, this long
  int64_t expect_prefix = -1;
  std::string expect_source = "any";  // dram | ssd | any
  std::string wait_source;            // poll until every source is this
  int wait_ms = 15000;
  uint32_t ttl_ms = 10000;
  int timeout_ms = 20000;
  bool no_miss_key = false;
  int linger_ms = 0;  // publish: keep the session (and its unsealed fragments) this long
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "orbitkv-test-engine: %s\n", why.c_str());
  std::fprintf(stderr,
               "usage: orbitkv-test-engine publish|restore-verify|query|hold-restore --socket S "
               "[--ns N] [--rank R] [--layout split|page-first] [--slots 1000,333]\n"
               "  [--hold-slots 0,1] [--pages P] --keys A..B [--hold-keys C..D] [--seed X]\n"
               "  [--page-base P] [--dst-page P] [--fragments 0,1;2] [--batch N] [--retry-ms T]\n"
               "  [--expect-prefix N] [--expect-source dram|ssd|any] [--wait-source dram|ssd]\n"
               "  [--wait-ms T] [--ttl-ms T] [--timeout-ms T] [--no-miss-key] [--linger-ms T]\n");
  std::exit(kUsage);
}

void ParseRange(const std::string& s, uint64_t* begin, uint64_t* end) {
  const size_t dots = s.find("..");
  if (dots == std::string::npos) Usage("bad key range '" + s + "' (want A..B)");
  *begin = std::stoull(s.substr(0, dots));
  *end = std::stoull(s.substr(dots + 2));
  if (*end < *begin) Usage("empty key range '" + s + "'");
}

Options Parse(int argc, char** argv) {
  if (argc < 2) Usage("missing subcommand");
  Options o;
  o.command = argv[1];
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) Usage(flag + " needs a value");
        return argv[++i];
      };
      if (flag == "--socket") {
        o.socket = value();
      } else if (flag == "--ns") {
        o.ns = value();
      } else if (flag == "--rank") {
        o.rank = static_cast<uint32_t>(std::stoul(value()));
      } else if (flag == "--layout") {
        const std::string v = value();
        if (v != "split" && v != "page-first") Usage("--layout split|page-first");
        o.layout.page_first = v == "page-first";
      } else if (flag == "--slots") {
        o.layout.slot_bytes = ParseU64List(value());
      } else if (flag == "--hold-slots") {
        o.layout.hold.clear();
        for (uint64_t s : ParseU64List(value())) o.layout.hold.push_back(static_cast<uint32_t>(s));
      } else if (flag == "--pages") {
        o.layout.pages = std::stoull(value());
      } else if (flag == "--keys") {
        ParseRange(value(), &o.key_begin, &o.key_end);
      } else if (flag == "--hold-keys") {
        ParseRange(value(), &o.hold_begin, &o.hold_end);
      } else if (flag == "--stride") {
        o.stride = std::stoull(value());
        if (o.stride == 0) Usage("--stride must be > 0");
      } else if (flag == "--seed") {
        o.seed = std::stoull(value());
      } else if (flag == "--page-base") {
        o.page_base = std::stoull(value());
      } else if (flag == "--dst-page") {
        o.dst_page = std::stoll(value());
      } else if (flag == "--fragments") {
        const std::string v = value();
        size_t pos = 0;
        while (pos <= v.size()) {
          size_t end = v.find(';', pos);
          if (end == std::string::npos) end = v.size();
          std::vector<uint32_t> f;
          for (uint64_t s : ParseU64List(v.substr(pos, end - pos))) {
            f.push_back(static_cast<uint32_t>(s));
          }
          o.fragments.push_back(f);
          pos = end + 1;
        }
      } else if (flag == "--batch") {
        o.batch = std::stoull(value());
      } else if (flag == "--retry-ms") {
        o.retry_ms = std::stoi(value());
      } else if (flag == "--expect-prefix") {
        o.expect_prefix = std::stoll(value());
      } else if (flag == "--expect-source") {
        o.expect_source = value();
      } else if (flag == "--wait-source") {
        o.wait_source = value();
      } else if (flag == "--wait-ms") {
        o.wait_ms = std::stoi(value());
      } else if (flag == "--ttl-ms") {
        o.ttl_ms = static_cast<uint32_t>(std::stoul(value()));
      } else if (flag == "--timeout-ms") {
        o.timeout_ms = std::stoi(value());
      } else if (flag == "--no-miss-key") {
        o.no_miss_key = true;
      } else if (flag == "--linger-ms") {
        o.linger_ms = std::stoi(value());
      } else {
        Usage("unknown flag " + flag);
      }
    }
  } catch (const std::exception& e) {
    Usage(std::string("bad flag value: ") + e.what());
  }
  if (o.socket.empty()) Usage("--socket is required");
  if (o.key_end == o.key_begin && o.command != "query") Usage("--keys is required");
  return o;
}

// PublishResult::dropped (pool had no room) where the API reports it apart
// from skipped (already cached); older APIs count both as skipped.
template <typename T>
uint32_t Dropped(const T& r) {
  if constexpr (requires { r.dropped; }) {
    return r.dropped;
  } else {
    return 0;
  }
}

struct Counts {
  uint32_t stored = 0, sealed = 0, skipped = 0, dropped = 0;
  void Add(const PublishResult& r) {
    stored += r.stored;
    sealed += r.sealed;
    skipped += r.skipped;
    dropped += Dropped(r);
  }
};

char TierChar(Tier t) { return t == Tier::kDram ? 'D' : t == Tier::kSsd ? 'S' : '-'; }

std::string Sources(const std::vector<Tier>& s) {
  std::string out;
  for (Tier t : s) out += TierChar(t);
  return out.empty() ? "none" : out;
}

bool SourceIs(Tier t, const std::string& want) {
  if (want == "dram") return t == Tier::kDram;
  if (want == "ssd") return t == Tier::kSsd;
  return t != Tier::kNone;
}

int Fail(int code, const std::string& what) {
  std::fprintf(stderr, "orbitkv-test-engine: %s\n", what.c_str());
  std::printf("@ error %s\n", what.c_str());
  std::fflush(stdout);
  return code;
}

class Engine {
 public:
  explicit Engine(Options o) : o_(std::move(o)), layout_(BuildLayout(o_.layout)), pages_(layout_) {
    for (uint64_t k = o_.key_begin; k < o_.key_end; k += o_.stride) keys_.push_back(k);
  }

  int Run() {
    ClientConfig cc;
    cc.socket_path = o_.socket;
    cc.timeout = std::chrono::milliseconds(o_.timeout_ms);
    cc.client_name = "orbitkv-test-engine-" + o_.command;
    Result<std::unique_ptr<Client>> c = Client::Connect(cc);
    if (!c.ok()) return Fail(kCallFailed, "connect: " + c.status().ToString());
    client_ = std::move(c).value();
    RegisterRequest r;
    r.ns = o_.ns;
    r.rank = o_.rank;
    r.layout = layout_;
    Result<InstanceId> id = client_->RegisterInstance(r, pages_.fds());
    if (!id.ok()) return Fail(kCallFailed, "register: " + id.status().ToString());
    inst_ = *id;
    std::printf("@ registered instance=%llu pid=%d\n", static_cast<unsigned long long>(inst_),
                static_cast<int>(::getpid()));
    std::fflush(stdout);
    int rc;
    if (o_.command == "publish") {
      rc = Publish();
    } else if (o_.command == "restore-verify") {
      rc = RestoreVerify();
    } else if (o_.command == "query") {
      rc = QueryOnly();
    } else if (o_.command == "hold-restore") {
      rc = HoldRestore();
    } else {
      Usage("unknown subcommand " + o_.command);
    }
    if (Status st = client_->UnregisterInstance(inst_); !st.ok() && rc == kOk) {
      rc = Fail(kCallFailed, "unregister: " + st.ToString());
    }
    client_->Close();
    return rc;
  }

 private:
  uint64_t NumKeys() const { return keys_.size(); }

  std::vector<BlockKey> Chain(const std::vector<uint64_t>& ids, bool miss_key) const {
    std::vector<BlockKey> keys;
    for (uint64_t k : ids) keys.push_back(KeyOf(k));
    // A key nobody publishes: the prefix must stop before it.
    if (miss_key) keys.push_back(KeyOf((uint64_t{1} << 48) + (ids.empty() ? 0 : ids[0])));
    return keys;
  }

  int Publish() {
    if (o_.page_base + NumKeys() > layout_.num_pages) {
      return Fail(kUsage, "keys do not fit the pages after --page-base");
    }
    for (uint64_t i = 0; i < NumKeys(); ++i) {
      pages_.Fill(0, o_.page_base + i, SeedOf(o_.seed, keys_[i]));
    }
    std::vector<std::vector<uint32_t>> fragments = o_.fragments;
    if (fragments.empty()) fragments.push_back({});
    const uint64_t batch = o_.retry_ms > 0 ? 1 : (o_.batch ? o_.batch : NumKeys());
    Counts total;
    uint32_t retried = 0;
    for (size_t f = 0; f < fragments.size(); ++f) {
      Counts fr;
      for (uint64_t first = 0; first < NumKeys(); first += batch) {
        const uint64_t n = std::min(batch, NumKeys() - first);
        PublishRequest p;
        p.instance = inst_;
        p.slot_ids = fragments[f];
        for (uint64_t i = first; i < first + n; ++i) {
          p.keys.push_back(KeyOf(keys_[i]));
          p.pages.push_back(o_.page_base + i);
        }
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.retry_ms);
        Result<PublishResult> r = client_->Publish(p);
        // Pool pressure: sealed objects wait for SSD writeback before they can
        // be evicted, so a fast publisher is told to come back later. (Keys
        // published with --retry-ms are fresh: anything not stored was refused.)
        while (r.ok() && r->skipped + Dropped(*r) > 0 && o_.retry_ms > 0 &&
               std::chrono::steady_clock::now() < deadline) {
          ++retried;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          r = client_->Publish(p);
        }
        if (!r.ok()) return Fail(kCallFailed, "publish: " + r.status().ToString());
        fr.Add(*r);
      }
      std::printf("@ fragment=%zu stored=%u sealed=%u skipped=%u dropped=%u\n", f, fr.stored,
                  fr.sealed, fr.skipped, fr.dropped);
      total.stored += fr.stored;
      total.sealed += fr.sealed;
      total.skipped += fr.skipped;
      total.dropped += fr.dropped;
    }
    std::printf("@ publish stored=%u sealed=%u skipped=%u dropped=%u retried=%u\n", total.stored,
                total.sealed, total.skipped, total.dropped, retried);
    std::fflush(stdout);
    // A writer's unsealed fragments go with its session: stay for the other writers.
    std::this_thread::sleep_for(std::chrono::milliseconds(o_.linger_ms));
    return kOk;
  }

  Result<QueryResult> Query(const std::vector<uint64_t>& ids, uint32_t ttl_ms) {
    QueryRequest q;
    q.instance = inst_;
    q.keys = Chain(ids, !o_.no_miss_key);
    q.ttl_ms = ttl_ms;
    return client_->Query(q);
  }

  int64_t ExpectedPrefix() const {
    return o_.expect_prefix >= 0 ? o_.expect_prefix : static_cast<int64_t>(NumKeys());
  }

  // Queries until the prefix is as expected and every source is --wait-source
  // (when given). The last query is returned, live for --ttl-ms.
  Result<QueryResult> QueryWhenReady() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.wait_ms);
    for (int attempt = 0;; ++attempt) {
      const bool waiting = !o_.wait_source.empty();
      Result<QueryResult> q = Query(keys_, o_.ttl_ms);
      if (!q.ok()) return q;
      bool ready = static_cast<int64_t>(q->prefix) == ExpectedPrefix();
      if (waiting) {
        for (Tier t : q->sources) ready = ready && SourceIs(t, o_.wait_source);
      }
      if (ready || !waiting || std::chrono::steady_clock::now() >= deadline) {
        std::printf("@ query attempts=%d prefix=%u sources=%s\n", attempt + 1, q->prefix,
                    Sources(q->sources).c_str());
        return q;
      }
      // Not yet (writeback or eviction pending): the query's pins and leases
      // expire with its TTL; poll with short-lived queries.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  int RestoreVerify() {
    if (!o_.wait_source.empty() && o_.ttl_ms > 2000) o_.ttl_ms = 2000;
    Result<QueryResult> q = QueryWhenReady();
    if (!q.ok()) return Fail(kCallFailed, "query: " + q.status().ToString());
    if (static_cast<int64_t>(q->prefix) != ExpectedPrefix()) {
      return Fail(kCheckFailed, "prefix " + std::to_string(q->prefix) + ", expected " +
                                    std::to_string(ExpectedPrefix()));
    }
    if (q->sources.size() != q->prefix) return Fail(kCheckFailed, "sources do not match prefix");
    for (Tier t : q->sources) {
      if (!SourceIs(t, o_.expect_source)) {
        return Fail(kCheckFailed,
                    "sources " + Sources(q->sources) + ", expected all " + o_.expect_source);
      }
    }
    if (q->prefix == 0) {
      if (q->query != 0) return Fail(kCheckFailed, "empty prefix with a query id");
      std::printf("@ restore prefix=0 restored=0 verified=0\n");
      std::fflush(stdout);
      return kOk;
    }
    const uint64_t dst =
        o_.dst_page >= 0 ? static_cast<uint64_t>(o_.dst_page) : layout_.num_pages / 2;
    if (dst + q->prefix > layout_.num_pages) return Fail(kUsage, "restore pages out of range");
    RestoreRequest r;
    r.instance = inst_;
    r.query = q->query;
    for (uint32_t b = 0; b < q->prefix; ++b) {
      pages_.Clear(0, dst + b);
      r.blocks.push_back(b);
      r.pages.push_back(dst + b);
    }
    Result<RestoreResult> res = client_->Restore(r, client_->NewTicket());
    if (!res.ok()) return Fail(kCallFailed, "restore: " + res.status().ToString());
    if (res->blocks.size() != q->prefix) return Fail(kCheckFailed, "restore result size");
    uint32_t restored = 0, verified = 0;
    std::string errors;
    for (size_t i = 0; i < res->blocks.size(); ++i) {
      const BlockResult& b = res->blocks[i];
      if (!b.status.ok()) {
        errors += " block " + std::to_string(b.block) + ": " + b.status.ToString() + ";";
        continue;
      }
      ++restored;
      if (b.source != q->sources[b.block]) {
        errors += " block " + std::to_string(b.block) + " came from " + TierChar(b.source) +
                  ", queried " + TierChar(q->sources[b.block]) + ";";
      }
      if (pages_.Holds(0, dst + i, SeedOf(o_.seed, keys_[b.block]))) {
        ++verified;
      } else {
        errors += " block " + std::to_string(b.block) + " bytes differ;";
      }
    }
    std::printf("@ restore prefix=%u sources=%s restored=%u verified=%u\n", q->prefix,
                Sources(q->sources).c_str(), restored, verified);
    std::fflush(stdout);
    if (!errors.empty()) return Fail(kCheckFailed, "restore:" + errors);
    return kOk;
  }

  int QueryOnly() {
    Result<QueryResult> q = Query(keys_, o_.ttl_ms);
    if (!q.ok()) return Fail(kCallFailed, "query: " + q.status().ToString());
    std::printf("@ query prefix=%u sources=%s query=%llu\n", q->prefix, Sources(q->sources).c_str(),
                static_cast<unsigned long long>(q->query));
    std::fflush(stdout);
    return kOk;
  }

  int HoldRestore() {
    Result<QueryResult> q = Query(keys_, 60000);
    if (!q.ok()) return Fail(kCallFailed, "query: " + q.status().ToString());
    uint32_t hold_prefix = 0;
    if (o_.hold_end > o_.hold_begin) {
      std::vector<uint64_t> hold;
      for (uint64_t k = o_.hold_begin; k < o_.hold_end; ++k) hold.push_back(k);
      Result<QueryResult> h = Query(hold, 60000);  // never restored
      if (!h.ok()) return Fail(kCallFailed, "hold query: " + h.status().ToString());
      hold_prefix = h->prefix;
    }
    std::printf("@ held prefix=%u sources=%s hold_prefix=%u\n", q->prefix,
                Sources(q->sources).c_str(), hold_prefix);
    std::fflush(stdout);
    if (q->prefix == 0) return Fail(kCheckFailed, "nothing to restore");
    const uint64_t dst =
        o_.dst_page >= 0 ? static_cast<uint64_t>(o_.dst_page) : layout_.num_pages / 2;
    RestoreRequest r;
    r.instance = inst_;
    r.query = q->query;
    for (uint32_t b = 0; b < q->prefix && dst + b < layout_.num_pages; ++b) {
      r.blocks.push_back(b);
      r.pages.push_back(dst + b);
    }
    std::thread t([this, r] {
      Result<RestoreResult> res = client_->Restore(r, client_->NewTicket());
      uint32_t ok = 0;
      if (res.ok()) {
        for (const BlockResult& b : res->blocks) ok += b.status.ok();
      }
      std::printf("@ restore-done status=%s ok=%u\n", res.status().ToString().c_str(), ok);
      std::fflush(stdout);
    });
    t.detach();
    std::printf("@ restoring blocks=%zu\n", r.blocks.size());
    std::fflush(stdout);
    for (;;) ::pause();  // until killed
  }

  Options o_;
  InstanceLayout layout_;
  testing::HostPages pages_;
  std::vector<uint64_t> keys_;
  std::unique_ptr<Client> client_;
  InstanceId inst_ = 0;
};

}  // namespace
}  // namespace orbitkv::integration

int main(int argc, char** argv) {
  using namespace orbitkv::integration;
  Options o = Parse(argc, argv);
  try {
    Engine e(std::move(o));
    return e.Run();
  } catch (const std::exception& ex) {
    return Fail(kCallFailed, std::string("exception: ") + ex.what());
  }
}
