// orbitkv-demo: the main job. One command starts orbitkv-cache-manager on
// defaults sized to this machine, forks engine processes (this binary again,
// with the hidden --engine-role flag) that run a multi-round conversation
// workload against it on host pages, and beside them --hybrid-engines engines
// of a hybrid model (full attention + sliding window + recurrent state, with
// a model description: their restores follow the Manager's recovery plans),
// shows live progress, and prints hit rates, bytes by tier, restore
// throughput and what recovery did not need to read. Every restored block is
// checked byte for byte; any mismatch exits 1. Other failures exit 3, bad
// flags 2.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "demo/engine.h"
#include "demo/record.h"
#include "demo/report.h"
#include "orbitkv/units.h"
#include "workload/machine.h"
#include "workload/manager_process.h"
#include "workload/process.h"
#include "workload/scrape.h"
#include "workload/workload.h"

namespace orbitkv::demo {
namespace {

constexpr int kExitMismatch = 1;
constexpr int kExitFlags = 2;
constexpr int kExitFailure = 3;

// The default model shape: small, so the demo moves ~1 GB in well under a minute.
constexpr uint32_t kLayers = 2, kHeads = 8, kHeadDim = 64, kDtypeBytes = 2;
constexpr uint64_t kDefaultBytesPerToken = uint64_t{kLayers} * 2 * kHeads * kHeadDim * kDtypeBytes;

constexpr uint64_t kPoolCap = 512 * kMiB;
constexpr uint64_t kPoolFloor = 16 * kMiB;
constexpr uint64_t kSsdCap = 4ull * 1000 * 1000 * 1000;  // 4gb
constexpr uint32_t kSsdShards = 4;

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted.store(true); }

struct Flags {
  WorkloadConfig w;
  std::string pool_size, ssd_capacity, state_dir, manager;
  uint32_t metrics_port = 0;
  double compute_tokens_per_s = 4000;
  uint32_t hybrid_engines = 1;
  bool no_progress = false;
  // Engine role (hidden).
  bool engine_role = false;
  bool hybrid_role = false;
  uint32_t engine_index = 0;
  std::string socket;
  int report_fd = -1;
};

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int Fail(const std::string& msg) {
  std::fprintf(stderr, "orbitkv-demo: %s\n", msg.c_str());
  return kExitFailure;
}

// The engine argv: this binary in the engine role, with the workload's flags.
std::vector<std::string> EngineArgv(const std::string& self, const Flags& f, uint32_t index,
                                    bool hybrid, const std::string& socket, int report_fd) {
  const WorkloadConfig& w = f.w;
  return {self,
          "--engine-role",
          "--engine-index",
          std::to_string(index),
          "--socket",
          socket,
          "--report-fd",
          std::to_string(report_fd),
          "--engines",
          std::to_string(w.engines),
          "--users",
          std::to_string(w.users),
          "--rounds",
          std::to_string(w.rounds),
          "--system-prompt-tokens",
          std::to_string(w.system_prompt_tokens),
          "--history-tokens",
          std::to_string(w.history_tokens),
          "--question-tokens",
          std::to_string(w.question_tokens),
          "--answer-tokens",
          std::to_string(w.answer_tokens),
          "--block-tokens",
          std::to_string(w.block_tokens),
          "--bytes-per-token",
          std::to_string(w.bytes_per_token),
          "--seed",
          std::to_string(w.seed),
          "--compute-tokens-per-s",
          fmt::format("{}", f.compute_tokens_per_s),
          "--hybrid-engines",
          std::to_string(f.hybrid_engines),
          "--hybrid-role",
          hybrid ? "1" : "0"};
}

struct EngineProc {
  Child child;
  int fd = -1;  // read end of its report pipe; -1 once at EOF
  std::string buffer;
  bool done = false;
  std::string error;
  int wait_status = 0;
  bool reaped = false;
};

// Reads what is available; returns the complete lines.
std::vector<std::string> ReadLines(EngineProc& e) {
  std::vector<std::string> out;
  char buf[65536];
  ssize_t n = ::read(e.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return out;
  if (n <= 0) {
    ::close(e.fd);
    e.fd = -1;
  } else {
    e.buffer.append(buf, static_cast<size_t>(n));
  }
  size_t pos;
  while ((pos = e.buffer.find('\n')) != std::string::npos) {
    out.push_back(e.buffer.substr(0, pos));
    e.buffer.erase(0, pos + 1);
  }
  return out;
}

int RunDemo(const Flags& f, const std::string& self) {
  const WorkloadConfig& w = f.w;
  // ---- embedded defaults, sized to this machine -----------------------------
  const std::string state = f.state_dir.empty() ? DefaultStateDir() : f.state_dir;
  if (Status st = MakeDirs(state); !st.ok()) return Fail(st.ToString());
  const uint64_t ram = TotalRamBytes();
  Result<uint64_t> free_bytes = FreeBytes(state);
  if (!free_bytes.ok()) return Fail(free_bytes.status().ToString());

  const uint64_t block_bytes = w.block_bytes();
  // A hybrid engine's block position: attention and window K/V, and a share of a checkpoint.
  const uint64_t hybrid_block_bytes =
      block_bytes + kHybridCheckpointBytes / kHybridCheckpointBlocks;
  const uint64_t working_set =
      w.WorkingSetBlocks() * block_bytes +
      uint64_t{f.hybrid_engines} * w.users * w.MaxBlocksPerRequest() * hybrid_block_bytes;
  const uint64_t request_bytes =
      w.MaxBlocksPerRequest() * (f.hybrid_engines ? hybrid_block_bytes : block_bytes);
  const uint32_t all_engines = w.engines + f.hybrid_engines;
  const uint64_t total_requests = uint64_t{all_engines} * w.users * w.rounds;
  uint64_t pool = 0;
  std::string pool_why;
  if (!f.pool_size.empty()) {
    Result<uint64_t> p = ParseByteSize(f.pool_size);
    if (!p.ok()) {
      Fail("--pool-size: " + std::string(p.status().message()));
      return kExitFlags;
    }
    pool = *p;
    pool_why = "--pool-size";
  } else {
    // A third of the working set, so later rounds must come back from SSD, but
    // room for every engine's largest request twice over (pins, SSD scratch);
    // never more than min(512 MiB, RAM/16).
    const uint64_t cap = std::max(std::min(kPoolCap, ram / 16) / kMiB * kMiB, kPoolFloor);
    const uint64_t third = working_set / 3, room = 2 * uint64_t{all_engines} * request_bytes;
    pool = std::min(RoundUp(std::max({third, room, kPoolFloor}), kMiB), cap);
    pool_why = pool == cap ? "default: min(512 MiB, RAM/16)"
               : third >= room && third >= kPoolFloor
                   ? fmt::format(
                         "default: ~1/3 of the {} working set, so later rounds come "
                         "from SSD",
                         Bytes(double(working_set)))
               : room >= kPoolFloor
                   ? fmt::format("default: twice the largest request ({}) per engine",
                                 Bytes(double(request_bytes)))
                   : "default: the 16 MiB floor";
  }
  uint64_t ssd = 0;
  std::string ssd_why;
  if (!f.ssd_capacity.empty()) {
    Result<uint64_t> s = ParseByteSize(f.ssd_capacity);
    if (!s.ok()) {
      Fail("--ssd-capacity: " + std::string(s.status().message()));
      return kExitFlags;
    }
    ssd = *s;
    ssd_why = "--ssd-capacity";
  } else {
    ssd = std::min(kSsdCap, *free_bytes / 4) / (kSsdShards * kMiB) * (kSsdShards * kMiB);
    ssd_why = fmt::format("default: min(4 GB, 1/4 of the {} free)", Bytes(double(*free_bytes)));
    if (ssd < kSsdShards * kMiB) {
      return Fail("only " + Bytes(double(*free_bytes)) + " free under " + state +
                  "; set ORBITKV_DEMO_DIR to a file system with room");
    }
  }
  if (ssd < working_set) {
    std::fprintf(stderr,
                 "orbitkv-demo: note: the SSD capacity %s is below the %s working set; "
                 "the oldest blocks will be overwritten and miss\n",
                 Bytes(double(ssd)).c_str(), Bytes(double(working_set)).c_str());
  }

  Result<std::string> found = FindManagerBinary(f.manager);
  if (!found.ok()) return Fail(std::string(found.status().message()));
  const std::string manager = *found;
  const std::string socket = state + "/orbitkv.sock";
  if (socket.size() >= 108) return Fail("socket path too long (over 107 bytes): " + socket);
  if (SocketAccepts(socket)) {
    return Fail("a Manager is already serving " + socket +
                "; stop it, or give this demo its own ORBITKV_DEMO_DIR");
  }
  const std::string cache = state + "/cache.bin";
  const std::string log_path = state + "/manager.log";

  // ---- the Manager ----------------------------------------------------------
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: poll wakes up
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ManagerLaunch launch;
  launch.binary = manager;
  launch.args = {"--pool-size",  std::to_string(pool),      "--ssd-cache-path",
                 cache,          "--ssd-cache-capacity",    std::to_string(ssd),
                 "--ssd-shards", std::to_string(kSsdShards)};
  launch.socket = socket;
  launch.log_path = log_path;
  launch.metrics_port = static_cast<uint16_t>(f.metrics_port);
  launch.interrupted = &g_interrupted;
  Result<RunningManager> started = StartManager(launch);
  if (!started.ok()) {
    if (g_interrupted.load()) return 130;
    return Fail(std::string(started.status().message()));
  }
  Child mgr = std::move(started->child);
  const uint16_t metrics_port = started->metrics_port;

  const std::string model =
      w.bytes_per_token == kDefaultBytesPerToken
          ? fmt::format("{} layers x K/V x {} heads x {} dim x {} bytes = {} bytes/token", kLayers,
                        kHeads, kHeadDim, kDtypeBytes, kDefaultBytesPerToken)
          : fmt::format("{} bytes/token (--bytes-per-token)", w.bytes_per_token);
  std::printf("orbitkv-demo: (%u + %u hybrid) engines x %u users x %u rounds = %llu requests\n",
              w.engines, f.hybrid_engines, w.users, w.rounds,
              static_cast<unsigned long long>(total_requests));
  std::printf("  model      %s; block %u tokens = %s in %u slots (split layout)\n", model.c_str(),
              w.block_tokens, Bytes(double(block_bytes)).c_str(), w.slots);
  if (f.hybrid_engines) {
    const HybridModel h = DemoHybridModel(w);
    std::string groups;
    for (const GroupDescription& g : h.description.groups) {
      groups +=
          fmt::format("{}{} {}", groups.empty() ? "" : ", ", g.name,
                      g.kind == GroupKind::kFullAttention
                          ? fmt::format("(full attention, {} per block)", Bytes(double(g.bytes)))
                      : g.kind == GroupKind::kSlidingWindow
                          ? fmt::format("({}-token window, {} per block)", g.window_tokens,
                                        Bytes(double(g.bytes)))
                          : fmt::format("(recurrent state, {} every {} tokens)",
                                        Bytes(double(g.bytes)), g.checkpoint_interval_tokens));
    }
    std::printf("  hybrid     %u engine(s) register a model description: %s; own namespace\n",
                f.hybrid_engines, groups.c_str());
  }
  std::printf(
      "  prompts    system prompt %u tokens (shared by all users) + history %u tokens, growing "
      "by question %u + answer %u tokens per round\n",
      w.system_prompt_tokens, w.history_tokens, w.question_tokens, w.answer_tokens);
  std::printf("  compute    %s\n",
              f.compute_tokens_per_s > 0
                  ? fmt::format("simulated at {} tokens/s per engine for tokens not restored",
                                f.compute_tokens_per_s)
                        .c_str()
                  : "not paced (--compute-tokens-per-s 0)");
  std::printf("  data       ~%s blocks = %s distinct KV%s; largest request %llu blocks\n",
              fmt::format("{}", w.WorkingSetBlocks()).c_str(),
              Bytes(double(w.WorkingSetBlocks() * block_bytes)).c_str(),
              f.hybrid_engines
                  ? fmt::format(" + {} of the hybrid engines",
                                Bytes(double(working_set - w.WorkingSetBlocks() * block_bytes)))
                        .c_str()
                  : "",
              static_cast<unsigned long long>(w.MaxBlocksPerRequest()));
  std::printf("  pool       %s (%s)\n", FormatByteSize(pool).c_str(), pool_why.c_str());
  std::printf("  SSD        %s = %s at %s (%s)\n", FormatByteSize(ssd).c_str(),
              Bytes(double(ssd)).c_str(), cache.c_str(), ssd_why.c_str());
  std::printf("  Manager    %s (pid %d), socket %s, metrics http://127.0.0.1:%u/metrics, log %s\n",
              manager.c_str(), static_cast<int>(mgr.pid()), socket.c_str(), metrics_port,
              log_path.c_str());
  std::fflush(stdout);

  // ---- the engines ------------------------------------------------------------
  const auto start = std::chrono::steady_clock::now();
  std::vector<EngineProc> engines(all_engines);
  int exit_code = 0;
  std::string failure;
  for (uint32_t i = 0; i < all_engines; ++i) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Fail(std::string("pipe: ") + std::strerror(errno));
    SpawnOptions so;
    so.inherit_fds = {p[1]};
    Result<Child> c = Child::Spawn(EngineArgv(self, f, i, i >= w.engines, socket, p[1]), so);
    ::close(p[1]);
    if (!c.ok()) return Fail(c.status().ToString());
    engines[i].child = std::move(c).value();
    engines[i].fd = p[0];
  }

  Tally tally, hybrid_tally;
  const bool live = !f.no_progress && ::isatty(STDOUT_FILENO);
  Progress progress(total_requests, live,
                    live ? std::chrono::milliseconds(200) : std::chrono::milliseconds(2000));
  bool manager_died = false;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<EngineProc*> owners;
    for (EngineProc& e : engines) {
      if (e.fd >= 0) {
        fds.push_back({e.fd, POLLIN, 0});
        owners.push_back(&e);
      }
    }
    if (fds.empty() || g_interrupted.load()) break;
    int n = ::poll(fds.data(), fds.size(), 100);
    if (n > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        for (const std::string& l : ReadLines(*owners[i])) {
          EngineMessage m = DecodeLine(l);
          if (m.record) (m.record->hybrid ? hybrid_tally : tally).Add(*m.record);
          if (m.done) owners[i]->done = true;
          if (!m.error.empty()) owners[i]->error = m.error;
        }
      }
    }
    int st = 0;
    if (!manager_died && mgr.Poll(&st)) {
      manager_died = true;
      failure = "the Manager " + DescribeWaitStatus(st) + " during the run; see " + log_path;
      for (EngineProc& e : engines) e.child.Signal(SIGTERM);
    }
    progress.Update(tally, hybrid_tally);
  }
  progress.Finish(tally, hybrid_tally);
  if (g_interrupted.load()) {
    std::fprintf(stderr, "orbitkv-demo: interrupted; stopping the engines and the Manager\n");
    for (EngineProc& e : engines) e.child.Stop(SIGTERM, std::chrono::seconds(5));
    mgr.Stop(SIGTERM, std::chrono::seconds(30));
    return 130;
  }
  for (uint32_t i = 0; i < engines.size(); ++i) {
    EngineProc& e = engines[i];
    e.wait_status = e.child.Stop(SIGTERM, std::chrono::seconds(30));
    if (!e.error.empty() && failure.empty()) failure = fmt::format("engine {}: {}", i, e.error);
    if (!e.done && e.error.empty() && failure.empty()) {
      failure = fmt::format("engine {} {} without finishing", i, DescribeWaitStatus(e.wait_status));
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // ---- the Manager's view, the summary, shutdown ----------------------------
  std::optional<MetricsSnapshot> metrics;
  std::string metrics_error;
  if (!manager_died) {
    for (int i = 0; i < 10 && !metrics; ++i) {
      Result<MetricsSnapshot> m = ScrapeMetrics(metrics_port);
      if (m.ok()) {
        metrics = std::move(m).value();
      } else {
        metrics_error = m.status().ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  } else {
    metrics_error = "the Manager is gone";
  }
  SummaryInput in;
  in.shape = fmt::format("{} engines x {} users x {} rounds", w.engines, w.users, w.rounds);
  in.block_bytes = block_bytes;
  in.block_tokens = w.block_tokens;
  in.compute_tokens_per_s = f.compute_tokens_per_s;
  in.wall_seconds = wall;
  in.tally = &tally;
  in.hybrid = f.hybrid_engines ? &hybrid_tally : nullptr;
  in.hybrid_shape = fmt::format("{} hybrid engine(s) x {} users x {} rounds", f.hybrid_engines,
                                w.users, w.rounds);
  in.metrics = metrics ? &*metrics : nullptr;
  in.metrics_error = metrics_error;
  PrintSummary(stdout, in);

  if (!manager_died) {
    const int st = mgr.Stop(SIGTERM, std::chrono::seconds(30));
    if (ExitedZero(st)) {
      std::printf("  Manager            stopped with SIGTERM, exited 0\n");
    } else {
      std::printf("  Manager            stopped with SIGTERM, %s\n",
                  DescribeWaitStatus(st).c_str());
      if (failure.empty())
        failure = "the Manager " + DescribeWaitStatus(st) + " on SIGTERM; see " + log_path;
    }
  }
  std::fflush(stdout);
  if (tally.mismatched || hybrid_tally.mismatched) exit_code = kExitMismatch;
  if (!failure.empty()) {
    std::fprintf(stderr, "orbitkv-demo: FAILED: %s\n", failure.c_str());
    if (exit_code == 0) exit_code = kExitFailure;
  }
  if (tally.requests + hybrid_tally.requests != total_requests && exit_code == 0) {
    std::fprintf(stderr, "orbitkv-demo: FAILED: %llu of %llu requests reported\n",
                 static_cast<unsigned long long>(tally.requests + hybrid_tally.requests),
                 static_cast<unsigned long long>(total_requests));
    exit_code = kExitFailure;
  }
  return exit_code;
}

int Main(int argc, char** argv) {
  Flags f;
  WorkloadConfig& w = f.w;
  w.bytes_per_token = kDefaultBytesPerToken;
  CLI::App app{
      "orbitkv-demo: starts orbitkv-cache-manager on defaults sized to this machine and drives "
      "a multi-round conversation workload from engine processes on host pages; prints hit "
      "rates, bytes by tier and restore throughput. Exit status: 0 ok, 1 a restored block had "
      "wrong bytes, 2 bad flags, 3 another failure."};
  app.add_option("--engines", w.engines, "Engine processes")->capture_default_str();
  app.add_option("--hybrid-engines", f.hybrid_engines,
                 "Engine processes of a hybrid model (full attention + sliding window + "
                 "recurrent state checkpoints, registered with a model description), beside "
                 "--engines, each with --users users")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--users", w.users, "Users (conversations) per engine")->capture_default_str();
  app.add_option("--rounds", w.rounds, "Rounds per conversation")->capture_default_str();
  app.add_option("--system-prompt-tokens", w.system_prompt_tokens,
                 "System prompt, shared by every user of every engine")
      ->capture_default_str();
  app.add_option("--history-tokens", w.history_tokens, "Each user's history before round 0")
      ->capture_default_str();
  app.add_option("--question-tokens", w.question_tokens, "New question tokens per round")
      ->capture_default_str();
  app.add_option("--answer-tokens", w.answer_tokens, "Answer tokens per round")
      ->capture_default_str();
  app.add_option("--block-tokens", w.block_tokens, "Tokens per KV block")->capture_default_str();
  app.add_option("--bytes-per-token", w.bytes_per_token,
                 "KV bytes per token (default: 2 layers x K/V x 8 heads x 64 dim x 2 bytes)")
      ->capture_default_str();
  app.add_option("--pool-size", f.pool_size,
                 "Manager DRAM pool (default: ~1/3 of the working set, at most min(512mib, "
                 "RAM/16))");
  app.add_option("--ssd-capacity", f.ssd_capacity,
                 "Manager SSD cache capacity (default: min(4gb, 1/4 of the state dir's free "
                 "space))");
  app.add_option("--state-dir", f.state_dir,
                 "Socket, SSD cache and Manager log (default: $ORBITKV_DEMO_DIR or "
                 "${XDG_CACHE_HOME:-$HOME/.cache}/orbitkv-demo)");
  app.add_option("--manager", f.manager,
                 "orbitkv-cache-manager binary (default: $ORBITKV_MANAGER_BINARY or "
                 "../server/orbitkv-cache-manager next to this binary)");
  app.add_option("--metrics-port", f.metrics_port,
                 "Manager /metrics port on 127.0.0.1 (default 0: a free ephemeral port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--compute-tokens-per-s", f.compute_tokens_per_s,
                 "Simulated model compute per engine: tokens whose KV is not restored cost "
                 "1/rate s each (0: no pacing; the SSD writeback then falls behind)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", w.seed, "Seed of token ids and KV bytes")->capture_default_str();
  app.add_flag("--no-progress", f.no_progress,
               "No live progress line; print a plain progress line every 2 s");
  app.add_flag("--engine-role", f.engine_role)->group("");
  app.add_option("--hybrid-role", f.hybrid_role)->group("");
  app.add_option("--engine-index", f.engine_index)->group("");
  app.add_option("--socket", f.socket)->group("");
  app.add_option("--report-fd", f.report_fd)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitFlags;
  }
  if (Status st = w.Validate(); !st.ok()) {
    std::fprintf(stderr, "orbitkv-demo: %s\n", std::string(st.message()).c_str());
    return kExitFlags;
  }
  if (f.engine_role) {
    signal(SIGPIPE, SIG_IGN);
    if (f.report_fd < 0 || f.engine_index >= w.engines + f.hybrid_engines || f.socket.empty()) {
      std::fprintf(stderr,
                   "orbitkv-demo: --engine-role needs --engine-index, --socket and "
                   "--report-fd\n");
      return kExitFlags;
    }
    EngineOptions o;
    o.workload = w;
    o.index = f.engine_index;
    o.hybrid = f.hybrid_role;
    o.socket_path = f.socket;
    o.report_fd = f.report_fd;
    o.compute_tokens_per_s = f.compute_tokens_per_s;
    return RunEngine(o);
  }
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) self = argv[0];
  return RunDemo(f, self);
}

}  // namespace
}  // namespace orbitkv::demo

int main(int argc, char** argv) { return orbitkv::demo::Main(argc, argv); }
