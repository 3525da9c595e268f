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
#include "workload/hybrid.h"
#include "workload/pages.h"

namespace orbitkv::demo {
namespace {

class Engine {
 public:
  Engine(const EngineOptions& o, Client& client, Pages& pages, InstanceId instance,
         const ModelDescription* model)
      : o_(o),
        workload_(o.workload),
        client_(client),
        pages_(pages),
        instance_(instance),
        model_(model) {}

  // Runs one request; the error is a call that failed outright.
  Result<RequestRecord> Serve(uint32_t user, uint32_t round) {
    const Request req = workload_.MakeRequest(user, round);
    RequestRecord rec;
    // 1. Which prefix of the prompt is cached, and where.
    ORBITKV_ASSIGN_OR_RETURN(QueryResult qr, QueryPrompt(req, round, &rec));
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
      for (uint64_t p = 0; p < prefix; ++p) pages_.Poison(0, p);
      Result<RestoreResult> rr = TimedRestore(r, &rec);
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
          if (!pages_.Check(0, req.keys[b.block], b.block)) {
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
      pages_.Fill(0, req.keys[i], i);
      p.keys.push_back(req.keys[i]);
      p.pages.push_back(i);
    }
    rec.computed_tokens = req.tokens.size() - restored_blocks * workload_.config().block_tokens;
    Compute(compute_start, rec.computed_tokens);
    ORBITKV_RETURN_IF_ERROR(PublishCounted(p, &rec));
    return rec;
  }

  // A hybrid engine's request: restore the recovery plan's pieces, each into
  // the page of the chain key naming it in its own group; the prefix P counts
  // when every piece is byte-exact. Then compute and publish, per group, the
  // pieces ending after the restored prefix.
  Result<RequestRecord> ServeHybrid(uint32_t user, uint32_t round) {
    const ModelDescription& d = *model_;
    const Request req = workload_.MakeRequest(user, round);
    RequestRecord rec;
    rec.hybrid = true;
    ORBITKV_ASSIGN_OR_RETURN(QueryResult qr, QueryPrompt(req, round, &rec));
    rec.prefix_tokens = qr.prefix_tokens;
    rec.not_needed_bytes = qr.not_needed_bytes;
    const uint64_t bt = d.key_block_tokens;
    uint64_t restored_tokens = 0;
    if (!qr.pieces.empty()) {
      RestoreRequest r;
      r.instance = instance_;
      r.query = qr.query;
      for (uint32_t i = 0; i < qr.pieces.size(); ++i) {
        const QuerySource& s = qr.pieces[i];
        const uint64_t page = PieceKeyIndex(d, s.group, s.index);
        r.blocks.push_back(i);
        r.pages.push_back(page);
        pages_.Poison(s.group, page);
      }
      Result<RestoreResult> rr = TimedRestore(r, &rec);
      uint64_t good = 0, from_ssd = 0;
      if (!rr.ok()) {
        rec.first_error = rr.status().ToString();
      } else {
        for (const BlockResult& b : rr->blocks) {
          const QuerySource& s = qr.pieces[b.block];
          const uint64_t page = PieceKeyIndex(d, s.group, s.index);
          if (!b.status.ok()) {
            if (rec.first_error.empty()) rec.first_error = b.status.ToString();
            continue;
          }
          if (!pages_.Check(s.group, PieceContentKey(req.keys[page], s.group), page)) {
            ++rec.mismatched;
            std::fprintf(stderr,
                         "orbitkv-demo hybrid engine %u: MISMATCH user %u round %u group %s "
                         "piece %llu\n",
                         o_.index, user, round, d.groups[s.group].name.c_str(),
                         static_cast<unsigned long long>(s.index));
            continue;
          }
          ++good;
          from_ssd += b.source == Tier::kSsd;
          rec.restore_bytes += s.bytes;
          if (d.groups[s.group].kind == GroupKind::kRecurrent) rec.checkpoint_bytes += s.bytes;
        }
      }
      const uint64_t blocks = qr.prefix_tokens / bt;
      rec.pieces = good;
      if (good == qr.pieces.size()) {
        restored_tokens = qr.prefix_tokens;
        // The prefix's blocks, by where most of its pieces came from.
        (2 * from_ssd > good ? rec.hit_ssd : rec.hit_dram) = blocks;
      } else {
        rec.failed = blocks;  // the plan is all or nothing: recomputed
      }
    }
    rec.missed = req.prompt_blocks - (qr.prefix_tokens / bt);
    const auto compute_start = std::chrono::steady_clock::now();
    std::vector<PublishRequest> publishes(d.groups.size());
    for (const ChainPiece& p : ChainPieces(d, restored_tokens, req.keys.size() * bt)) {
      pages_.Fill(p.group, PieceContentKey(req.keys[p.key_index], p.group), p.key_index);
      publishes[p.group].keys.push_back(req.keys[p.key_index]);
      publishes[p.group].pages.push_back(p.key_index);
    }
    rec.computed_tokens = req.tokens.size() - restored_tokens;
    Compute(compute_start, rec.computed_tokens);
    for (uint32_t g = 0; g < publishes.size(); ++g) {
      publishes[g].instance = instance_;
      publishes[g].group_id = d.groups[g].storage_group;
      ORBITKV_RETURN_IF_ERROR(PublishCounted(publishes[g], &rec));
    }
    return rec;
  }

