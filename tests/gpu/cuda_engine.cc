// orbitkv-cuda-engine: a CUDA engine process for the Manager process gates on
// a GPU host. It allocates its KV pages with cudaMalloc, registers them with
// a running Manager as "cuda:N" through IPC handles, publishes blocks from
// pages [0, B), waits until the Manager serves them from SSD (DRAM admission
// "reuse" drops them from DRAM after writeback), restores them into pages
// [B, 2B) and checks every byte. With --ranks R > 1 the instance holds only
// slot --rank of an R-slot group (a multi-writer TP group: the Manager
// assembles it in DRAM from every rank's fragment).
//
//   orbitkv-cuda-engine --socket PATH [--device N] [--blocks B] [--ns NAME]
//                       [--rank R --ranks N] [--slot-bytes S] [--first-key K]
//                       [--retry-failed] [--settle-ms MS]
// With --hybrid the instance is a hybrid model's (three cudaMalloc regions,
// a model description): "attn" (full attention, two slots), "swa" (a 48-token
// window) and "gdn" (recurrent: a conv and an SSM state slot, a checkpoint
// every 64 tokens), 16-token keys. It publishes every group's pieces of a
// --blocks-key chain, restores the recovery plan at once (DRAM), then again
// once every source is on SSD (the route --ssd-backend selects: cuFile or
// io_uring), each source into page B + i of its own group, and checks every
// byte and that no other group's page B + i changed.
// Exit 0 when every restored byte matched; 1 otherwise (the line says why).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "orbitkv/client.h"

namespace {

using namespace orbitkv;

struct Args {
  std::string socket, ns = "cuda-engine";
  int device = 0;
  uint32_t blocks = 64, rank = 0, ranks = 1;
  uint64_t slot_bytes = 64 << 10, first_key = 1;
  bool retry_failed = false;
  bool hybrid = false;
  // Wait before the first query: a query pins, and under --admission reuse a
  // use while the object waits for io_uring writeback keeps it in DRAM.
  uint32_t settle_ms = 0;
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "orbitkv-cuda-engine: %s\n", why.c_str());
  std::exit(1);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

uint8_t Pattern(uint64_t key, uint32_t slot, uint64_t i) {
  return static_cast<uint8_t>(key * 151 + slot * 29 + i * 13 + (i >> 11));
}

BlockKey Key(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[31] = 0xc7;
  return k;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(f + " needs a value");
      return argv[++i];
    };
    if (f == "--socket")
      a.socket = next();
    else if (f == "--device")
      a.device = std::stoi(next());
    else if (f == "--blocks")
      a.blocks = std::stoul(next());
    else if (f == "--ns")
      a.ns = next();
    else if (f == "--rank")
      a.rank = std::stoul(next());
    else if (f == "--ranks")
      a.ranks = std::stoul(next());
    else if (f == "--slot-bytes")
      a.slot_bytes = std::stoull(next());
    else if (f == "--first-key")
      a.first_key = std::stoull(next());
    else if (f == "--retry-failed")
      a.retry_failed = true;
    else if (f == "--hybrid")
      a.hybrid = true;
    else if (f == "--settle-ms")
      a.settle_ms = std::stoul(next());
    else
      Die("unknown flag " + f);
  }
  if (a.socket.empty()) Die("--socket is required");
  if (a.rank >= a.ranks) Die("--rank must be < --ranks");
  return a;
}

// One Restore call, its wall time in *ms; a failed call ends the process.
RestoreResult TimedRestore(Client& c, const RestoreRequest& rr, double* ms) {
  const auto t0 = std::chrono::steady_clock::now();
  Result<RestoreResult> res = c.Restore(rr, c.NewTicket());
  *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!res.ok()) Die("restore: " + res.status().ToString());
  return std::move(res).value();
}

// ---- --hybrid ---------------------------------------------------------------

constexpr uint64_t kKeyTokens = 16, kWindow = 48, kInterval = 64;
// Per storage group: slot sizes (unaligned ones included).
const std::vector<std::vector<uint64_t>> kHybridSlots = {
    {64 << 10, 1000}, {32 << 10}, {24576 + 100, 1 << 20}};

