// orbitkv-hybrid-engine: an engine process with a hybrid layout for the
// cross-process test (manager_process_test.cc, "Hybrid"). It registers host
// pages of three storage groups with a model description:
//   group 0 "attn": full attention, two slots (4096 + 1000 bytes: two layers)
//   group 1 "swa":  a 48-token sliding window, one 2048-byte slot
//   group 2 "gdn":  recurrent, a conv slot of 1000 and an SSM slot of 3000
//                   bytes, a checkpoint every 64 tokens
// with 16-token keys, and runs one subcommand:
//   publish         chain keys 0..N-1: attn and swa blocks 0..N-1 from pages
//                   0..N-1, the gdn checkpoints at 64, 128, ... <= 16 N from page
//                   position / 16 - 1 (--skip-checkpoint P leaves one out):
//                   workload/hybrid.h's ChainPieces and HybridLayout
//   restore-verify  query the chain of N keys, check P (--expect-prefix-tokens),
//                   that the plan lists exactly the pieces P needs, each source's
//                   tier (--expect-source), restore every source into page
//                   32 + i of its group and check every byte, and that no other
//                   group's page 32 + i changed
// Piece (group g, index i) carries HostPages::Fill(SeedOf(--seed, g * 100000 + i)).
// Results are lines starting with "@ "; exit 0 success, 1 a check failed,
// 2 usage, 3 a Manager call failed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine_common.h"
#include "orbitkv/client.h"
#include "testing/host_pages.h"
#include "workload/hybrid.h"

namespace orbitkv::integration {
namespace {

constexpr int kOk = 0, kCheckFailed = 1, kUsage = 2, kCallFailed = 3;
constexpr uint64_t kPages = 64, kDst = 32, kKeyTokens = 16, kWindow = 48, kInterval = 64;
const std::vector<std::vector<uint64_t>> kSlots = {{4096, 1000}, {2048}, {1000, 3000}};

ModelDescription Description() {
  ModelDescription d;
  d.key_block_tokens = kKeyTokens;
  GroupDescription attn{"attn", GroupKind::kFullAttention, 0, 16, 5096};
  GroupDescription swa{"swa", GroupKind::kSlidingWindow, 1, 16, 2048, kWindow};
  GroupDescription gdn{"gdn", GroupKind::kRecurrent, 2, 16, 4000};
  gdn.checkpoint_interval_tokens = kInterval;
  d.groups = {attn, swa, gdn};
  return d;
}

struct Options {
  std::string command, socket, ns = "hybrid";
  uint64_t keys = 0, seed = 1;
  std::vector<uint64_t> skip_checkpoints;
  int64_t expect_prefix_tokens = -1;
  std::string expect_source = "any";  // dram | ssd | any
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "orbitkv-hybrid-engine: %s\n", why.c_str());
  std::fprintf(stderr,
               "usage: orbitkv-hybrid-engine publish|restore-verify --socket S [--ns N] --keys N "
               "[--seed X] [--skip-checkpoint P]... [--expect-prefix-tokens P] "
               "[--expect-source dram|ssd|any]\n");
  std::exit(kUsage);
}

Options Parse(int argc, char** argv) {
  if (argc < 2) Usage("no command");
  Options o;
  o.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--socket") {
      o.socket = v;
    } else if (a == "--ns") {
      o.ns = v;
    } else if (a == "--keys") {
      o.keys = std::stoull(v);
    } else if (a == "--seed") {
      o.seed = std::stoull(v);
    } else if (a == "--skip-checkpoint") {
      o.skip_checkpoints.push_back(std::stoull(v));
    } else if (a == "--expect-prefix-tokens") {
      o.expect_prefix_tokens = std::stoll(v);
    } else if (a == "--expect-source") {
      o.expect_source = v;
    } else {
      Usage("unknown flag " + a);
    }
  }
  if (o.socket.empty() || o.keys == 0 || o.keys > kDst) Usage("--socket and --keys 1..32 needed");
  return o;
}

uint64_t PieceSeed(const Options& o, uint32_t group, uint64_t index) {
  return SeedOf(o.seed, uint64_t{group} * 100000 + index);
}

int Fail(const std::string& what) {
  std::printf("@ error %s\n", what.c_str());
  std::fflush(stdout);
  return kCheckFailed;
}

