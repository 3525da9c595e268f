// orbitkv-torture-engine: one engine process of the randomised torture test
// (torture_test.cc). It connects to a Manager with the C++ Client, registers
// host pages in the shared namespace "torture" and, until --seconds pass,
// runs random operations seeded by --seed: publish chains of keys (whole
// groups, slot fragments, and fragments of private keys never completed),
// query chains (repeated
// keys too), restore random subsets of the prefix, cancel restores from
// another thread, prepare, release, or leave queries to expire.
//
// The bytes of key k are HostPages::Fill(SeedOf(1, k)) in every process, so
// any engine checks any restore: every block a restore reports OK must hold
// exactly key k's bytes. It prints one "@ torture ..." line of counts and exits
// 0; 1 after a wrong byte ("@ wrong ..." first), 2 bad usage, 3 when the
// Manager connection failed. It may be killed (SIGKILL) at any time.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine_common.h"
#include "orbitkv/client.h"
#include "testing/host_pages.h"

namespace orbitkv::integration {
namespace {

constexpr int kOk = 0, kWrongByte = 1, kUsage = 2, kCallFailed = 3;
constexpr uint64_t kPages = 64;        // publish from [0, 32), restore into [32, 64)
constexpr uint64_t kRestorePage = 32;  // first restore destination
const std::vector<uint64_t> kSlots = {3000, 1100, 4096};

struct Options {
  std::string socket;
  uint64_t seed = 1;
  double seconds = 10;
  uint64_t keys = 1500;  // key space: 1..keys, shared by every engine
  int id = 0;
};

struct Counts {
  uint64_t ops = 0, published = 0, fragments = 0, orphans = 0, queries = 0, budget_limited = 0;
  uint64_t restored = 0, restore_errors = 0, cancels = 0, prepared = 0;
};

class TortureEngine {
 public:
  TortureEngine(const Options& o, std::unique_ptr<Client> c)
      : o_(o), client_(std::move(c)), rng_(o.seed), pages_(testing::SplitLayout(kPages, kSlots)) {}

  int Run() {
    RegisterRequest r;
    r.ns = "torture";
    r.layout = testing::SplitLayout(kPages, kSlots);
    Result<InstanceId> id = client_->RegisterInstance(r, pages_.fds());
    if (!id.ok()) return Fail("register", id.status());
    inst_ = *id;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      ++n_.ops;
      const uint64_t op = Uniform(0, 99);
      int rc = kOk;
      if (op < 30) {
        rc = PublishChain();
      } else if (op < 62) {
        rc = QueryAndRestore(/*cancel=*/false);
      } else if (op < 74) {
        rc = QueryAndRestore(/*cancel=*/true);
      } else if (op < 84) {
        rc = PrepareSome();
      } else if (op < 92) {
        rc = RepeatedKeyQuery();
      } else {
        rc = QueryAndLeave();
      }
      if (rc != kOk) return rc;
    }
    if (Status st = client_->UnregisterInstance(inst_); !st.ok()) return Fail("unregister", st);
    std::printf(
        "@ torture engine=%d ops=%llu published=%llu fragments=%llu orphans=%llu queries=%llu "
        "budget_limited=%llu restored=%llu restore_errors=%llu cancels=%llu prepared=%llu "
        "wrong=0\n",
        o_.id, U(n_.ops), U(n_.published), U(n_.fragments), U(n_.orphans), U(n_.queries),
        U(n_.budget_limited), U(n_.restored), U(n_.restore_errors), U(n_.cancels), U(n_.prepared));
    return kOk;
  }

