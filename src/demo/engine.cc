#include "demo/engine.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <thread>

#include "demo/record.h"
#include "orbitkv/client.h"
#include "workload/pages.h"

namespace orbitkv::demo {
namespace {

class Engine {
 public:
  Engine(const EngineOptions& o, Client& client, Pages& pages, InstanceId instance)
      : o_(o), workload_(o.workload), client_(client), pages_(pages), instance_(instance) {}

  // Runs one request; the error is a call that failed outright.
  Result<RequestRecord> Serve(uint32_t user, uint32_t round) {
    const Request req = workload_.MakeRequest(user, round);
    RequestRecord rec;
    rec.engine = o_.index;
    rec.user = user;
    rec.round = round;
    rec.queried = req.prompt_blocks;

    // 1. Which prefix of the prompt is cached, and where.
    QueryRequest q;
    q.instance = instance_;
    q.keys.assign(req.keys.begin(), req.keys.begin() + static_cast<ptrdiff_t>(req.prompt_blocks));
    q.ttl_ms = o_.query_ttl_ms;
    ORBITKV_ASSIGN_OR_RETURN(QueryResult qr, client_.Query(q));
    const uint64_t prefix = qr.prefix;
    rec.missed = req.prompt_blocks - prefix;

    // 2. Restore the prefix into pages 0..prefix-1 (block i -> page i) and check it.
    std::vector<bool> valid(req.keys.size(), false);
    if (prefix > 0) {
      RestoreRequest r;
      r.instance = instance_;
      r.query = qr.query;
      r.blocks.resize(prefix);
      std::iota(r.blocks.begin(), r.blocks.end(), 0u);
      r.pages.resize(prefix);
      std::iota(r.pages.begin(), r.pages.end(), uint64_t{0});
      for (uint64_t p = 0; p < prefix; ++p) pages_.Poison(p);
      const auto t0 = std::chrono::steady_clock::now();
      Result<RestoreResult> rr = client_.Restore(r, client_.NewTicket());
      rec.restore_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                 std::chrono::steady_clock::now() - t0)
                                                 .count());
      if (!rr.ok()) {
        rec.failed = prefix;
        rec.first_error = rr.status().ToString();
      } else {
        for (const BlockResult& b : rr->blocks) {
          if (!b.status.ok()) {
            ++rec.failed;
            if (rec.first_error.empty()) rec.first_error = b.status.ToString();
            continue;
          }
          if (!Holds(req.keys[b.block], b.block)) {
            ++rec.mismatched;
            std::fprintf(stderr,
                         "orbitkv-demo engine %u: MISMATCH user %u round %u block %u (source "
                         "%s)\n",
                         o_.index, user, round, b.block, b.source == Tier::kSsd ? "ssd" : "dram");
            continue;
          }
          valid[b.block] = true;
          (b.source == Tier::kSsd ? rec.hit_ssd : rec.hit_dram)++;
          rec.restore_bytes += workload_.config().block_bytes();
        }
      }
    }

    // 3. Prefill every prompt block not restored, decode the answer's blocks,
    //    and publish what was not restored (already cached blocks are skipped).
    const auto compute_start = std::chrono::steady_clock::now();
    PublishRequest p;
    p.instance = instance_;
    uint64_t restored_blocks = 0;
    for (uint64_t i = 0; i < req.keys.size(); ++i) {
      if (valid[i]) {
        ++restored_blocks;
        continue;
      }
      Fill(req.keys[i], i);
      p.keys.push_back(req.keys[i]);
      p.pages.push_back(i);
    }
    rec.computed_tokens = req.tokens.size() - restored_blocks * workload_.config().block_tokens;
    if (o_.compute_tokens_per_s > 0) {
      std::this_thread::sleep_until(
          compute_start +
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(
              double(rec.computed_tokens) / o_.compute_tokens_per_s)));
    }
    rec.published = p.keys.size();
    if (!p.keys.empty()) {
      ORBITKV_ASSIGN_OR_RETURN(PublishResult pr, client_.Publish(p));
      rec.stored = pr.stored;
      rec.skipped = pr.skipped + pr.dropped;
    }
    return rec;
  }

 private:
  void Fill(const BlockKey& key, uint64_t page) {
    for (uint32_t s = 0; s < pages_.slots(); ++s)
      FillBlockSlot(key, s, pages_.Slot(s, page), pages_.slot_bytes(s));
  }
  bool Holds(const BlockKey& key, uint64_t page) {
    for (uint32_t s = 0; s < pages_.slots(); ++s)
      if (!CheckBlockSlot(key, s, pages_.Slot(s, page), pages_.slot_bytes(s))) return false;
    return true;
  }

  const EngineOptions& o_;
  Workload workload_;
  Client& client_;
  Pages& pages_;
  InstanceId instance_;
};

bool WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

Status Run(const EngineOptions& o, bool* mismatch) {
  const WorkloadConfig& w = o.workload;
  ClientConfig cc;
  cc.socket_path = o.socket_path;
  cc.client_name = "orbitkv-demo-engine-" + std::to_string(o.index);
  ORBITKV_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(cc));
  const InstanceLayout layout = SplitLayout(w.MaxBlocksPerRequest(), w.SlotBytes());
  ORBITKV_ASSIGN_OR_RETURN(Pages pages, Pages::Create(layout));
  RegisterRequest reg;
  reg.ns = w.Namespace();
  reg.rank = 0;
  reg.layout = layout;
  ORBITKV_ASSIGN_OR_RETURN(InstanceId instance, client->RegisterInstance(reg, pages.fds()));
  Engine engine(o, *client, pages, instance);
  for (uint32_t round = 0; round < w.rounds; ++round) {
    for (uint32_t u = 0; u < w.users; ++u) {
      const uint32_t user = o.index * w.users + u;
      Result<RequestRecord> rec = engine.Serve(user, round);
      if (!rec.ok()) {
        return rec.status().WithContext("user " + std::to_string(user) + " round " +
                                        std::to_string(round));
      }
      if (rec->mismatched) *mismatch = true;
      if (!WriteAll(o.report_fd, EncodeRecord(*rec))) return Status::IOError("report pipe", errno);
    }
  }
  ORBITKV_RETURN_IF_ERROR(client->UnregisterInstance(instance));
  client->Close();
  return Status::OK();
}

}  // namespace

int RunEngine(const EngineOptions& options) {
  bool mismatch = false;
  Status st = Run(options, &mismatch);
  if (!st.ok()) {
    WriteAll(options.report_fd, EncodeError(st.ToString()));
    return 3;
  }
  WriteAll(options.report_fd, EncodeDone());
  return mismatch ? 1 : 0;
}

}  // namespace orbitkv::demo