int Run(const Options& o) {
  const ModelDescription d = Description();
  InstanceLayout layout = demo::HybridLayout(d, kSlots, kPages);
  testing::HostPages pages(layout);
  ClientConfig cc;
  cc.socket_path = o.socket;
  cc.client_name = "orbitkv-hybrid-engine";
  Result<std::unique_ptr<Client>> c = Client::Connect(cc);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    return kCallFailed;
  }
  RegisterRequest rr;
  rr.ns = o.ns;
  rr.layout = layout;
  rr.model = d;
  Result<InstanceId> inst = (*c)->RegisterInstance(rr, pages.fds());
  if (!inst.ok()) {
    std::fprintf(stderr, "register: %s\n", inst.status().ToString().c_str());
    return kCallFailed;
  }
  std::vector<BlockKey> chain;
  for (uint64_t i = 0; i < o.keys; ++i) chain.push_back(KeyOf(i));

  if (o.command == "publish") {
    uint32_t sealed = 0, skipped = 0;
    auto publish = [&](uint32_t g, uint64_t index, uint64_t key, uint64_t page) -> bool {
      pages.Fill(g, page, PieceSeed(o, g, index));
      Result<PublishResult> r = (*c)->Publish({*inst, g, {chain[key]}, {page}, {}});
      if (!r.ok()) {
        std::fprintf(stderr, "publish: %s\n", r.status().ToString().c_str());
        return false;
      }
      sealed += r->sealed;
      skipped += r->skipped;
      return true;
    };
    for (const demo::ChainPiece& p : demo::ChainPieces(d, 0, o.keys * kKeyTokens)) {
      bool skip = false;
      for (uint64_t s : o.skip_checkpoints) skip |= p.group == 2 && s == p.index;
      if (!skip && !publish(p.group, p.index, p.key_index, p.key_index)) return kCallFailed;
    }
    std::printf("@ publish sealed=%u skipped=%u\n", sealed, skipped);
    return kOk;
  }
  if (o.command != "restore-verify") Usage("unknown command " + o.command);

  Result<QueryResult> q = (*c)->Query({*inst, 0, chain, 10000});
  if (!q.ok()) {
    std::fprintf(stderr, "query: %s\n", q.status().ToString().c_str());
    return kCallFailed;
  }
  std::string sources;
  for (Tier t : q->sources) sources += t == Tier::kDram ? 'D' : t == Tier::kSsd ? 'S' : '-';
  std::printf("@ query prefix_tokens=%llu pieces=%zu sources=%s not_needed=%llu\n",
              static_cast<unsigned long long>(q->prefix_tokens), q->pieces.size(), sources.c_str(),
              static_cast<unsigned long long>(q->not_needed_bytes));
  const uint64_t p = q->prefix_tokens;
  if (o.expect_prefix_tokens >= 0 && p != static_cast<uint64_t>(o.expect_prefix_tokens)) {
    return Fail("prefix_tokens " + std::to_string(p) + ", expected " +
                std::to_string(o.expect_prefix_tokens));
  }
  // Exactly what P needs: attn [0, P), swa covering [P - W, P), gdn at P.
  std::vector<std::pair<uint32_t, uint64_t>> want, got;
  for (const demo::ChainPiece& piece : demo::RequiredPieces(d, p))
    want.push_back({piece.group, piece.index});
  for (const QuerySource& s : q->pieces) got.push_back({s.group, s.index});
  if (got != want) return Fail("the plan's pieces are not exactly those P needs");
  for (Tier t : q->sources) {
    if ((o.expect_source == "dram" && t != Tier::kDram) ||
        (o.expect_source == "ssd" && t != Tier::kSsd)) {
      return Fail("a source is not on " + o.expect_source + ": " + sources);
    }
  }
  if (q->pieces.empty()) {
    std::printf("@ restore restored=0 verified=0\n");
    return kOk;
  }
  RestoreRequest req;
  req.instance = *inst;
  req.query = q->query;
  for (uint32_t i = 0; i < q->pieces.size(); ++i) {
    req.blocks.push_back(i);
    req.pages.push_back(kDst + i);
    for (uint32_t g = 0; g < kSlots.size(); ++g) pages.Clear(g, kDst + i);
  }
  Result<RestoreResult> r = (*c)->Restore(req);
  if (!r.ok()) {
    std::fprintf(stderr, "restore: %s\n", r.status().ToString().c_str());
    return kCallFailed;
  }
  uint32_t restored = 0, verified = 0;
  for (uint32_t i = 0; i < r->blocks.size(); ++i) {
    if (!r->blocks[i].status.ok()) {
      std::fprintf(stderr, "block %u: %s\n", i, r->blocks[i].status.ToString().c_str());
      continue;
    }
    ++restored;
    const QuerySource& s = q->pieces[i];
    bool ok = pages.Holds(s.storage_group, kDst + i, PieceSeed(o, s.group, s.index));
    for (uint32_t g = 0; g < kSlots.size(); ++g) {  // other groups' page kDst + i untouched
      if (g == s.storage_group) continue;
      for (size_t sl = 0; sl < kSlots[g].size(); ++sl) {
        const uint8_t* b = pages.Slot(g, sl, kDst + i);
        for (uint64_t x = 0; x < kSlots[g][sl]; ++x) ok &= b[x] == 0;
      }
    }
    verified += ok ? 1 : 0;
  }
  std::printf("@ restore restored=%u verified=%u\n", restored, verified);
  return verified == q->pieces.size() ? kOk : kCheckFailed;
}

}  // namespace
}  // namespace orbitkv::integration

int main(int argc, char** argv) {
  const auto o = orbitkv::integration::Parse(argc, argv);
  return orbitkv::integration::Run(o);
}