 private:
  static unsigned long long U(uint64_t v) { return v; }
  uint64_t Uniform(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }
  // A run of consecutive keys: engines share prefixes the way requests do.
  std::vector<uint64_t> Chain(uint64_t max_len) {
    const uint64_t len = Uniform(1, max_len);
    const uint64_t first = Uniform(1, o_.keys - len + 1);
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < len; ++i) keys.push_back(first + i);
    return keys;
  }
  static std::vector<BlockKey> Keys(const std::vector<uint64_t>& ids) {
    std::vector<BlockKey> out;
    for (uint64_t k : ids) out.push_back(KeyOf(k));
    return out;
  }
  // Only a broken connection ends the run; Manager refusals are expected here.
  int Check(const char* what, const Status& st) {
    if (st.ok()) return kOk;
    if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded) {
      return Fail(what, st);
    }
    return kOk;
  }
  int Fail(const char* what, const Status& st) {
    std::fprintf(stderr, "torture engine %d: %s: %s\n", o_.id, what, st.ToString().c_str());
    return kCallFailed;
  }

  int PublishChain() {
    std::vector<uint64_t> keys = Chain(8);
    PublishRequest p;
    p.instance = inst_;
    p.keys = Keys(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      pages_.Fill(0, i, SeedOf(1, keys[i]));
      p.pages.push_back(i);
    }
    if (Uniform(0, 49) == 0) {
      // Fragments of keys only this engine uses, never completed: they stay
      // assembling until this engine unregisters or is killed.
      for (BlockKey& k : p.keys) k = KeyOf(++orphan_key_);
      p.slot_ids = {0};
      Result<PublishResult> r = client_->Publish(p);
      if (r.ok()) n_.orphans += r->stored;
      return Check("publish orphan fragment", r.status());
    }
    if (Uniform(0, 3) == 0) {  // fragments: slot 0, then the rest
      ++n_.fragments;
      p.slot_ids = {0};
      Result<PublishResult> r = client_->Publish(p);
      if (int rc = Check("publish fragment", r.status()); rc != kOk) return rc;
      p.slot_ids = {1, 2};
    }
    Result<PublishResult> r = client_->Publish(p);
    if (r.ok()) n_.published += r->sealed;
    return Check("publish", r.status());
  }

  // Checks every block a restore reported OK; exits the process on a wrong byte.
  int Judge(const std::vector<uint64_t>& keys, const std::vector<uint32_t>& blocks,
            const std::vector<uint64_t>& dst, const RestoreResult& r) {
    for (size_t i = 0; i < r.blocks.size() && i < blocks.size(); ++i) {
      if (!r.blocks[i].status.ok()) {
        ++n_.restore_errors;
        continue;
      }
      const uint64_t key = keys[blocks[i]];
      if (!pages_.Holds(0, dst[i], SeedOf(1, key))) {
        std::printf("@ wrong engine=%d key=%llu page=%llu source=%d\n", o_.id, U(key), U(dst[i]),
                    static_cast<int>(r.blocks[i].source));
        std::fflush(stdout);
        std::_Exit(kWrongByte);
      }
      ++n_.restored;
    }
    return kOk;
  }

  int QueryAndRestore(bool cancel) {
    std::vector<uint64_t> keys = Chain(12);
    Result<QueryResult> q =
        client_->Query({inst_, 0, Keys(keys), static_cast<uint32_t>(Uniform(100, 2000))});
    ++n_.queries;
    if (!q.ok()) return Check("query", q.status());
    if (q->budget_limited) ++n_.budget_limited;
    if (q->prefix == 0) return kOk;
    // A random subset of the prefix into distinct pages.
    std::vector<uint32_t> blocks;
    for (uint32_t b = 0; b < q->prefix; ++b) {
      if (Uniform(0, 3) != 0) blocks.push_back(b);
    }
    if (blocks.empty()) blocks.push_back(0);
    std::vector<uint64_t> dst;
    for (size_t i = 0; i < blocks.size(); ++i) {
      dst.push_back(kRestorePage + i);
      pages_.Clear(0, dst.back());
    }
    RestoreRequest req{inst_, q->query, blocks, dst};
    Result<RestoreResult> r = Status::Internal("restore did not run");
    if (cancel) {
      ++n_.cancels;
      const uint64_t ticket = client_->NewTicket();
      std::thread t([&] { r = client_->Restore(req, ticket); });
      std::this_thread::sleep_for(std::chrono::microseconds(Uniform(0, 2000)));
      Result<bool> c = client_->CancelRestore(ticket);
      t.join();
      if (int rc = Check("cancel", c.status()); rc != kOk) return rc;
    } else {
      r = client_->Restore(req);
    }
    if (!r.ok()) return Check("restore", r.status());
    if (int rc = Judge(keys, blocks, dst, *r); rc != kOk) return rc;
    if (blocks.size() < q->prefix && Uniform(0, 4) != 0) {
      return Check("release", client_->ReleaseQuery(inst_, q->query));
    }
    return kOk;  // the rest expires with the query's TTL
  }

  // A chain of one key many times: charged once, every copy restorable.
  int RepeatedKeyQuery() {
    const uint64_t key = Uniform(1, o_.keys);
    std::vector<uint64_t> keys(Uniform(2, 2000), key);
    Result<QueryResult> q = client_->Query({inst_, 0, Keys(keys), 2000});
    ++n_.queries;
    if (!q.ok()) return Check("repeated query", q.status());
    if (q->budget_limited) ++n_.budget_limited;
    if (q->prefix == 0) return kOk;
    std::vector<uint32_t> blocks = {0, q->prefix - 1};
    if (q->prefix == 1) blocks.pop_back();
    std::vector<uint64_t> dst;
    for (size_t i = 0; i < blocks.size(); ++i) {
      dst.push_back(kRestorePage + i);
      pages_.Clear(0, dst.back());
    }
    Result<RestoreResult> r = client_->Restore({inst_, q->query, blocks, dst});
    if (!r.ok()) return Check("restore repeated", r.status());
    if (int rc = Judge(keys, blocks, dst, *r); rc != kOk) return rc;
    return Check("release repeated", client_->ReleaseQuery(inst_, q->query));
  }

  int PrepareSome() {
    std::vector<uint64_t> keys = Chain(8);
    Result<uint32_t> n = client_->Prepare({inst_, 0, Keys(keys)});
    if (n.ok()) n_.prepared += *n;
    return Check("prepare", n.status());
  }

  int QueryAndLeave() {
    Result<QueryResult> q =
        client_->Query({inst_, 0, Keys(Chain(12)), static_cast<uint32_t>(Uniform(20, 500))});
    ++n_.queries;
    return Check("query", q.status());
  }

  Options o_;
  std::unique_ptr<Client> client_;
  std::mt19937_64 rng_;
  testing::HostPages pages_;
  InstanceId inst_ = 0;
  Counts n_;
  uint64_t orphan_key_ = (o_.seed % 1000000 + 1) << 24;  // beyond every engine's key space
};

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return kUsage;
    }
    const std::string v = argv[++i];
    try {
      if (a == "--socket") {
        o.socket = v;
      } else if (a == "--seed") {
        o.seed = std::stoull(v);
      } else if (a == "--seconds") {
        o.seconds = std::stod(v);
      } else if (a == "--keys") {
        o.keys = std::stoull(v);
      } else if (a == "--id") {
        o.id = std::stoi(v);
      } else {
        std::fprintf(stderr, "unknown flag %s\n", a.c_str());
        return kUsage;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "bad value for %s: %s\n", a.c_str(), v.c_str());
      return kUsage;
    }
  }
  if (o.socket.empty() || o.keys < 16) {
    std::fprintf(stderr, "usage: %s --socket PATH [--seed N] [--seconds S] [--keys N>=16]\n",
                 argv[0]);
    return kUsage;
  }
  ClientConfig cc;
  cc.socket_path = o.socket;
  cc.timeout = std::chrono::seconds(30);
  cc.client_name = "orbitkv-torture-engine";
  Result<std::unique_ptr<Client>> c = Client::Connect(cc);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    return kCallFailed;
  }
  return TortureEngine(o, std::move(c).value()).Run();
}

}  // namespace
}  // namespace orbitkv::integration

int main(int argc, char** argv) { return orbitkv::integration::Main(argc, argv); }