uint8_t PiecePattern(uint32_t group, uint64_t index, uint32_t slot, uint64_t i) {
  return static_cast<uint8_t>(group * 97 + index * 151 + slot * 29 + i * 13 + (i >> 11));
}

int RunHybrid(const Args& a, Client& c) {
  // Pages [0, B) hold the published pieces, [B, 2B + 4) the restored sources.
  const uint64_t pages = 2ull * a.blocks + kWindow / kKeyTokens + 1;
  if (a.blocks < 8 || a.blocks % 4 != 0) Die("--hybrid needs --blocks a multiple of 4, >= 8");
  ModelDescription d;
  d.key_block_tokens = kKeyTokens;
  GroupDescription attn{"attn", GroupKind::kFullAttention, 0, 16, (64 << 10) + 1000};
  GroupDescription swa{"swa", GroupKind::kSlidingWindow, 1, 16, 32 << 10, kWindow};
  GroupDescription gdn{"gdn", GroupKind::kRecurrent, 2, 16, 24576 + 100 + (1 << 20)};
  gdn.checkpoint_interval_tokens = kInterval;
  d.groups = {attn, swa, gdn};

  RegisterRequest reg;
  reg.ns = a.ns + "-hybrid";
  reg.device = "cuda:" + std::to_string(a.device);
  reg.layout.num_pages = pages;
  reg.model = d;
  std::vector<uint8_t*> base;  // one region per slot (split layout)
  std::vector<std::vector<uint8_t*>> slot_base(kHybridSlots.size());
  for (uint32_t g = 0; g < kHybridSlots.size(); ++g) {
    GroupLayout gl;
    gl.group_id = g;
    gl.num_slots = static_cast<uint32_t>(kHybridSlots[g].size());
    gl.slot_bytes = kHybridSlots[g];
    for (uint32_t s = 0; s < kHybridSlots[g].size(); ++s) {
      const uint64_t bytes = kHybridSlots[g][s];
      void* region = nullptr;
      Check(cudaMalloc(&region, pages * bytes), "cudaMalloc");
      Check(cudaMemset(region, 0xEE, pages * bytes), "cudaMemset");
      cudaIpcMemHandle_t h;
      Check(cudaIpcGetMemHandle(&h, region), "cudaIpcGetMemHandle");
      gl.slots.push_back({s, static_cast<uint32_t>(base.size()), 0, bytes, bytes});
      reg.layout.region_bytes.push_back(pages * bytes);
      reg.ipc_handles.emplace_back();
      std::memcpy(reg.ipc_handles.back().data(), &h, sizeof h);
      base.push_back(static_cast<uint8_t*>(region));
      slot_base[g].push_back(static_cast<uint8_t*>(region));
    }
    reg.layout.groups.push_back(gl);
  }
  auto inst = c.RegisterInstance(reg, {});
  if (!inst.ok()) Die("register: " + inst.status().ToString());

  auto fill = [&](uint32_t g, uint64_t index, uint64_t page) {
    for (uint32_t s = 0; s < kHybridSlots[g].size(); ++s) {
      std::vector<uint8_t> host(kHybridSlots[g][s]);
      for (uint64_t i = 0; i < host.size(); ++i) host[i] = PiecePattern(g, index, s, i);
      Check(cudaMemcpy(slot_base[g][s] + page * host.size(), host.data(), host.size(),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy H2D");
    }
    // A cudaMemcpy from pageable memory returns once the bytes are staged,
    // not landed, and the Manager reads the page from its own context: without
    // this wait its D2H read the page's old 0xEE while its GPU CRC32C read the
    // pattern, so the SSD copy failed its check (process gate H2, 2026-12-07).
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the fill");
  };
  std::vector<BlockKey> chain;
  for (uint32_t i = 0; i < a.blocks; ++i) chain.push_back(Key(a.first_key + i));
  uint32_t sealed = 0;
  auto publish = [&](uint32_t g, uint64_t index, uint64_t key) {
    fill(g, index, key);  // the piece named by chain key `key` lives in page `key`
    auto r = c.Publish({*inst, g, {chain[key]}, {key}, {}});
    if (!r.ok()) Die("publish: " + r.status().ToString());
    sealed += r->sealed;
  };
  for (uint32_t b = 0; b < a.blocks; ++b) {
    publish(0, b, b);
    publish(1, b, b);
  }
  for (uint64_t pos = kInterval; pos <= a.blocks * kKeyTokens; pos += kInterval) {
    publish(2, pos, pos / kKeyTokens - 1);
  }
  std::printf("hybrid on cuda:%d: %u pieces sealed (attn, swa: %u blocks; gdn: %u checkpoints)\n",
              a.device, sealed, a.blocks, a.blocks / 4);
  const uint64_t p = a.blocks * kKeyTokens;  // every piece is there: P is the whole chain
  const size_t want_sources = a.blocks + kWindow / kKeyTokens + 1;

  auto restore_and_verify = [&](const QueryResult& q, const char* when) -> bool {
    std::string tiers;
    for (Tier t : q.sources) tiers += t == Tier::kDram ? 'D' : 'S';
    RestoreRequest rr;
    rr.instance = *inst;
    rr.query = q.query;
    for (uint32_t i = 0; i < q.pieces.size(); ++i) {
      rr.blocks.push_back(i);
      rr.pages.push_back(a.blocks + i);
    }
    for (uint32_t g = 0; g < kHybridSlots.size(); ++g) {  // destination pages: 0xEE
      for (uint32_t s = 0; s < kHybridSlots[g].size(); ++s) {
        const uint64_t bytes = kHybridSlots[g][s];
        Check(cudaMemset(slot_base[g][s] + a.blocks * bytes, 0xEE, a.blocks * bytes), "cudaMemset");
      }
    }
    // cudaMemset is asynchronous to the host: it must land before the
    // Manager writes the pages, not after.
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the poison");
    double ms = 0;
    const RestoreResult res = TimedRestore(c, rr, &ms);
    uint32_t failed = 0;
    for (const BlockResult& b : res.blocks) {
      if (!b.status.ok()) {
        std::printf("hybrid %s: block %u failed: %s\n", when, b.block, b.status.ToString().c_str());
        ++failed;
      }
    }
    uint64_t mismatches = 0, foreign = 0;
    for (uint32_t i = 0; i < q.pieces.size(); ++i) {
      const QuerySource& src = q.pieces[i];
      for (uint32_t g = 0; g < kHybridSlots.size(); ++g) {
        for (uint32_t s = 0; s < kHybridSlots[g].size(); ++s) {
          std::vector<uint8_t> host(kHybridSlots[g][s]);
          Check(cudaMemcpy(host.data(), slot_base[g][s] + (a.blocks + i) * host.size(), host.size(),
                           cudaMemcpyDeviceToHost),
                "cudaMemcpy D2H");
          for (uint64_t j = 0; j < host.size(); ++j) {
            if (g == src.storage_group) {
              mismatches += host[j] != PiecePattern(g, src.index, s, j);
            } else {
              foreign += host[j] != 0xEE;  // another group's page: untouched
            }
          }
        }
      }
    }
    std::printf(
        "hybrid %s: P=%llu tokens, %zu sources %s, %llu bytes charged, %llu not needed; restore "
        "%u failed (%.1f ms); %llu mismatching bytes, %llu bytes written outside their group\n",
        when, static_cast<unsigned long long>(q.prefix_tokens), q.pieces.size(), tiers.c_str(),
        static_cast<unsigned long long>(q.logical_bytes),
        static_cast<unsigned long long>(q.not_needed_bytes), failed, ms,
        static_cast<unsigned long long>(mismatches), static_cast<unsigned long long>(foreign));
    std::fflush(stdout);
    return failed == 0 && mismatches == 0 && foreign == 0 && q.prefix_tokens == p &&
           q.pieces.size() == want_sources;
  };

  QueryRequest q;
  q.instance = *inst;
  q.keys = chain;
  // --settle-ms: a query pins, and under --admission reuse a pin of an object
  // still waiting for io_uring writeback keeps it in DRAM for good.
  std::this_thread::sleep_for(std::chrono::milliseconds(a.settle_ms));
  auto first = c.Query(q);
  if (!first.ok()) Die("query: " + first.status().ToString());
  auto all_ssd = [&](const QueryResult& r) {
    bool ssd = r.pieces.size() == want_sources;
    for (Tier t : r.sources) ssd &= t == Tier::kSsd;
    return ssd;
  };
  auto finish = [&](bool ok) {
    if (Status st = c.UnregisterInstance(*inst); !st.ok()) Die("unregister: " + st.ToString());
    c.Close();
    for (uint8_t* b : base) cudaFree(b);
    std::printf("hybrid: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  };
  // Already all on SSD: that is the SSD restore (on the io_uring route a
  // restore from SSD promotes the pieces into DRAM, so a later query would
  // never see them all on SSD again).
  if (all_ssd(*first)) return finish(restore_and_verify(*first, "SSD restore"));
  bool ok = restore_and_verify(*first, "first restore");
  // Then from SSD: poll until every source is on SSD (admission reuse drops
  // first-time objects from DRAM after their writeback).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    auto qr = c.Query(q);
    if (!qr.ok()) Die("query: " + qr.status().ToString());
    if (all_ssd(*qr)) {
      ok &= restore_and_verify(*qr, "SSD restore");
      break;
    }
    if (qr->query) c.ReleaseQuery(*inst, qr->query).IgnoreError("polling");
    if (std::chrono::steady_clock::now() > deadline) Die("the plan never came all from SSD");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return finish(ok);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  if (a.hybrid) {
    Check(cudaSetDevice(a.device), "cudaSetDevice");
    ClientConfig cc;
    cc.socket_path = a.socket;
    cc.client_name = "orbitkv-cuda-engine";
    auto client = Client::Connect(cc);
    if (!client.ok()) Die(client.status().ToString());
    return RunHybrid(a, **client);
  }
  const uint64_t pages = 2ull * a.blocks;
  Check(cudaSetDevice(a.device), "cudaSetDevice");
  // One region: this rank's slot of every page.
  void* region = nullptr;
  Check(cudaMalloc(&region, pages * a.slot_bytes), "cudaMalloc");
  cudaIpcMemHandle_t h;
  Check(cudaIpcGetMemHandle(&h, region), "cudaIpcGetMemHandle");
  std::vector<uint8_t> host(a.slot_bytes);
  for (uint64_t p = 0; p < pages; ++p) {
    for (uint64_t i = 0; i < a.slot_bytes; ++i) {
      host[i] = p < a.blocks ? Pattern(a.first_key + p, a.rank, i) : 0xEE;
    }
    Check(cudaMemcpy(static_cast<uint8_t*>(region) + p * a.slot_bytes, host.data(), a.slot_bytes,
                     cudaMemcpyHostToDevice),
          "cudaMemcpy H2D");
  }
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the fill");  // as RunHybrid's

  ClientConfig cc;
  cc.socket_path = a.socket;
  cc.client_name = "orbitkv-cuda-engine";
  auto client = Client::Connect(cc);
  if (!client.ok()) Die(client.status().ToString());
  Client& c = **client;

  RegisterRequest reg;
  reg.ns = a.ns;
  reg.rank = a.rank;
  reg.device = "cuda:" + std::to_string(a.device);
  reg.layout.num_pages = pages;
  reg.layout.region_bytes = {pages * a.slot_bytes};
  GroupLayout g;
  g.group_id = 0;
  g.num_slots = a.ranks;
  g.slot_bytes.assign(a.ranks, a.slot_bytes);
  g.slots.push_back({a.rank, 0, 0, a.slot_bytes, a.slot_bytes});
  reg.layout.groups.push_back(g);
  reg.ipc_handles.resize(1);
  std::memcpy(reg.ipc_handles[0].data(), &h, sizeof h);
  auto inst = c.RegisterInstance(reg, {});
  if (!inst.ok()) Die("register: " + inst.status().ToString());

  // Publish (this rank's fragment when ranks > 1).
  uint32_t sealed = 0, stored = 0;
  for (uint32_t b = 0; b < a.blocks; b += 16) {
    PublishRequest p;
    p.instance = *inst;
    for (uint32_t i = b; i < std::min(a.blocks, b + 16); ++i) {
      p.keys.push_back(Key(a.first_key + i));
      p.pages.push_back(i);
    }
    if (a.ranks > 1) p.slot_ids = {a.rank};
    auto r = c.Publish(p);
    if (!r.ok()) Die("publish: " + r.status().ToString());
    sealed += r->sealed;
    stored += r->stored;
  }
  std::printf("rank %u on cuda:%d: published %u blocks of %llu bytes (%u sealed by this call)\n",
              a.rank, a.device, stored, static_cast<unsigned long long>(a.slot_bytes), sealed);
  std::fflush(stdout);

  std::this_thread::sleep_for(std::chrono::milliseconds(a.settle_ms));
  // Wait until every block is whole and on SSD only (other ranks may still publish).
  QueryRequest q;
  q.instance = *inst;
  for (uint32_t i = 0; i < a.blocks; ++i) q.keys.push_back(Key(a.first_key + i));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int attempts = a.retry_failed ? 2 : 1;
  bool all_ok = false;
  while (attempts-- > 0) {
    Result<QueryResult> qr = Status::Internal("no query");
    while (true) {
      qr = c.Query(q);
      if (!qr.ok()) Die("query: " + qr.status().ToString());
      bool ssd = qr->prefix == a.blocks;
      for (Tier t : qr->sources) ssd &= t == Tier::kSsd;
      if (ssd) break;
      if (qr->query) c.ReleaseQuery(*inst, qr->query).IgnoreError("polling");
      if (std::chrono::steady_clock::now() > deadline) {
        Die("blocks never all on SSD: prefix " + std::to_string(qr->prefix));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    RestoreRequest rr;
    rr.instance = *inst;
    rr.query = qr->query;
    for (uint32_t i = 0; i < a.blocks; ++i) {
      rr.blocks.push_back(i);
      rr.pages.push_back(a.blocks + i);
    }
    double ms = 0;
    const RestoreResult res = TimedRestore(c, rr, &ms);
    uint32_t failed = 0;
    std::string first_error;
    for (const BlockResult& b : res.blocks) {
      if (!b.status.ok()) {
        if (first_error.empty()) first_error = b.status.ToString();
        ++failed;
      }
    }
    std::printf("rank %u: restore of %u SSD blocks: %u failed%s%s (%.1f ms)\n", a.rank, a.blocks,
                failed, failed ? ", first: " : "", first_error.c_str(), ms);
    std::fflush(stdout);
    if (failed) continue;  // retry once when asked (auto fallback)
    uint64_t mismatches = 0;
    for (uint32_t i = 0; i < a.blocks; ++i) {
      Check(cudaMemcpy(host.data(), static_cast<uint8_t*>(region) + (a.blocks + i) * a.slot_bytes,
                       a.slot_bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
      for (uint64_t j = 0; j < a.slot_bytes; ++j) {
        mismatches += host[j] != Pattern(a.first_key + i, a.rank, j);
      }
    }
    std::printf("rank %u: verified %u restored blocks on cuda:%d: %llu mismatching bytes\n", a.rank,
                a.blocks, a.device, static_cast<unsigned long long>(mismatches));
    all_ok = mismatches == 0;
    break;
  }
  if (Status st = c.UnregisterInstance(*inst); !st.ok()) Die("unregister: " + st.ToString());
  c.Close();
  cudaFree(region);
  return all_ok ? 0 : 1;
}