 private:
  // The record's identity, and the Query of the request's prompt blocks.
  Result<QueryResult> QueryPrompt(const Request& req, uint32_t round, RequestRecord* rec) {
    rec->engine = o_.index;
    rec->user = req.user;
    rec->round = round;
    rec->queried = req.prompt_blocks;
    QueryRequest q;
    q.instance = instance_;
    q.keys.assign(req.keys.begin(), req.keys.begin() + static_cast<ptrdiff_t>(req.prompt_blocks));
    q.ttl_ms = o_.query_ttl_ms;
    return client_.Query(q);
  }

  // One Restore call; its wall time goes to rec->restore_ns.
  Result<RestoreResult> TimedRestore(const RestoreRequest& r, RequestRecord* rec) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<RestoreResult> rr = client_.Restore(r, client_.NewTicket());
    rec->restore_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    return rr;
  }

  // Simulated model compute: `tokens` at compute_tokens_per_s since `start`.
  void Compute(std::chrono::steady_clock::time_point start, uint64_t tokens) const {
    if (o_.compute_tokens_per_s <= 0) return;
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::duration<double>(double(tokens) / o_.compute_tokens_per_s)));
  }

  Status PublishCounted(const PublishRequest& p, RequestRecord* rec) {
    rec->published += p.keys.size();
    if (p.keys.empty()) return Status::OK();
    ORBITKV_ASSIGN_OR_RETURN(PublishResult pr, client_.Publish(p));
    rec->stored += pr.stored;
    rec->skipped += pr.skipped + pr.dropped;
    return Status::OK();
  }

  const EngineOptions& o_;
  Workload workload_;
  Client& client_;
  Pages& pages_;
  InstanceId instance_;
  const ModelDescription* model_;  // hybrid engines only
};

}  // namespace

HybridModel DemoHybridModel(const WorkloadConfig& w) {
  HybridModel m;
  ModelDescription& d = m.description;
  d.key_block_tokens = w.block_tokens;
  const uint64_t kv = w.block_bytes() / 4;  // K or V of one of the two layers
  const uint64_t ckpt_tokens = kHybridCheckpointBlocks * w.block_tokens;
  GroupDescription attn{"attn", GroupKind::kFullAttention, 0, w.block_tokens, 2 * kv};
  GroupDescription swa{"swa",  GroupKind::kSlidingWindow, 1, w.block_tokens,
                       2 * kv, kHybridWindowTokens};
  GroupDescription gdn{"gdn", GroupKind::kRecurrent, 2, w.block_tokens, kHybridCheckpointBytes};
  gdn.checkpoint_interval_tokens = ckpt_tokens;
  d.groups = {attn, swa, gdn};
  // conv state 4 KiB, SSM state the rest
  m.slot_bytes = {{kv, kv}, {kv, kv}, {4096, kHybridCheckpointBytes - 4096}};
  return m;
}

namespace {

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
  const HybridModel hybrid = DemoHybridModel(w);
  const InstanceLayout layout =
      o.hybrid ? HybridLayout(hybrid.description, hybrid.slot_bytes, w.MaxBlocksPerRequest())
               : SplitLayout(w.MaxBlocksPerRequest(), w.SlotBytes());
  ORBITKV_ASSIGN_OR_RETURN(Pages pages, Pages::Create(layout));
  RegisterRequest reg;
  reg.ns = w.Namespace() + (o.hybrid ? "/hybrid" : "");
  reg.rank = 0;
  reg.layout = layout;
  if (o.hybrid) reg.model = hybrid.description;
  ORBITKV_ASSIGN_OR_RETURN(InstanceId instance, client->RegisterInstance(reg, pages.fds()));
  Engine engine(o, *client, pages, instance, o.hybrid ? &hybrid.description : nullptr);
  for (uint32_t round = 0; round < w.rounds; ++round) {
    for (uint32_t u = 0; u < w.users; ++u) {
      const uint32_t user = o.index * w.users + u;
      Result<RequestRecord> rec =
          o.hybrid ? engine.ServeHybrid(user, round) : engine.Serve(user, round);
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
