// Cross-process integration test: a real orbitkv-cache-manager process, engine
// processes (orbitkv-test-engine, engine_client.cc) and this process as a
// further client, all over the Manager's Unix socket; gauges are read by
// scraping the Manager's /metrics over HTTP. The scenarios mirror
// src/manager/manager_test.cc across process boundaries:
//
//   DramRestoresByteExactAcrossProcesses   split / page-first, unaligned slots
//   SsdRestoresAfterEvictionAndEngineRestart
//   FragmentedAndMultiWriterPublication
//   CancelBeforeAndAfterSubmission         busy SSD reader, CancelRestore(ticket)
//   KilledClientMidRestoreReleasesEverything
//   ManagerRestartStartsEmptyAndOldClientsFail
//   HostileMessagesGetErrorsAndManagerKeepsServing
//
// Binaries come from $ORBITKV_MANAGER_BINARY and $ORBITKV_TEST_ENGINE_BINARY
// (set by tests/CMakeLists.txt). Temp files live under $TMPDIR or /var/tmp.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "engine_common.h"
#include "orbitkv/client.h"
#include "process_harness.h"
#include "protocol/frame.h"
#include "protocol/orbitkv_generated.h"
#include "protocol/wire.h"
#include "testing/host_pages.h"
#include "testing/temp_dir.h"

extern char** environ;

namespace orbitkv::integration {
namespace {

// A field of /proc/<pid>/status ("VmRSS" in kB, "Threads"), or -1.
int64_t ProcStatusField(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// The Manager under test is built in the same tree, so with the same
// ORBITKV_SANITIZE. Its RSS then says little about its own buffers: ASan adds
// shadow memory and keeps freed chunks in a quarantine (up to 256 MiB) instead
// of returning them, TSan's shadow grows with every byte touched.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizedBuild = true;
#else
constexpr bool kSanitizedBuild = false;
#endif
#else
constexpr bool kSanitizedBuild = false;
#endif

// SIGSTOP, then waits until every thread of `pid` is stopped (the signal is
// asynchronous). False if that does not happen within 5 s.
bool StopProcess(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (auto deadline = Clock::now() + 5s; Clock::now() < deadline;
       std::this_thread::sleep_for(2ms)) {
    bool all = true;
    for (const auto& t : std::filesystem::directory_iterator(tasks)) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');
      const char state =
          paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
      all = all && (state == 'T' || state == 't');
    }
    if (all) return true;
  }
  return false;
}

// Raises this process's RLIMIT_NOFILE (soft, and hard when root) to at least
// `want`; the Manager processes it starts inherit it. False if it cannot.
bool RaiseNofile(rlim_t want) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
  if (r.rlim_cur >= want) return true;
  if (r.rlim_max < want) r.rlim_max = want;  // root only
  r.rlim_cur = want;
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0;
}

// ---- raw protocol connections (hostile clients) -----------------------------------------

class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    timeval tv{5, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_.get(); }

  bool SendRaw(const void* data, size_t len) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    while (len > 0) {
      const ssize_t n = ::send(fd_.get(), p, len, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      len -= static_cast<size_t>(n);
    }
    return true;
  }
  Status Send(const std::vector<uint8_t>& payload, std::span<const int> fds = {}) {
    return protocol::SendFrame(fd_.get(), payload, fds);
  }

  enum class Outcome { kReply, kClosed, kTimeout, kUndecodable };
  struct Reply {
    Outcome outcome = Outcome::kTimeout;
    protocol::DecodedMessage msg;
    std::string why;
  };
  Reply Recv() {
    Reply r;
    Result<protocol::Frame> f = protocol::RecvFrame(fd_.get(), 64u << 20, 0);
    if (!f.ok()) {
      r.why = f.status().ToString();
      r.outcome =
          f.status().code() == StatusCode::kDeadlineExceeded ? Outcome::kTimeout : Outcome::kClosed;
      return r;
    }
    Result<protocol::DecodedMessage> m = protocol::DecodeMessage(f->payload);
    if (!m.ok()) {
      r.outcome = Outcome::kUndecodable;
      r.why = m.status().ToString();
      return r;
    }
    r.outcome = Outcome::kReply;
    r.msg = std::move(m).value();
    return r;
  }
  // True if the server closes the connection within the receive timeout.
  bool WaitClosed() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno == ECONNRESET || errno == EPIPE;
    }
  }

 private:
  UniqueFd fd_;
  bool connected_ = false;
};

// The reply to request `id` must be an ErrorReply (or the server may close the
// connection). Sets *closed when it did.
::testing::AssertionResult ErrorOrClosed(RawConn& c, uint64_t id, const std::string& what,
                                         bool* closed = nullptr) {
  RawConn::Reply r = c.Recv();
  if (closed) *closed = r.outcome == RawConn::Outcome::kClosed;
  switch (r.outcome) {
    case RawConn::Outcome::kClosed:
      return ::testing::AssertionSuccess() << what << ": connection closed";
    case RawConn::Outcome::kTimeout:
      return ::testing::AssertionFailure() << what << ": no reply within 5 s (" << r.why << ")";
    case RawConn::Outcome::kUndecodable:
      return ::testing::AssertionFailure() << what << ": undecodable reply: " << r.why;
    case RawConn::Outcome::kReply:
      break;
  }
  const auto* err = std::get_if<protocol::ErrorReply>(&r.msg.body);
  if (err == nullptr) {
    return ::testing::AssertionFailure()
           << what << ": got " << protocol::MessageName(r.msg.body) << ", want an ErrorReply";
  }
  if (err->status.ok()) return ::testing::AssertionFailure() << what << ": OK ErrorReply";
  if (r.msg.id != id && r.msg.id != 0) {
    return ::testing::AssertionFailure()
           << what << ": error addressed to id " << r.msg.id << ", sent " << id;
  }
  return ::testing::AssertionSuccess() << what << ": " << err->status.ToString();
}

// The reply to request `id` must be a T.
template <typename T>
std::optional<T> ExpectReply(RawConn& c, uint64_t id, const std::string& what) {
  RawConn::Reply r = c.Recv();
  if (r.outcome != RawConn::Outcome::kReply) {
    ADD_FAILURE() << what << ": no reply (" << r.why << ")";
    return std::nullopt;
  }
  if (const auto* err = std::get_if<protocol::ErrorReply>(&r.msg.body)) {
    ADD_FAILURE() << what << ": error " << err->status.ToString();
    return std::nullopt;
  }
  if (r.msg.id != id) ADD_FAILURE() << what << ": reply id " << r.msg.id << ", sent " << id;
  const T* t = std::get_if<T>(&r.msg.body);
  if (t == nullptr) {
    ADD_FAILURE() << what << ": got " << protocol::MessageName(r.msg.body);
    return std::nullopt;
  }
  return *t;
}

// Hello + Register of `layout` in namespace `ns` on a raw connection.
std::optional<InstanceId> RawRegister(RawConn& c, const std::string& ns,
                                      const InstanceLayout& layout, testing::HostPages& pages,
                                      uint64_t* id) {
  protocol::HelloRequest hello;
  hello.client_pid = ::getpid();
  hello.client_name = "raw-" + ns;
  if (!c.Send(protocol::EncodeRequest(++*id, hello)).ok()) return std::nullopt;
  if (!ExpectReply<protocol::HelloReply>(c, *id, "Hello")) return std::nullopt;
  RegisterRequest rr;
  rr.ns = ns;
  rr.layout = layout;
  if (!c.Send(protocol::EncodeRequest(++*id, rr), pages.fds()).ok()) return std::nullopt;
  std::optional<protocol::RegisterReply> r =
      ExpectReply<protocol::RegisterReply>(c, *id, "Register");
  if (!r) return std::nullopt;
  return r->instance;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// ---- fixture ----------------------------------------------------------------------------

class ManagerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manager_bin_ = BinaryFromEnv("ORBITKV_MANAGER_BINARY");
    engine_bin_ = BinaryFromEnv("ORBITKV_TEST_ENGINE_BINARY");
    // Not a skip: without the binaries this test checks nothing.
    ASSERT_FALSE(manager_bin_.empty()) << "set ORBITKV_MANAGER_BINARY (ctest does)";
    ASSERT_FALSE(engine_bin_.empty()) << "set ORBITKV_TEST_ENGINE_BINARY (ctest does)";
    ASSERT_EQ(::access(manager_bin_.c_str(), X_OK), 0) << manager_bin_;
    ASSERT_EQ(::access(engine_bin_.c_str(), X_OK), 0) << engine_bin_;
    socket_ = dir_.File("mgr.sock");
    ssd_path_ = dir_.File("cache.bin");
  }
  void TearDown() override {
    if (!mgr_) return;
    if (mgr_->Running()) {
      EXPECT_TRUE(mgr_->Stop());
    } else if (!mgr_->stopped_by_test()) {
      ADD_FAILURE() << "the Manager died during the test ("
                    << DescribeStatus(mgr_->proc().WaitExit(0ms)) << "): " << mgr_->proc().Tail();
    }
  }

  // Starts (or restarts) the Manager on the test's socket and SSD path.
  void StartManager(const ManagerFlags& f) {
    mgr_ = std::make_unique<ManagerProc>(manager_bin_, socket_, ssd_path_, f);
    ASSERT_TRUE(mgr_->ok()) << mgr_->error();
  }

  std::vector<std::string> EngineArgv(const std::string& cmd,
                                      const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {engine_bin_, cmd, "--socket", socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  std::unique_ptr<Proc> StartEngine(const std::string& cmd, const std::vector<std::string>& args) {
    return std::make_unique<Proc>("engine " + cmd, EngineArgv(cmd, args));
  }
  static EngineRun Finish(Proc& p, std::chrono::milliseconds timeout = 60s) {
    EngineRun r;
    std::optional<int> st = p.WaitExit(timeout);
    if (!st) p.Signal(SIGKILL);
    if (st && WIFEXITED(*st)) r.rc = WEXITSTATUS(*st);
    p.WaitEof(5s);
    r.out = p.Output() + (st ? "" : "\n[killed: timed out]");
    if (st && !WIFEXITED(*st)) r.out += "\n[" + DescribeStatus(st) + "]";
    return r;
  }
  EngineRun Engine(const std::string& cmd, const std::vector<std::string>& args,
                   std::chrono::milliseconds timeout = 60s) {
    std::unique_ptr<Proc> p = StartEngine(cmd, args);
    if (!p->started()) return {-1, p->error()};
    return Finish(*p, timeout);
  }

  std::unique_ptr<Client> Connect(std::chrono::milliseconds timeout = 20000ms) {
    ClientConfig cc;
    cc.socket_path = socket_;
    cc.timeout = timeout;
    cc.client_name = "manager_process_test";
    Result<std::unique_ptr<Client>> c = Client::Connect(cc);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  void ExpectReleased(std::chrono::milliseconds timeout = 15s) {
    EXPECT_TRUE(mgr_->GaugesReachZero(kReleaseGauges, timeout)) << mgr_->proc().Tail(1500);
  }

  std::string manager_bin_, engine_bin_;
  testing::TempDir dir_;
  std::string socket_, ssd_path_;
  std::unique_ptr<ManagerProc> mgr_;
};

#define EXPECT_ENGINE_OK(run) EXPECT_EQ((run).rc, 0) << (run).out

// ---- 1 + 4: DRAM restores across processes, split and page-first, unaligned slots ------

TEST_F(ManagerProcessTest, DramRestoresByteExactAcrossProcesses) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib"}));
  // Unaligned components: multiples of neither 512 nor 4096.
  const std::string slots = "1000,333,4096,70";
  for (const std::string layout : {"split", "page-first"}) {
    SCOPED_TRACE(layout);
    const std::string ns = "dram-" + layout;
    const std::vector<std::string> common = {"--ns", ns,        "--layout", layout,   "--slots",
                                             slots,  "--pages", "32",       "--seed", "11"};
    auto with = [&](std::vector<std::string> more) {
      std::vector<std::string> a = common;
      a.insert(a.end(), more.begin(), more.end());
      return a;
    };
    // Client A publishes 8 blocks from pages 0..7.
    EngineRun a = Engine("publish", with({"--keys", "0..8"}));
    EXPECT_ENGINE_OK(a);
    EXPECT_EQ(Field(a.out, "publish", "sealed"), 8) << a.out;
    EXPECT_EQ(Field(a.out, "publish", "skipped"), 0) << a.out;
    EXPECT_EQ(Field(a.out, "publish", "dropped"), 0) << a.out;
    // Client B, another process with its own pages, restores them into pages 16..23.
    EngineRun b = Engine("restore-verify",
                         with({"--keys", "0..8", "--expect-source", "dram", "--dst-page", "16"}));
    EXPECT_ENGINE_OK(b);
    EXPECT_EQ(Field(b.out, "restore", "verified"), 8) << b.out;
    EXPECT_EQ(StrField(b.out, "restore", "sources"), "DDDDDDDD") << b.out;
    // The other layout restores the same namespace's objects byte-exact too
    // (the group shape, not the memory layout, is per namespace).
    const std::string other = layout == "split" ? "page-first" : "split";
    std::vector<std::string> cross = with({"--keys", "2..6", "--dst-page", "24"});
    cross[3] = other;
    EngineRun c = Engine("restore-verify", cross);
    EXPECT_ENGINE_OK(c);
    EXPECT_EQ(Field(c.out, "restore", "verified"), 4) << c.out;
    // Control: the verifier notices wrong bytes (another seed).
    std::vector<std::string> wrong = with({"--keys", "0..2"});
    wrong[9] = "12";
    EngineRun d = Engine("restore-verify", wrong);
    EXPECT_EQ(d.rc, 1) << "the verifier must reject other bytes:\n" << d.out;
    // Another namespace sees nothing.
    std::vector<std::string> foreign = with({"--keys", "0..8", "--expect-prefix", "0"});
    foreign[1] = ns + "-other";
    EngineRun e = Engine("restore-verify", foreign);
    EXPECT_ENGINE_OK(e);
  }
  // The socket loop's polling after activity is on /metrics: some of the
  // engines' requests, never more than all of them (whether any arrived
  // within the window depends on the scheduler; server_test checks that).
  std::string err;
  std::optional<Metrics> m = mgr_->Scrape(&err);
  ASSERT_TRUE(m) << err;
  const std::optional<double> polled = m->Get("orbitkv_protocol_frames_polled_total");
  ASSERT_TRUE(polled.has_value());
  EXPECT_LE(*polled, m->Get("orbitkv_protocol_requests_total").value_or(0));
  // Request latency inside the Manager, by op: every Query the engines sent
  // was timed from its last byte read (a handler still returning when the
  // scrape came may be missing from the end-to-end series, never from the
  // wait, which is observed first).
  auto series = [&](const std::string& key) {
    auto it = m->series.find(key);
    return it == m->series.end() ? -1.0 : it->second;
  };
  const double queries = series("orbitkv_request_seconds_count{op=\"Query\"}");
  EXPECT_GT(queries, 0);
  EXPECT_GT(series("orbitkv_request_seconds_sum{op=\"Query\"}"), 0);
  EXPECT_GE(series("orbitkv_request_wait_seconds_count{op=\"Query\"}"), queries);
  EXPECT_GT(series("orbitkv_request_seconds_count{op=\"RegisterInstance\"}"), 0);
  EXPECT_LE(m->Get("orbitkv_request_wait_seconds_count").value_or(0),
            m->Get("orbitkv_protocol_requests_total").value_or(0));
  ExpectReleased();
}

// The client's spin (ClientConfig::spin_wait) comes from ORBITKV_CLIENT_SPIN_US
// where the config leaves it unset: 0 (no spin: the reader thread delivers
// every reply) serves engine processes byte-exact, and a value that is not
// 0..10000 us fails Connect, naming the variable, before anything is sent.
TEST_F(ManagerProcessTest, ClientSpinComesFromTheEnvironmentAndIsChecked) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib"}));
  struct Env {  // restores the variable's absence (the suite does not set it)
    explicit Env(const char* v) { ::setenv(kClientSpinEnv, v, 1); }
    ~Env() { ::unsetenv(kClientSpinEnv); }
  };
  {
    Env off("0");
    const std::vector<std::string> args = {"--ns",     "spin-off", "--layout", "split",  "--slots",
                                           "1000,333", "--pages",  "16",       "--keys", "0..6"};
    EngineRun a = Engine("publish", args);
    EXPECT_ENGINE_OK(a);
    std::vector<std::string> restore = args;
    for (const char* flag : {"--expect-source", "dram", "--dst-page", "8"}) restore.push_back(flag);
    EngineRun b = Engine("restore-verify", restore);
    EXPECT_ENGINE_OK(b);
    EXPECT_EQ(Field(b.out, "restore", "verified"), 6) << b.out;
  }
  ClientConfig cc;
  cc.socket_path = socket_;
  for (const char* bad : {"fast", "", "-5", "10001", "12us"}) {
    Env e(bad);
    Result<std::unique_ptr<Client>> c = Client::Connect(cc);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
    EXPECT_NE(c.status().message().find(kClientSpinEnv), std::string_view::npos)
        << c.status().ToString();
  }
  {
    Env ignored("fast");  // the config's own setting wins over the environment
    cc.spin_wait = std::chrono::microseconds(200);
    Result<std::unique_ptr<Client>> c = Client::Connect(cc);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
  }
  cc.spin_wait = std::chrono::milliseconds(20);
  Result<std::unique_ptr<Client>> over = Client::Connect(cc);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument) << over.status().ToString();
  ExpectReleased();
}

// ---- 2 + 3: SSD after DRAM eviction; a new engine process finds the same keys ----------

TEST_F(ManagerProcessTest, SsdRestoresAfterEvictionAndEngineRestart) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "2mib", .shards = 2}));
  // 64 KiB objects (two slots, one unaligned); 96 of them in a 2 MiB pool.
  const std::vector<std::string> common = {"--ns",    "ssd", "--slots", "32768,32668",
                                           "--pages", "96",  "--seed",  "21"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = common;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  EngineRun a = Engine("publish", with({"--keys", "0..96", "--retry-ms", "20000"}));
  EXPECT_ENGINE_OK(a);
  EXPECT_EQ(Field(a.out, "publish", "sealed"), 96) << a.out;
  EXPECT_EQ(Field(a.out, "publish", "skipped"), 0) << a.out;
  EXPECT_EQ(Field(a.out, "publish", "dropped"), 0) << a.out;

  // The first blocks were evicted after writeback: another process restores them from SSD.
  EngineRun b = Engine("restore-verify", with({"--keys", "0..8", "--wait-source", "ssd",
                                               "--expect-source", "ssd", "--dst-page", "80"}));
  EXPECT_ENGINE_OK(b);
  EXPECT_EQ(StrField(b.out, "restore", "sources"), "SSSSSSSS") << b.out;
  EXPECT_EQ(Field(b.out, "restore", "verified"), 8) << b.out;
  std::string err;
  std::optional<Metrics> m = mgr_->Scrape(&err);
  ASSERT_TRUE(m) << err;
  EXPECT_GT(m->Get("orbitkv_pool_evictions_total").value_or(0), 0);
  EXPECT_GT(m->series["orbitkv_cache_hits_total{tier=\"ssd\"}"], 0);
  EXPECT_GT(m->series["orbitkv_bytes_total{route=\"restore_ssd_uring\"}"], 0);

  // The engine restarts: a new process with the same keys finds them cached
  // (publishing again stores nothing) and restores them byte-exact, from
  // whichever tier holds them now.
  EngineRun again = Engine("publish", with({"--keys", "0..96"}));
  EXPECT_ENGINE_OK(again);
  EXPECT_EQ(Field(again.out, "publish", "skipped"), 96) << again.out;
  EXPECT_EQ(Field(again.out, "publish", "dropped"), 0) << again.out;
  EXPECT_EQ(Field(again.out, "publish", "sealed"), 0) << again.out;
  EngineRun c = Engine("restore-verify", with({"--keys", "8..24", "--dst-page", "0"}));
  EXPECT_ENGINE_OK(c);
  EXPECT_EQ(Field(c.out, "restore", "verified"), 16) << c.out;
  EngineRun d = Engine("restore-verify", with({"--keys", "84..96", "--dst-page", "0"}));
  EXPECT_ENGINE_OK(d);
  EXPECT_EQ(Field(d.out, "restore", "verified"), 12) << d.out;
  ExpectReleased();
}

// ---- 5: fragmented publication, one process and two (a multi-writer group) --------------

TEST_F(ManagerProcessTest, FragmentedAndMultiWriterPublication) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib"}));
  const std::vector<std::string> frag = {"--ns",    "frag", "--slots", "512,1000,7",
                                         "--pages", "16",   "--seed",  "31"};
  auto with = [](std::vector<std::string> a, std::vector<std::string> more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  // One process, slot subsets in separate Publish calls: sealed by the last.
  EngineRun a = Engine("publish", with(frag, {"--keys", "0..4", "--fragments", "0;2;1"}));
  EXPECT_ENGINE_OK(a);
  EXPECT_EQ(Field(a.out, "fragment=0", "sealed"), 0) << a.out;
  EXPECT_EQ(Field(a.out, "fragment=1", "sealed"), 0) << a.out;
  EXPECT_EQ(Field(a.out, "fragment=2", "sealed"), 4) << a.out;
  EngineRun av = Engine("restore-verify", with(frag, {"--keys", "0..4"}));
  EXPECT_ENGINE_OK(av);
  EXPECT_EQ(Field(av.out, "restore", "verified"), 4) << av.out;

  // Fragments from two processes: invisible until the last part arrives. The
  // first writer stays connected: a writer's unsealed fragments go with its session.
  std::unique_ptr<Proc> b1 = StartEngine(
      "publish", with(frag, {"--keys", "8..12", "--fragments", "1", "--linger-ms", "60000"}));
  ASSERT_TRUE(b1->WaitOutput("@ publish", 20s)) << b1->Tail();
  EXPECT_EQ(Field(b1->Output(), "publish", "stored"), 4) << b1->Output();
  EXPECT_EQ(Field(b1->Output(), "publish", "sealed"), 0) << b1->Output();
  EngineRun bq = Engine("query", with(frag, {"--keys", "8..12"}));
  EXPECT_ENGINE_OK(bq);
  EXPECT_EQ(Field(bq.out, "query", "prefix"), 0) << "visible while assembling:\n" << bq.out;
  EngineRun b2 = Engine("publish", with(frag, {"--keys", "8..12", "--fragments", "2,0"}));
  EXPECT_ENGINE_OK(b2);
  EXPECT_EQ(Field(b2.out, "publish", "sealed"), 4) << b2.out;
  EngineRun bv =
      Engine("restore-verify", with(frag, {"--keys", "8..12", "--expect-source", "dram"}));
  EXPECT_ENGINE_OK(bv);
  EXPECT_EQ(Field(bv.out, "restore", "verified"), 4) << bv.out;
  b1->Signal(SIGKILL);

  // A fragment writer killed before the group is complete: its assemblies are
  // aborted at once (not after the 60 s assembly timeout) and their pool bytes return.
  std::unique_ptr<Proc> dead = StartEngine(
      "publish", with(frag, {"--keys", "20..24", "--fragments", "0", "--linger-ms", "60000"}));
  ASSERT_TRUE(dead->WaitOutput("@ publish", 20s)) << dead->Tail();
  EXPECT_TRUE(mgr_->WaitGaugeAtLeast("orbitkv_pool_assembling_objects", 4, 5s));
  dead->Signal(SIGKILL);
  EXPECT_TRUE(mgr_->GaugesReachZero({"orbitkv_pool_assembling_objects"}, 5s));
  EXPECT_TRUE(mgr_->WaitGaugeAtLeast("orbitkv_assemblies_aborted_total", 4, 5s));

  // A TP=2 group: rank 0 holds slots 0-1 (split), rank 1 slots 2-3 (page-first).
  const std::vector<std::string> r0 = {
      "--ns",         "tp2", "--rank",  "0",  "--slots", "600,600,900,900",
      "--hold-slots", "0,1", "--pages", "16", "--seed",  "41"};
  const std::vector<std::string> r1 = {
      "--ns", "tp2",      "--rank",     "1",       "--slots", "600,600,900,900", "--hold-slots",
      "2,3",  "--layout", "page-first", "--pages", "16",      "--seed",          "41"};
  // Sequential: rank 0's half stays invisible until rank 1 publishes its half.
  std::unique_ptr<Proc> p0 =
      StartEngine("publish", with(r0, {"--keys", "0..3", "--linger-ms", "60000"}));
  ASSERT_TRUE(p0->WaitOutput("@ publish", 20s)) << p0->Tail();
  EXPECT_EQ(Field(p0->Output(), "publish", "sealed"), 0) << p0->Output();
  EngineRun q0 = Engine("query", with(r1, {"--keys", "0..3"}));
  EXPECT_EQ(Field(q0.out, "query", "prefix"), 0) << "visible with half the slots:\n" << q0.out;
  EngineRun p1 = Engine("publish", with(r1, {"--keys", "0..3"}));
  EXPECT_ENGINE_OK(p1);
  EXPECT_EQ(Field(p1.out, "publish", "sealed"), 3) << p1.out;
  p0->Signal(SIGKILL);
  // Concurrent: both ranks publish at once (and stay, as ranks do); together
  // they seal every block.
  std::unique_ptr<Proc> c0 = StartEngine(
      "publish", with(r0, {"--keys", "10..16", "--page-base", "4", "--linger-ms", "60000"}));
  std::unique_ptr<Proc> c1 = StartEngine(
      "publish", with(r1, {"--keys", "10..16", "--page-base", "4", "--linger-ms", "60000"}));
  ASSERT_TRUE(c0->WaitOutput("@ publish", 20s)) << c0->Tail();
  ASSERT_TRUE(c1->WaitOutput("@ publish", 20s)) << c1->Tail();
  EXPECT_EQ(Field(c0->Output(), "publish", "sealed") + Field(c1->Output(), "publish", "sealed"), 6)
      << c0->Output() << c1->Output();
  c0->Signal(SIGKILL);
  c1->Signal(SIGKILL);
  // Each rank restores its own slots, in its own process, byte-exact.
  for (const auto& rank : {r0, r1}) {
    for (const std::string keys : {"0..3", "10..16"}) {
      EngineRun v = Engine("restore-verify", with(rank, {"--keys", keys, "--dst-page", "8"}));
      EXPECT_ENGINE_OK(v);
      EXPECT_GT(Field(v.out, "restore", "verified"), 0) << v.out;
    }
  }
  ExpectReleased();
  // No assembly is left half done.
  EXPECT_TRUE(mgr_->GaugesReachZero({"orbitkv_pool_assembling_objects"}, 5s));
}

// ---- 6: cancellation before and after submission --------------------------------------

// A Manager whose SSD reads are slow to finish: one reader, queue depth 1, one
// shard, and small objects read one by one (every other key, so no two
// extents are adjacent and nothing coalesces).
const ManagerFlags kSlowReader{
    .pool = "4mib", .ssd_capacity = "64mib", .shards = 1, .io_workers = 1, .queue_depth = 1};
constexpr int kSmallKeys = 3000;
const std::vector<std::string> kSmall = {"--ns",    "small", "--slots", "3000",
                                         "--pages", "3000",  "--seed",  "51"};

class SlowReaderProcessTest : public ManagerProcessTest {
 protected:
  // A kSlowReader Manager holding kSmall's keys 0..kSmallKeys-1, published by an
  // engine process and all written back (objects awaiting writeback cannot be
  // evicted; SSD reads need the pool for scratch).
  void StartWithSmallKeysOnSsd() {
    ASSERT_NO_FATAL_FAILURE(StartManager(kSlowReader));
    std::vector<std::string> pub = kSmall;
    for (const char* a : {"--keys", "0..3000", "--retry-ms", "60000"}) pub.push_back(a);
    EngineRun p = Engine("publish", pub, 120s);
    ASSERT_EQ(p.rc, 0) << p.out;
    ASSERT_EQ(Field(p.out, "publish", "sealed"), kSmallKeys) << p.out;
    ASSERT_TRUE(mgr_->GaugesReachZero({"orbitkv_pool_writeback_pending"}, 60s));
  }
};

TEST_F(SlowReaderProcessTest, CancelBeforeAndAfterSubmission) {
  ASSERT_NO_FATAL_FAILURE(StartWithSmallKeysOnSsd());

  // This process is the second client: its own pages, the same namespace.
  std::unique_ptr<Client> c = Connect();
  ASSERT_TRUE(c);
  LayoutSpec spec;
  spec.slot_bytes = {3000};
  spec.pages = kSmallKeys;
  InstanceLayout layout = BuildLayout(spec);
  testing::HostPages pages(layout);
  RegisterRequest rr;
  rr.ns = "small";
  rr.layout = layout;
  Result<InstanceId> inst = c->RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(inst.ok()) << inst.status().ToString();
  auto query = [&](const std::vector<uint64_t>& keys) {
    QueryRequest q;
    q.instance = *inst;
    for (uint64_t k : keys) q.keys.push_back(KeyOf(k));
    Result<QueryResult> r = c->Query(q);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : QueryResult{};
  };

  // A: a large SSD restore that keeps the only reader busy. B: queued behind it.
  // B is cancelled before submission (its blocks report Cancelled); A is
  // cancelled after submission and completes normally. Timing decides whether
  // B really waited behind A; an attempt where A finished first proves
  // nothing and is repeated on fresh keys with a larger A.
  bool conclusive = false;
  uint64_t base = 0;
  for (int attempt = 0; attempt < 3 && !conclusive; ++attempt) {
    const uint64_t span = 300 + 200 * attempt;  // A: keys base, base+2, ... (span/2 blocks)
    std::vector<uint64_t> a_keys;
    for (uint64_t k = base; k < base + span; k += 2) a_keys.push_back(k);
    const uint64_t b_key = base + 1;
    base += span;
    QueryResult qa = query(a_keys);
    QueryResult qb = query({b_key});
    ASSERT_EQ(qa.prefix, a_keys.size());
    ASSERT_EQ(qb.prefix, 1u);
    size_t a_ssd = 0;
    for (Tier t : qa.sources) a_ssd += t == Tier::kSsd;
    ASSERT_EQ(qb.sources[0], Tier::kSsd) << "key " << b_key << " should have been evicted";
    RestoreRequest ra{*inst, qa.query, {}, {}}, rb{*inst, qb.query, {0}, {kSmallKeys - 1}};
    for (uint32_t i = 0; i < a_keys.size(); ++i) {
      ra.blocks.push_back(i);
      ra.pages.push_back(1200 + i);
      pages.Clear(0, 1200 + i);
    }
    pages.Clear(0, kSmallKeys - 1);
    const uint64_t ta = c->NewTicket(), tb = c->NewTicket();
    std::optional<Result<RestoreResult>> a_res, b_res;
    int64_t a_ms = 0;
    std::thread a_thread([&] {
      const auto t0 = Clock::now();
      a_res.emplace(c->Restore(ra, ta));
      a_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    });
    // Order the requests by watching the Manager count them in flight: A
    // first, then B, then the cancels (threads alone could be reordered).
    EXPECT_TRUE(mgr_->WaitGaugeAtLeast("orbitkv_restores_inflight", 1, 5s));
    std::thread b_thread([&] { b_res.emplace(c->Restore(rb, tb)); });
    const bool both = mgr_->WaitGaugeAtLeast("orbitkv_restores_inflight", 2, 5s);
    Result<bool> cb = c->CancelRestore(tb);  // from a thread other than B's
    Result<bool> ca = c->CancelRestore(ta);
    a_thread.join();
    b_thread.join();
    ASSERT_TRUE(cb.ok()) << cb.status().ToString();
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    ASSERT_TRUE(a_res->ok()) << a_res->status().ToString();
    ASSERT_TRUE(b_res->ok()) << b_res->status().ToString();
    const Status& b_status = (*b_res)->blocks.at(0).status;
    size_t a_ok = 0, a_cancelled = 0, a_verified = 0;
    std::map<std::string, int> a_errors;
    for (const BlockResult& br : (*a_res)->blocks) {
      a_ok += br.status.ok();
      a_cancelled += br.status.IsCancelled();
      if (!br.status.ok() && !br.status.IsCancelled()) a_errors[br.status.ToString()]++;
      if (br.status.ok() && pages.Holds(0, 1200 + br.block, SeedOf(51, a_keys[br.block]))) {
        ++a_verified;
      }
    }
    std::printf(
        "attempt %d: A %zu blocks (%zu from SSD) in %lld ms: %zu ok, %zu cancelled, "
        "cancel(A)=%d; B: %s, cancel(B)=%d; A and B seen in flight together: %d\n",
        attempt, a_keys.size(), a_ssd, static_cast<long long>(a_ms), a_ok, a_cancelled, int(*ca),
        b_status.ToString().c_str(), int(*cb), int(both));
    // Whatever the timing, no block may be lost or damaged.
    for (const auto& [what, n] : a_errors) ADD_FAILURE() << n << " blocks of A failed: " << what;
    EXPECT_EQ(a_verified, a_ok) << "restored blocks with wrong bytes";
    if (!b_status.IsCancelled()) {
      EXPECT_TRUE(b_status.ok()) << b_status.ToString();
      EXPECT_TRUE(pages.Holds(0, kSmallKeys - 1, SeedOf(51, b_key)));
      continue;  // B ran before the cancel: inconclusive
    }
    // B was cancelled before submission: released, page untouched, reply says so.
    EXPECT_TRUE(*cb) << "CancelRestore(B) released B but returned false";
    const uint8_t* bp = pages.Slot(0, 0, kSmallKeys - 1);
    EXPECT_TRUE(std::all_of(bp, bp + 3000, [](uint8_t x) { return x == 0; }))
        << "a cancelled block wrote the page";
    if (a_cancelled != 0) continue;  // A had not been submitted yet either: inconclusive
    // A was submitted when cancelled: it completed normally, byte-exact.
    EXPECT_EQ(a_ok, a_keys.size());
    conclusive = true;
    // client.h: CancelRestore is "True if something not yet submitted was
    // released". Nothing of A was, so the answer must be false.
    EXPECT_FALSE(*ca) << "BUG: CancelRestore(A) returned true although A was already submitted "
                         "and completed every block: include/orbitkv/client.h:38 promises 'True "
                         "if something not yet submitted was released', but "
                         "src/server/service.cc:122 answers 'found in flight' "
                         "(Manager::CancelRestore is OK for any in-flight restore)";
    // The cancelled block is still cached and restorable: its lease was released cleanly.
    QueryResult again = query({b_key});
    ASSERT_EQ(again.prefix, 1u);
    Result<RestoreResult> rr2 = c->Restore({*inst, again.query, {0}, {kSmallKeys - 1}});
    ASSERT_TRUE(rr2.ok()) << rr2.status().ToString();
    EXPECT_TRUE(rr2->blocks[0].status.ok()) << rr2->blocks[0].status.ToString();
    EXPECT_TRUE(pages.Holds(0, kSmallKeys - 1, SeedOf(51, b_key)));
  }
  EXPECT_TRUE(conclusive) << "could not queue B behind A's SSD reads in 3 attempts: the "
                             "cancel-before-submission path was not exercised";
  EXPECT_TRUE(c->UnregisterInstance(*inst).ok());
  c->Close();
  ExpectReleased();
}

// ---- 7: a client SIGKILLed mid-restore ------------------------------------------------

TEST_F(SlowReaderProcessTest, KilledClientMidRestoreReleasesEverything) {
  ASSERT_NO_FATAL_FAILURE(StartWithSmallKeysOnSsd());

  // Client A: a long SSD restore (every other key, read one by one) on a
  // thread, plus a second query (recent keys, in DRAM) that it never restores.
  std::vector<std::string> hold = kSmall;
  for (const char* a :
       {"--keys", "0..1300", "--stride", "2", "--hold-keys", "2800..2900", "--dst-page", "1400"}) {
    hold.push_back(a);
  }
  std::unique_ptr<Proc> a = StartEngine("hold-restore", hold);
  ASSERT_TRUE(a->started()) << a->error();
  ASSERT_TRUE(a->WaitOutput("@ restoring", 30s)) << a->Tail();
  EXPECT_TRUE(mgr_->WaitGaugeAtLeast("orbitkv_restores_inflight", 1, 5s))
      << "client A's restore never showed up in flight:\n"
      << a->Output();
  std::string err;
  std::optional<Metrics> busy = mgr_->Scrape(&err);
  // Client B, another process, keeps working meanwhile.
  std::vector<std::string> b_args = kSmall;
  for (const char* x : {"--keys", "2900..3000", "--dst-page", "0"}) b_args.push_back(x);
  std::unique_ptr<Proc> b = StartEngine("restore-verify", b_args);
  const bool mid_restore = a->Output().find("@ restore-done") == std::string::npos;
  a->Signal(SIGKILL);
  std::optional<int> st = a->WaitExit(10s);
  ASSERT_TRUE(st && WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL) << DescribeStatus(st);
  std::printf("client A held prefix=%lld (hold_prefix=%lld); killed %s\n",
              static_cast<long long>(Field(a->Output(), "held", "prefix")),
              static_cast<long long>(Field(a->Output(), "held", "hold_prefix")),
              mid_restore ? "mid-restore" : "after its restore finished");

  ASSERT_TRUE(busy) << err;
  const std::string busy_text = Describe(*busy, kReleaseGauges);
  std::printf("gauges while A held its queries:%s\n", busy_text.c_str());
  EXPECT_GE(busy->Get("orbitkv_sessions").value_or(0), 1) << busy_text;
  EXPECT_GE(busy->Get("orbitkv_instances").value_or(0), 1) << busy_text;
  EXPECT_GE(busy->Get("orbitkv_queries_active").value_or(0), 1) << busy_text;  // the held query
  EXPECT_GT(busy->Get("orbitkv_query_budget_used_bytes").value_or(0), 0) << busy_text;
  EXPECT_GT(busy->Get("orbitkv_pool_pinned_bytes").value_or(0), 0) << busy_text;
  EXPECT_GE(busy->Get("orbitkv_restores_inflight").value_or(0) +
                busy->Get("orbitkv_ssd_leases_active").value_or(0),
            1)
      << busy_text;
  EXPECT_TRUE(mid_restore) << "client A's restore finished before the kill; the test did not "
                              "kill it mid-restore:\n"
                           << a->Output();

  EngineRun br = Finish(*b);
  EXPECT_ENGINE_OK(br);
  EXPECT_EQ(Field(br.out, "restore", "verified"), 100) << br.out;
  // Everything A held is released once the Manager sees its connection end.
  ExpectReleased();
  EXPECT_TRUE(mgr_->Running());
  // The data A was restoring is intact and the Manager keeps serving.
  std::vector<std::string> v = kSmall;
  for (const char* x : {"--keys", "0..40", "--stride", "2", "--dst-page", "0"}) v.push_back(x);
  EngineRun after = Engine("restore-verify", v);
  EXPECT_ENGINE_OK(after);
  EXPECT_EQ(Field(after.out, "restore", "verified"), 20) << after.out;
  ExpectReleased();
}

// ---- 7b: a client that stops reading its replies ---------------------------------------------

// SSD restores finish on the Manager's restore lane, which sends the reply
// itself. A client whose socket is full (it stopped reading) must not hold
// that lane, and with it every other client's SSD restores, hostage.
TEST_F(SlowReaderProcessTest, NonReadingClientDoesNotStallOtherClients) {
  ASSERT_NO_FATAL_FAILURE(StartWithSmallKeysOnSsd());

  // Client H: queries 500 SSD blocks, asks for their restore, then floods the
  // socket with requests and never reads a reply.
  LayoutSpec spec;
  spec.slot_bytes = {3000};
  spec.pages = kSmallKeys;
  InstanceLayout layout = BuildLayout(spec);
  testing::HostPages pages(layout);
  RawConn h(socket_);
  ASSERT_TRUE(h.connected());
  uint64_t id = 0;
  std::optional<InstanceId> inst = RawRegister(h, "small", layout, pages, &id);
  ASSERT_TRUE(inst);
  QueryRequest q{*inst, 0, {}, 60000};
  for (uint64_t k = 0; k < 1000; k += 2) q.keys.push_back(KeyOf(k));
  ASSERT_TRUE(h.Send(protocol::EncodeRequest(++id, q)).ok());
  std::optional<QueryResult> qr = ExpectReply<QueryResult>(h, id, "Query");
  ASSERT_TRUE(qr);
  ASSERT_EQ(qr->prefix, 500u);
  ASSERT_EQ(qr->sources[0], Tier::kSsd);
  RestoreRequest r{*inst, qr->query, {}, {}};
  for (uint32_t b = 0; b < 500; ++b) {
    r.blocks.push_back(b);
    r.pages.push_back(b);
  }
  ASSERT_TRUE(h.Send(protocol::EncodeRequest(++id, r)).ok());
  std::vector<uint8_t> flood;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> m =
        protocol::EncodeRequest(++id, QueryRequest{*inst + 999, 0, {KeyOf(0)}, 1000});
    const uint32_t len = static_cast<uint32_t>(m.size());
    const uint8_t hdr[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16),
                            uint8_t(len >> 24)};
    flood.insert(flood.end(), hdr, hdr + 4);
    flood.insert(flood.end(), m.begin(), m.end());
  }
  size_t sent = 0;
  for (auto deadline = Clock::now() + 500ms; Clock::now() < deadline && sent < flood.size();) {
    const ssize_t n =
        ::send(h.fd(), flood.data() + sent, flood.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    if (n <= 0) std::this_thread::sleep_for(5ms);
  }
  std::printf("non-reading client pushed %zu of %zu request bytes\n", sent, flood.size());
  std::this_thread::sleep_for(500ms);  // H's restore completes meanwhile

  // Client G, another process, restores other SSD blocks; it must not wait for H.
  std::vector<std::string> g_args = kSmall;
  for (const char* a : {"--keys", "1001..1101", "--stride", "2", "--expect-source", "ssd",
                        "--dst-page", "0", "--timeout-ms", "3000"}) {
    g_args.push_back(a);
  }
  const auto t0 = Clock::now();
  EngineRun g = Engine("restore-verify", g_args);
  const auto g_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  std::printf("client G's SSD restore took %lld ms\n", static_cast<long long>(g_ms.count()));
  EXPECT_EQ(g.rc, 0)
      << "BUG: another client's SSD restore was stalled by a client that stopped reading its "
         "socket. The single host-restore lane thread (src/manager/manager.cc CopyLane -> "
         "FinishBlock -> done, line 254) runs the reply callback of src/server/service.cc:104, "
         "whose Session::Send waits for send_mu_ (src/protocol/server.cc:99) held by the "
         "non-reading session's reader thread, blocked in sendmsg for up to "
         "ServerOptions::send_timeout (30 s, src/protocol/server.h:99):\n"
      << g.out;
  EXPECT_LT(g_ms.count(), 2500);
  // H hangs up; everything it held is released.
  ::shutdown(h.fd(), SHUT_RDWR);
  ExpectReleased(40s);
}

// ---- 8: a Manager restart ------------------------------------------------------------------

TEST_F(ManagerProcessTest, ManagerRestartStartsEmptyAndOldClientsFail) {
  const ManagerFlags flags{.pool = "2mib", .shards = 2};
  ASSERT_NO_FATAL_FAILURE(StartManager(flags));
  const std::vector<std::string> common = {"--ns",    "restart", "--slots", "32768,32668",
                                           "--pages", "64",      "--seed",  "61"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = common;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  EngineRun p = Engine("publish", with({"--keys", "0..48", "--retry-ms", "20000"}));
  ASSERT_EQ(p.rc, 0) << p.out;
  ASSERT_EQ(Field(p.out, "publish", "sealed"), 48) << p.out;

  LayoutSpec spec;
  spec.slot_bytes = {32768, 32668};
  spec.pages = 64;
  InstanceLayout layout = BuildLayout(spec);
  testing::HostPages pages(layout);
  RegisterRequest rr;
  rr.ns = "restart";
  rr.layout = layout;
  QueryRequest q;
  for (uint64_t k = 0; k < 48; ++k) q.keys.push_back(KeyOf(k));

  // A client of the old Manager holds a query when the Manager stops.
  std::unique_ptr<Client> old = Connect();
  ASSERT_TRUE(old);
  Result<InstanceId> old_inst = old->RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(old_inst.ok()) << old_inst.status().ToString();
  q.instance = *old_inst;
  Result<QueryResult> held = old->Query(q);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_GT(held->prefix, 0u);
  ASSERT_TRUE(mgr_->Stop());  // SIGTERM with a client connected: exit 0

  auto expect_fails_fast = [&](Client& c, InstanceId inst, const char* what) {
    const auto t0 = Clock::now();
    QueryRequest qq = q;
    qq.instance = inst;
    Result<QueryResult> r = c.Query(qq);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    ASSERT_FALSE(r.ok()) << what << ": a query to a dead Manager succeeded";
    EXPECT_TRUE(r.status().code() == StatusCode::kCancelled ||
                r.status().code() == StatusCode::kUnavailable)
        << what << ": " << r.status().ToString();
    EXPECT_LT(ms.count(), 5000) << what << ": took " << ms.count() << " ms";
    Result<RestoreResult> rs = c.Restore({inst, held->query, {0}, {60}}, c.NewTicket());
    EXPECT_FALSE(rs.ok()) << what;
  };
  expect_fails_fast(*old, *old_inst, "after SIGTERM");

  // A new Manager on the same socket and SSD files starts empty: misses, not errors.
  ASSERT_NO_FATAL_FAILURE(StartManager(flags));
  std::unique_ptr<Client> fresh = Connect();
  ASSERT_TRUE(fresh);
  Result<InstanceId> fresh_inst = fresh->RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(fresh_inst.ok()) << fresh_inst.status().ToString();
  q.instance = *fresh_inst;
  Result<QueryResult> miss = fresh->Query(q);
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_EQ(miss->prefix, 0u);
  EXPECT_EQ(miss->query, 0u);
  EXPECT_TRUE(miss->sources.empty());
  EngineRun e = Engine("restore-verify", with({"--keys", "0..48", "--expect-prefix", "0"}));
  EXPECT_ENGINE_OK(e);
  // The old client stays failed; it does not reach the new Manager's session.
  expect_fails_fast(*old, *old_inst, "old client after the restart");
  // The new Manager caches and restores as usual on the same files.
  EngineRun p2 = Engine("publish", with({"--keys", "0..40", "--retry-ms", "20000"}));
  EXPECT_ENGINE_OK(p2);
  EXPECT_EQ(Field(p2.out, "publish", "sealed"), 40) << p2.out;
  EngineRun v2 = Engine("restore-verify", with({"--keys", "0..4", "--wait-source", "ssd"}));
  EXPECT_ENGINE_OK(v2);
  EXPECT_EQ(Field(v2.out, "restore", "verified"), 4) << v2.out;

  // A crash (SIGKILL) with a client connected and a restore in flight: errors, no hang.
  q.instance = *fresh_inst;
  std::vector<BlockKey> keys8(q.keys.begin(), q.keys.begin() + 8);
  QueryRequest q8{*fresh_inst, 0, keys8, 60000};
  Result<QueryResult> before = fresh->Query(q8);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  std::optional<Result<RestoreResult>> inflight;
  std::thread t([&] {
    RestoreRequest r{*fresh_inst, before->query, {}, {}};
    for (uint32_t i = 0; i < before->prefix; ++i) {
      r.blocks.push_back(i);
      r.pages.push_back(48 + i);
    }
    if (r.blocks.empty()) return;
    inflight.emplace(fresh->Restore(r, fresh->NewTicket()));
  });
  mgr_->Kill();
  t.join();
  if (inflight) {
    // Finished before the kill, or failed with the connection: never hangs.
    std::printf("restore racing the crash: %s\n", inflight->status().ToString().c_str());
  }
  expect_fails_fast(*fresh, *fresh_inst, "after SIGKILL");

  // Restart after the crash: stale socket, the crashed Manager's SSD files.
  ASSERT_NO_FATAL_FAILURE(StartManager(flags));
  EngineRun e3 = Engine("restore-verify", with({"--keys", "0..40", "--expect-prefix", "0"}));
  EXPECT_ENGINE_OK(e3);
  EngineRun p3 = Engine("publish", with({"--keys", "0..4"}));
  EXPECT_ENGINE_OK(p3);
  EXPECT_EQ(Field(p3.out, "publish", "sealed"), 4) << p3.out;
  EngineRun v3 = Engine("restore-verify", with({"--keys", "0..4", "--expect-source", "dram"}));
  EXPECT_ENGINE_OK(v3);
  old.reset();
  fresh.reset();
  ExpectReleased();
}

// ---- hybrid models: a real Manager and hybrid engine processes ---------------------------------

// orbitkv-hybrid-engine (attention + window + recurrent groups, a model
// description): one process publishes and leaves; others (the engine
// restarted) restore the recovery plan from DRAM, then from SSD after a dense
// namespace flushed DRAM, every byte checked; a missing checkpoint shortens P.
TEST_F(ManagerProcessTest, HybridRestoresAfterDramEvictionAndEngineRestart) {
  const std::string hybrid_bin = BinaryFromEnv("ORBITKV_HYBRID_ENGINE_BINARY");
  ASSERT_FALSE(hybrid_bin.empty()) << "set ORBITKV_HYBRID_ENGINE_BINARY (ctest does)";
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "2mib", .shards = 2}));
  auto hybrid = [&](const std::string& cmd, std::vector<std::string> args) {
    std::vector<std::string> argv = {hybrid_bin, cmd, "--socket", socket_, "--keys", "10"};
    argv.insert(argv.end(), args.begin(), args.end());
    Proc p("hybrid " + cmd, argv);
    if (!p.started()) return EngineRun{-1, p.error()};
    return Finish(p);
  };
  EngineRun a = hybrid("publish", {"--seed", "31"});
  EXPECT_ENGINE_OK(a);
  EXPECT_EQ(Field(a.out, "publish", "sealed"), 22) << a.out;  // 10 attn, 10 swa, 2 checkpoints
  // A new process (the engine restarted) restores P = 128 from DRAM: attn
  // 0..7, swa 5..7 and the checkpoint at 128.
  const std::vector<std::string> plan = {"--seed", "31", "--expect-prefix-tokens", "128"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> v = plan;
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  EngineRun b = hybrid("restore-verify", with({"--expect-source", "dram"}));
  EXPECT_ENGINE_OK(b);
  EXPECT_EQ(Field(b.out, "restore", "verified"), 12) << b.out;
  // Control: the verifier notices other bytes.
  EngineRun wrong = hybrid("restore-verify", {"--seed", "32", "--expect-prefix-tokens", "128"});
  EXPECT_EQ(wrong.rc, 1) << "the verifier must reject other bytes:\n" << wrong.out;
  // A dense namespace's 6 MiB flush the 2 MiB pool: the plan comes from SSD.
  EngineRun flood = Engine("publish", {"--ns", "flood", "--slots", "32768,32668", "--pages", "96",
                                       "--keys", "0..96", "--retry-ms", "20000"});
  EXPECT_ENGINE_OK(flood);
  EngineRun c = hybrid("restore-verify", with({"--expect-source", "ssd"}));
  EXPECT_ENGINE_OK(c);
  EXPECT_EQ(Field(c.out, "restore", "verified"), 12) << c.out;
  // Without the checkpoint at 128, P falls back to the one at 64.
  EXPECT_ENGINE_OK(
      hybrid("publish", {"--ns", "hybrid-gap", "--seed", "33", "--skip-checkpoint", "128"}));
  EngineRun d = hybrid("restore-verify",
                       {"--ns", "hybrid-gap", "--seed", "33", "--expect-prefix-tokens", "64"});
  EXPECT_ENGINE_OK(d);
  EXPECT_EQ(Field(d.out, "restore", "verified"), 8) << d.out;  // attn 0..3, swa 1..3, gdn 64
  std::string err;
  std::optional<Metrics> m = mgr_->Scrape(&err);
  ASSERT_TRUE(m) << err;
  EXPECT_TRUE(m->Get("orbitkv_checkpoint_dram_bytes").has_value());
  ExpectReleased();
}

// ---- 9: malformed and hostile messages -------------------------------------------------------

// A register with a model description is served (the Manager compiles its
// recovery plans); one whose description disagrees with the layout or is bad
// is refused naming the field, the fds are closed, and the session keeps
// working: a dense register follows.
TEST_F(ManagerProcessTest, RegisterWithModelDescriptionIsServedAndABadOneRefused) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "2mib", .shards = 2}));
  LayoutSpec spec;
  spec.slot_bytes = {4096};
  spec.pages = 8;
  InstanceLayout layout = BuildLayout(spec);
  testing::HostPages pages(layout);
  std::unique_ptr<Client> c = Connect();
  ASSERT_TRUE(c);
  RegisterRequest rr;
  rr.ns = "hybrid";
  rr.layout = layout;
  GroupDescription attn;
  attn.name = "attn";
  attn.block_tokens = 16;
  attn.bytes = 4096;
  rr.model = ModelDescription{16, {attn}};
  Result<InstanceId> served = c->RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  EXPECT_TRUE(c->UnregisterInstance(*served).ok());
  rr.model->groups[0].bytes = 4000;  // the layout's group holds 4096
  Result<InstanceId> disagrees = c->RegisterInstance(rr, pages.fds());
  ASSERT_FALSE(disagrees.ok());
  EXPECT_EQ(disagrees.status().code(), StatusCode::kInvalidArgument)
      << disagrees.status().ToString();
  rr.model->groups[0].bytes = 0;
  Result<InstanceId> bad = c->RegisterInstance(rr, pages.fds());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("RegisterInstance.model.groups[0].bytes: 0"),
            std::string_view::npos)
      << bad.status().ToString();
  rr.model.reset();
  Result<InstanceId> dense = c->RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  EXPECT_TRUE(c->UnregisterInstance(*dense).ok());
}

TEST_F(ManagerProcessTest, HostileMessagesGetErrorsAndManagerKeepsServing) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib"}));
  const pid_t pid = mgr_->pid();
  const std::vector<std::string> good = {"--ns",    "hostile", "--slots", "4000",
                                         "--pages", "16",      "--seed",  "71"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = good;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  EngineRun p = Engine("publish", with({"--keys", "0..8"}));
  ASSERT_EQ(p.rc, 0) << p.out;
  ASSERT_TRUE(mgr_->GaugesReachZero({"orbitkv_sessions"}, 10s));
  // The idle Manager's descriptors: wait until a finished session's socket is reaped.
  int fds_before = CountFds(pid);
  for (int stable = 0; stable < 5; std::this_thread::sleep_for(50ms)) {
    const int n = CountFds(pid);
    stable = n == fds_before ? stable + 1 : 0;
    fds_before = n;
  }
  ASSERT_GT(fds_before, 0);
  std::mt19937_64 rng(12345);

  // (a) Frames of random bytes: an ErrorReply each (or a closed connection);
  // when the session survives, it still answers a Hello.
  {
    RawConn c(socket_);
    ASSERT_TRUE(c.connected());
    bool closed = false;
    for (size_t n : {0, 1, 3, 17, 100, 4096, 70000}) {
      ASSERT_TRUE(c.Send(RandomBytes(rng, n)).ok());
      ::testing::AssertionResult r =
          ErrorOrClosed(c, 0, "random frame of " + std::to_string(n) + " bytes", &closed);
      EXPECT_TRUE(r);
      if (r) std::printf("  %s\n", r.message());
      if (closed) break;
    }
    if (!closed) {
      ASSERT_TRUE(c.Send(protocol::EncodeRequest(77, protocol::HelloRequest{})).ok());
      EXPECT_TRUE(ExpectReply<protocol::HelloReply>(c, 77, "Hello after garbage"));
    }
  }
  // (b) Unframed garbage, then hang up.
  for (int i = 0; i < 8; ++i) {
    RawConn c(socket_);
    ASSERT_TRUE(c.connected());
    std::vector<uint8_t> junk = RandomBytes(rng, 1 + rng() % 300);
    c.SendRaw(junk.data(), junk.size());
  }
  // (c) Huge length prefixes: the connection is closed, nothing is allocated.
  for (uint32_t len : {0xFFFFFFFFu, (64u << 20) + 1, 0x80000000u}) {
    RawConn c(socket_);
    ASSERT_TRUE(c.connected());
    const uint8_t hdr[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16),
                            uint8_t(len >> 24)};
    c.SendRaw(hdr, 4);
    c.SendRaw("0123456789abcdef", 16);
    EXPECT_TRUE(c.WaitClosed()) << "length prefix " << len << " did not close the connection";
  }
  // (d) A frame announced as 32 MiB that stops after 1 KiB, then hangs up.
  {
    RawConn c(socket_);
    const uint32_t len = 32u << 20;
    const uint8_t hdr[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16),
                            uint8_t(len >> 24)};
    c.SendRaw(hdr, 4);
    std::vector<uint8_t> part = RandomBytes(rng, 1024);
    c.SendRaw(part.data(), part.size());
  }

  // A connection that announces 1 MiB, sends 10 bytes and stalls stays open
  // while everything below runs: it must not hold anybody else up.
  auto stalled = std::make_unique<RawConn>(socket_);
  {
    const uint32_t len = 1u << 20;
    const uint8_t hdr[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16),
                            uint8_t(len >> 24)};
    stalled->SendRaw(hdr, 4);
    stalled->SendRaw("0123456789", 10);
  }

  // (e) Valid envelopes with out-of-range pages and ids, on a registered session.
  LayoutSpec spec;
  spec.slot_bytes = {4000};
  spec.pages = 16;
  InstanceLayout layout = BuildLayout(spec);
  testing::HostPages pages(layout);
  uint64_t id = 100;
  {
    RawConn c(socket_);
    ASSERT_TRUE(c.connected());
    std::optional<InstanceId> inst = RawRegister(c, "hostile", layout, pages, &id);
    ASSERT_TRUE(inst);
    auto bad = [&](const std::vector<uint8_t>& msg, const std::string& what) {
      ASSERT_TRUE(c.Send(msg).ok()) << what;
      bool closed = false;
      ::testing::AssertionResult r = ErrorOrClosed(c, id, what, &closed);
      EXPECT_TRUE(r);
      if (r) std::printf("  %s\n", r.message());
      ASSERT_FALSE(closed) << what << ": the Manager closed a session over a bad request; the "
                           << "remaining cases need it";
    };
    auto publish = [&](InstanceId i, uint32_t group, std::vector<uint64_t> keys,
                       std::vector<uint64_t> pgs, std::vector<uint32_t> slots) {
      PublishRequest r{i, group, {}, std::move(pgs), std::move(slots)};
      for (uint64_t k : keys) r.keys.push_back(KeyOf(k));
      return protocol::EncodeRequest(++id, r);
    };
    bad(publish(*inst, 0, {1}, {16}, {}), "Publish page == num_pages");
    bad(publish(*inst, 0, {1}, {~0ull}, {}), "Publish page 2^64-1");
    bad(publish(*inst, 0, {1}, {1ull << 40}, {}), "Publish page 2^40");
    bad(publish(*inst + 1000, 0, {1}, {0}, {}), "Publish unknown instance");
    bad(publish(0, 0, {1}, {0}, {}), "Publish instance 0");
    bad(publish(*inst, 7, {1}, {0}, {}), "Publish unknown group");
    bad(publish(*inst, ~0u, {1}, {0}, {}), "Publish group 2^32-1");
    bad(publish(*inst, 0, {1}, {0}, {9}), "Publish slot not held");
    bad(publish(*inst, 0, {1}, {0}, {0, 0}), "Publish slot twice");
    bad(publish(*inst, 0, {1, 2}, {0}, {}), "Publish 2 keys, 1 page");
    bad(protocol::EncodeRequest(++id, QueryRequest{*inst + 1000, 0, {KeyOf(0)}, 1000}),
        "Query unknown instance");
    bad(protocol::EncodeRequest(++id, QueryRequest{*inst, 0, {KeyOf(0)}, 0}), "Query ttl 0");
    bad(protocol::EncodeRequest(++id, QueryRequest{*inst, 9, {KeyOf(0)}, 1000}),
        "Query unknown group");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, 987654321, {0}, {0}}),
        "Restore unknown query");
    // A real query, then restores that misuse it; the query survives them.
    ASSERT_TRUE(
        c.Send(protocol::EncodeRequest(++id, QueryRequest{*inst, 0, {KeyOf(0), KeyOf(1)}, 30000}))
            .ok());
    std::optional<QueryResult> q = ExpectReply<QueryResult>(c, id, "Query");
    ASSERT_TRUE(q);
    ASSERT_EQ(q->prefix, 2u);
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {2}, {0}}),
        "Restore block beyond the prefix");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {~0u}, {0}}),
        "Restore block 2^32-1");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {0}, {16}}),
        "Restore page == num_pages");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {0}, {~0ull}}),
        "Restore page 2^64-1");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {0, 0}, {1, 2}}),
        "Restore block twice");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {0, 1}, {1}}),
        "Restore 2 blocks, 1 page");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {}, {}}),
        "Restore no blocks");
    bad(protocol::EncodeRequest(++id, RestoreRequest{*inst + 1000, q->query, {0}, {1}}),
        "Restore unknown instance");
    ASSERT_TRUE(
        c.Send(protocol::EncodeRequest(++id, RestoreRequest{*inst, q->query, {0, 1}, {10, 11}}))
            .ok());
    std::optional<RestoreResult> rr = ExpectReply<RestoreResult>(c, id, "Restore");
    ASSERT_TRUE(rr);
    for (const BlockResult& b : rr->blocks) EXPECT_TRUE(b.status.ok()) << b.status.ToString();
    EXPECT_TRUE(pages.Holds(0, 10, SeedOf(71, 0)));
    EXPECT_TRUE(pages.Holds(0, 11, SeedOf(71, 1)));
    // CancelRestore of an unknown id: answered, nothing cancelled.
    ASSERT_TRUE(c.Send(protocol::EncodeRequest(++id, protocol::CancelRestoreRequest{424242})).ok());
    std::optional<protocol::CancelRestoreReply> cr =
        ExpectReply<protocol::CancelRestoreReply>(c, id, "CancelRestore unknown");
    ASSERT_TRUE(cr);
    EXPECT_FALSE(cr->cancelled);
    bad(protocol::EncodeRequest(++id, protocol::UnregisterRequest{*inst + 1000}),
        "Unregister unknown instance");
    bad(protocol::EncodeRequest(++id, PrepareRequest{*inst + 1000, 0, {KeyOf(0)}}),
        "Prepare unknown instance");
    // Replies sent as requests.
    bad(protocol::EncodeReply(++id, protocol::HelloReply{}), "HelloReply as a request");
    bad(protocol::EncodeReply(++id, RestoreResult{{BlockResult{0, Tier::kDram, {}}}}),
        "RestoreReply as a request");
    bad(protocol::EncodeError(++id, Status::Internal("x")), "ErrorReply as a request");
    // Envelopes the decoder must refuse: another version; keys not 32-byte multiples.
    {
      flatbuffers::FlatBufferBuilder fbb;
      auto hello = wire::CreateHello(fbb, protocol::kProtocolVersion, 1, fbb.CreateString("v"));
      auto env = wire::CreateEnvelope(fbb, 99, ++id, wire::Body_Hello, hello.Union());
      wire::FinishEnvelopeBuffer(fbb, env);
      bad({fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()}, "Envelope version 99");
    }
    {
      flatbuffers::FlatBufferBuilder fbb;
      std::vector<uint8_t> keys(33, 1);
      std::vector<uint64_t> pgs = {0};
      auto pub = wire::CreatePublish(fbb, *inst, 0, fbb.CreateVector(keys), fbb.CreateVector(pgs));
      auto env = wire::CreateEnvelope(fbb, protocol::kProtocolVersion, ++id, wire::Body_Publish,
                                      pub.Union());
      wire::FinishEnvelopeBuffer(fbb, env);
      bad({fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()},
          "Publish keys of 33 bytes");
    }
    {
      flatbuffers::FlatBufferBuilder fbb;
      auto env = wire::CreateEnvelope(fbb, protocol::kProtocolVersion, ++id,
                                      static_cast<wire::Body>(200), 0);
      wire::FinishEnvelopeBuffer(fbb, env);
      bad({fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()}, "unknown body type");
    }
    // (f) Register with fds that are not usable memfds.
    RegisterRequest rr1;
    rr1.ns = "hostile";
    rr1.layout = layout;
    auto bad_register = [&](RegisterRequest r, std::vector<int> fds, const std::string& what) {
      ASSERT_TRUE(c.Send(protocol::EncodeRequest(++id, r), fds).ok()) << what;
      for (int fd : fds) ::close(fd);
      bool closed = false;
      ::testing::AssertionResult res = ErrorOrClosed(c, id, what, &closed);
      EXPECT_TRUE(res);
      if (res) std::printf("  %s\n", res.message());
      ASSERT_FALSE(closed) << what;
    };
    const uint64_t region = layout.region_bytes[0];
    bad_register(rr1, {::open("/dev/null", O_RDWR | O_CLOEXEC)}, "Register /dev/null");
    {
      const std::string file = dir_.File("regular");
      int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(region)), 0);
      bad_register(rr1, {fd}, "Register a regular file");
    }
    {
      int pp[2];
      ASSERT_EQ(::pipe2(pp, O_CLOEXEC), 0);
      ::close(pp[1]);
      bad_register(rr1, {pp[0]}, "Register a pipe");
    }
    bad_register(rr1, {::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)}, "Register a socket");
    {
      int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
      ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(region)), 0);
      bad_register(rr1, {fd}, "Register an unsealed memfd");
    }
    {
      int fd = ::memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(region / 2)), 0);
      ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
      bad_register(rr1, {fd}, "Register a sealed memfd smaller than its region");
    }
    {
      int fd = ::memfd_create("readonly", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(region)), 0);
      ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
      bad_register(rr1, {fd}, "Register a write-sealed memfd");
    }
    // (g) More fds than regions, fewer, and fds on a message that takes none.
    {
      std::vector<int> three = pages.DupFds();
      for (int fd : pages.DupFds()) three.push_back(fd);
      for (int fd : pages.DupFds()) three.push_back(fd);
      bad_register(rr1, three, "Register 3 fds for 1 region");
    }
    bad_register(rr1, {}, "Register 0 fds for 1 region");
    {
      RegisterRequest two = rr1;
      two.layout.region_bytes.push_back(4096);  // 2 regions, 1 fd
      bad_register(two, pages.DupFds(), "Register 1 fd for 2 regions");
    }
    {
      RegisterRequest many = rr1;
      many.layout.region_bytes.assign(kMaxRegions + 1, 4096);
      bad_register(many, {}, "Register with kMaxRegions + 1 regions");
    }
    {
      RegisterRequest cuda = rr1;
      cuda.device = "cuda:0";
      bad_register(cuda, pages.DupFds(), "Register cuda:0 with memfds");
    }
    {
      std::vector<int> fds = pages.DupFds();
      PublishRequest pr{*inst, 0, {KeyOf(5)}, {5}, {}};
      ASSERT_TRUE(c.Send(protocol::EncodeRequest(++id, pr), fds).ok());
      for (int fd : fds) ::close(fd);
      EXPECT_TRUE(ErrorOrClosed(c, id, "Publish carrying an fd"));
    }
  }
  // The stalled connection goes away too.
  stalled.reset();

  // The Manager is alive, leaked no descriptor, counted the bad frames, and
  // still serves a well-behaved client byte-exact.
  EXPECT_TRUE(mgr_->Running());
  EXPECT_EQ(::kill(pid, 0), 0);
  EXPECT_TRUE(mgr_->GaugesReachZero({"orbitkv_sessions"}, 10s));
  int fds_after = -1;
  for (auto deadline = Clock::now() + 5s; Clock::now() < deadline;) {
    fds_after = CountFds(pid);
    if (fds_after <= fds_before) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LE(fds_after, fds_before) << "the Manager leaked file descriptors (memfds or sockets "
                                      "of refused requests)";
  std::string err;
  std::optional<Metrics> m = mgr_->Scrape(&err);
  ASSERT_TRUE(m) << err;
  EXPECT_GT(m->Get("orbitkv_protocol_bad_frames_total").value_or(0), 0);
  EngineRun v = Engine("restore-verify", with({"--keys", "0..8", "--dst-page", "8"}));
  EXPECT_ENGINE_OK(v);
  EXPECT_EQ(Field(v.out, "restore", "verified"), 8) << v.out;
  ExpectReleased();
  EXPECT_TRUE(mgr_->Running());
}

// ---- hardening (issue 11): limits, authentication, restore timeouts -----------------
//
// Registered as its own ctest (manager_hardening_test, --gtest_filter=Hardening*).

class HardeningProcessTest : public ManagerProcessTest {
 protected:
  // Hello on a raw connection, then the reason the Manager gives for closing
  // it (an ErrorReply with envelope id 0); OK if it closed without one.
  static Status ClosingReason(RawConn& c) {
    for (;;) {
      RawConn::Reply r = c.Recv();
      if (r.outcome != RawConn::Outcome::kReply) return Status::OK();
      const auto* err = std::get_if<protocol::ErrorReply>(&r.msg.body);
      if (err != nullptr && r.msg.id == 0) return err->status;
    }
  }
  static void ExpectReason(const Status& st, StatusCode code, const std::string& needle) {
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.ToString().find(needle), std::string::npos) << st.ToString();
  }
};

// 40 connections announcing 64 MiB frames and sending 40 MiB of each took the
// old Manager from 39 MB to 3.17 GB RSS, 547 MB of it kept after they closed.
// The Manager's own accounting (orbitkv_protocol_buffered_bytes) is checked in
// every build; its RSS, in the plain build only (kSanitizedBuild says why).
TEST_F(HardeningProcessTest, PartialFramesStayUnderTheRequestBufferCap) {
  constexpr int64_t kCapMib = 128;
  ASSERT_NO_FATAL_FAILURE(
      StartManager({.pool = "8mib", .ssd = false, .extra = {"--max-request-buffer", "128mib"}}));
  const pid_t pid = mgr_->pid();
  std::this_thread::sleep_for(300ms);
  const int64_t baseline_kb = ProcStatusField(pid, "VmRSS");
  ASSERT_GT(baseline_kb, 0);

  constexpr int kConns = 40;
  constexpr uint32_t kAnnounced = 64u << 20;
  constexpr size_t kSent = 40u << 20;
  std::vector<std::unique_ptr<RawConn>> conns;
  std::vector<size_t> sent(kConns, 0);
  for (int i = 0; i < kConns; ++i) {
    conns.push_back(std::make_unique<RawConn>(socket_));
    ASSERT_TRUE(conns.back()->connected());
    const uint8_t hdr[4] = {static_cast<uint8_t>(kAnnounced), static_cast<uint8_t>(kAnnounced >> 8),
                            static_cast<uint8_t>(kAnnounced >> 16),
                            static_cast<uint8_t>(kAnnounced >> 24)};
    ASSERT_TRUE(conns.back()->SendRaw(hdr, sizeof hdr));
    ::fcntl(conns.back()->fd(), F_SETFL, ::fcntl(conns.back()->fd(), F_GETFL) | O_NONBLOCK);
  }
  const std::vector<uint8_t> chunk(1u << 20, 0xab);
  int64_t peak_kb = baseline_kb;
  auto last_progress = Clock::now();
  while (Clock::now() - last_progress < 1500ms) {
    bool progress = false;
    for (int i = 0; i < kConns; ++i) {
      while (sent[i] < kSent) {
        const size_t want = std::min(chunk.size(), kSent - sent[i]);
        const ssize_t n = ::send(conns[i]->fd(), chunk.data(), want, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent[i] += static_cast<size_t>(n);
        progress = true;
      }
    }
    peak_kb = std::max(peak_kb, ProcStatusField(pid, "VmRSS"));
    if (progress) last_progress = Clock::now();
    std::this_thread::sleep_for(20ms);
  }
  size_t total = 0;
  for (size_t n : sent) total += n;
  const int64_t grown_mib = (peak_kb - baseline_kb) / 1024;
  std::printf(
      "  sent %zu MiB in all; Manager RSS %lld MiB -> peak %lld MiB (+%lld MiB, cap %lld)\n",
      total >> 20, static_cast<long long>(baseline_kb / 1024),
      static_cast<long long>(peak_kb / 1024), static_cast<long long>(grown_mib),
      static_cast<long long>(kCapMib));
  // The cap plus slack for the kernel's and allocator's own bookkeeping.
  if (!kSanitizedBuild) {
    EXPECT_LE(grown_mib, kCapMib + 32) << "partial frames took more memory than the cap";
  }
  std::string err;
  std::optional<Metrics> m = mgr_->Scrape(&err);
  ASSERT_TRUE(m) << err;
  EXPECT_LE(m->Get("orbitkv_protocol_buffered_bytes").value_or(-1), kCapMib << 20);
  EXPECT_GE(m->Get("orbitkv_protocol_waiting_connections").value_or(-1), kConns - 2);

  conns.clear();
  if (kSanitizedBuild) {
    std::printf("  sanitizer build: Manager RSS not checked, its buffer accounting is\n");
  } else {
    int64_t after_kb = 0;
    for (auto deadline = Clock::now() + 10s; Clock::now() < deadline;) {
      after_kb = ProcStatusField(pid, "VmRSS");
      if ((after_kb - baseline_kb) / 1024 <= 16) break;
      std::this_thread::sleep_for(50ms);
    }
    std::printf("  after close: %lld MiB\n", static_cast<long long>(after_kb / 1024));
    EXPECT_LE((after_kb - baseline_kb) / 1024, 16) << "memory not returned after close";
  }
  ASSERT_TRUE(mgr_->GaugesReachZero({"orbitkv_protocol_buffered_bytes", "orbitkv_sessions"}, 10s));
  EXPECT_TRUE(Connect()) << "the Manager stopped serving";
}

// The old Manager ran one thread per connection (800 idle connections were
// 812 threads).
TEST_F(HardeningProcessTest, TwoThousandIdleConnectionsKeepTheThreadCountSmall) {
  ASSERT_TRUE(RaiseNofile(8192)) << "cannot raise RLIMIT_NOFILE to 8192";
  ASSERT_NO_FATAL_FAILURE(
      StartManager({.pool = "8mib",
                    .ssd = false,
                    .extra = {"--max-connections", "4096", "--max-connections-per-uid", "4096"}}));
  const pid_t pid = mgr_->pid();
  const int64_t before = ProcStatusField(pid, "Threads");
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 2000; ++i) {
    conns.push_back(std::make_unique<RawConn>(socket_));
    ASSERT_TRUE(conns.back()->connected()) << "connection " << i << ": " << std::strerror(errno);
  }
  ASSERT_TRUE(mgr_->WaitGaugeAtLeast("orbitkv_sessions", 2000, 30s));
  const int64_t after = ProcStatusField(pid, "Threads");
  std::printf("  Manager threads: %lld before, %lld with 2000 idle connections\n",
              static_cast<long long>(before), static_cast<long long>(after));
  EXPECT_LE(after, before + 2);
  const auto t0 = Clock::now();
  std::unique_ptr<Client> c = Connect();
  ASSERT_TRUE(c);
  EXPECT_LT(Clock::now() - t0, 2s);
  c.reset();
  conns.clear();
  EXPECT_TRUE(mgr_->GaugesReachZero({"orbitkv_protocol_connections", "orbitkv_sessions"}, 20s));
}

TEST_F(HardeningProcessTest, Connection1025GetsAReason) {
  ASSERT_TRUE(RaiseNofile(4096)) << "cannot raise RLIMIT_NOFILE to 4096";
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib", .ssd = false}));
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 1024; ++i) {
    conns.push_back(std::make_unique<RawConn>(socket_));
    ASSERT_TRUE(conns.back()->connected()) << "connection " << i;
  }
  ASSERT_TRUE(mgr_->WaitGaugeAtLeast("orbitkv_sessions", 1024, 30s));
  ClientConfig cc;
  cc.socket_path = socket_;
  cc.timeout = 10s;
  Result<std::unique_ptr<Client>> c = Client::Connect(cc);
  ASSERT_FALSE(c.ok());
  ExpectReason(c.status(), StatusCode::kResourceExhausted, "--max-connections");
  conns.pop_back();
  for (auto deadline = Clock::now() + 10s; Clock::now() < deadline;) {
    c = Client::Connect(cc);
    if (c.ok()) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(c.ok()) << "room again once one left: " << c.status().ToString();
}

TEST_F(HardeningProcessTest, LimitsAndRefusalsComeWithTypedReasons) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib",
                                        .ssd = false,
                                        .extra = {"--max-frame-size", "1mib", "--max-fds-per-frame",
                                                  "8", "--idle-timeout-ms", "1000"}}));
  {  // A frame over --max-frame-size.
    RawConn c(socket_);
    const uint32_t len = 2u << 20;
    const uint8_t hdr[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                            static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
    ASSERT_TRUE(c.SendRaw(hdr, sizeof hdr));
    ExpectReason(ClosingReason(c), StatusCode::kResourceExhausted, "more than the limit 1048576");
  }
  {  // More fds than --max-fds-per-frame.
    RawConn c(socket_);
    LayoutSpec spec;
    spec.slot_bytes = std::vector<uint64_t>(9, 4096);
    spec.pages = 2;
    testing::HostPages pages(BuildLayout(spec));
    RegisterRequest rr;
    rr.ns = "fds";
    rr.layout = BuildLayout(spec);
    ASSERT_TRUE(c.Send(protocol::EncodeRequest(1, rr), pages.fds()).ok());
    ExpectReason(ClosingReason(c), StatusCode::kResourceExhausted, "9 file descriptors");
  }
  // Idle without an instance: closed with a reason the client reports typed;
  // a client that registered an instance stays.
  std::unique_ptr<Client> idle = Connect();
  std::unique_ptr<Client> busy = Connect();
  ASSERT_TRUE(idle && busy);
  LayoutSpec spec;
  spec.slot_bytes = {4096};
  spec.pages = 4;
  testing::HostPages pages(BuildLayout(spec));
  RegisterRequest rr;
  rr.ns = "idle";
  rr.layout = BuildLayout(spec);
  Result<InstanceId> inst = busy->RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(inst.ok()) << inst.status().ToString();
  std::this_thread::sleep_for(1800ms);
  EXPECT_TRUE(idle->closed());
  Status st = idle->ReleaseQuery(1, 1);
  ExpectReason(st, StatusCode::kDeadlineExceeded, "--idle-timeout-ms");
  EXPECT_FALSE(busy->closed());
  QueryRequest q;
  q.instance = *inst;
  q.keys = {KeyOf(1)};
  EXPECT_TRUE(busy->Query(q).ok());

  // Another uid is refused with PermissionDenied naming it.
  if (::geteuid() != 0) return;
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(socket_.c_str(), 0666), 0);
  int pfd[2];
  ASSERT_EQ(::pipe(pfd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, socket_.c_str(), socket_.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(3);
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) {
      if (::write(pfd[1], buf, static_cast<size_t>(n)) != n) ::_exit(4);
    }
    ::_exit(0);
  }
  ::close(pfd[1]);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(pfd[0], buf, sizeof buf)) > 0;) said.append(buf, n);
  ::close(pfd[0]);
  int ws = 0;
  ASSERT_EQ(::waitpid(child, &ws, 0), child);
  ASSERT_GT(said.size(), 4u) << "the refused peer was told nothing";
  Result<protocol::DecodedMessage> msg = protocol::DecodeMessage(
      std::span(reinterpret_cast<const uint8_t*>(said.data()) + 4, said.size() - 4));
  ASSERT_TRUE(msg.ok()) << msg.status().ToString();
  ExpectReason(std::get<protocol::ErrorReply>(msg->body).status, StatusCode::kPermissionDenied,
               "uid 65534");
}

TEST_F(HardeningProcessTest, ClientClosedOnceTheManagerDies) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib", .ssd = false}));
  std::unique_ptr<Client> c = Connect();
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->closed());
  mgr_->Kill();
  for (auto deadline = Clock::now() + 5s; Clock::now() < deadline && !c->closed();) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(c->closed());
}

// The old client raised DeadlineExceeded at its timeout while the Manager,
// once resumed, wrote the restore's pages anyway.
TEST_F(HardeningProcessTest, RestoreTimeoutNeverReturnsWhileThePagesMayStillBeWritten) {
  ASSERT_NO_FATAL_FAILURE(StartManager({.pool = "8mib", .ssd = false}));
  LayoutSpec spec;
  spec.slot_bytes = {4096, 1000};
  spec.pages = 8;
  const InstanceLayout layout = BuildLayout(spec);
  testing::HostPages pages(layout);
  ClientConfig cc;
  cc.socket_path = socket_;
  cc.timeout = 2000ms;
  cc.restore_cancel_grace = 1000ms;
  Result<std::unique_ptr<Client>> conn = Client::Connect(cc);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  Client& c = **conn;
  RegisterRequest rr;
  rr.ns = "restore-timeout";
  rr.layout = layout;
  Result<InstanceId> inst = c.RegisterInstance(rr, pages.fds());
  ASSERT_TRUE(inst.ok()) << inst.status().ToString();
  pages.Fill(0, 0, 7);
  Result<PublishResult> pub = c.Publish({*inst, 0, {KeyOf(1)}, {0}, {}});
  ASSERT_TRUE(pub.ok() && pub->sealed == 1) << pub.status().ToString();
  auto query = [&] {
    Result<QueryResult> q = c.Query({*inst, 0, {KeyOf(1)}, 60000});
    EXPECT_TRUE(q.ok() && q->prefix == 1) << q.status().ToString();
    return q.ok() ? q->query : 0;
  };
  // Resumes the Manager whatever happens below.
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{mgr_->pid()};

  // (1) The Manager stays stopped past timeout + grace: DeadlineExceeded, which
  // says the pages are still owned; WaitRestore then waits for the completion.
  const QueryId q1 = query();
  pages.Fill(0, 1, 99);  // the engine's own bytes in the destination
  ASSERT_TRUE(StopProcess(mgr_->pid()));
  const uint64_t ticket = c.NewTicket();
  const auto t0 = Clock::now();
  Result<RestoreResult> r = c.Restore({*inst, q1, {0}, {1}}, ticket);
  const auto took = Clock::now() - t0;
  ASSERT_FALSE(r.ok());
  ExpectReason(r.status(), StatusCode::kDeadlineExceeded, "WaitRestore");
  EXPECT_GE(took, 2900ms) << "returned before the cancel grace";
  EXPECT_TRUE(pages.Holds(0, 1, 99));
  ASSERT_EQ(::kill(mgr_->pid(), SIGCONT), 0);
  Result<RestoreResult> w = c.WaitRestore(ticket, 10s);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->blocks.size(), 1u);
  // Whatever it was (restored, or caught by the cancel), nothing more is written.
  const bool restored = w->blocks[0].status.ok();
  if (restored) {
    EXPECT_TRUE(pages.Holds(0, 1, 7));
  }
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(pages.Holds(0, 1, restored ? 7 : 99));

  // (2) The Manager resumes within the grace: Restore returns the restore's
  // completion, after which the pages never change.
  const QueryId q2 = query();
  pages.Fill(0, 2, 55);
  ASSERT_TRUE(StopProcess(mgr_->pid()));
  std::thread resumer([&] {
    std::this_thread::sleep_for(2500ms);
    ::kill(mgr_->pid(), SIGCONT);
  });
  r = c.Restore({*inst, q2, {0}, {2}}, c.NewTicket());
  resumer.join();
  ASSERT_TRUE(r.ok()) << "the completion came within the grace: " << r.status().ToString();
  ASSERT_EQ(r->blocks.size(), 1u);
  const bool restored2 = r->blocks[0].status.ok();
  EXPECT_TRUE(pages.Holds(0, 2, restored2 ? 7 : 55));
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(pages.Holds(0, 2, restored2 ? 7 : 55)) << "a page was written after Restore returned";
}

// A user who squats the default socket path (or binds a socket of the
// Manager's path) must not get a single frame or fd from an engine, and must
// not keep the Manager from knowing why it cannot start. Root only: it runs
// the squatter and the Manager as two uids with no account (setuid needs no
// passwd entry), so the test leaves no users behind on the machine.
TEST_F(HardeningProcessTest, SquattedSocketPathsAreRefusedByClientAndManager) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (setuid)";
  // Two ids below 65534 (nobody) that no account or group names.
  auto free_id = [](uint32_t below) -> std::optional<std::pair<uid_t, gid_t>> {
    for (uint32_t id = below - 1; id > 60000; --id) {
      if (::getpwuid(id) == nullptr && ::getgrgid(id) == nullptr) return std::make_pair(id, id);
    }
    return std::nullopt;
  };
  const auto squatter = free_id(65534);
  const auto victim = squatter ? free_id(squatter->first) : std::nullopt;
  if (!squatter || !victim) GTEST_SKIP() << "no free uid in 60001..65533";
  const std::string S = std::to_string(squatter->first), V = std::to_string(victim->first);
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  const std::string shared = dir_.File("shared");
  ASSERT_EQ(::mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);

  // The squatter: listens on `path` as uid S and reports how many bytes each
  // of the first `accepts` connections sent before closing.
  auto squat = [&](const std::string& path, int accepts, int report_fd) -> pid_t {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    if (::setgroups(0, nullptr) != 0 || ::setgid(squatter->second) != 0 ||
        ::setuid(squatter->first) != 0) {
      ::_exit(2);
    }
    const int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size());
    if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 8) != 0) {
      ::_exit(3);
    }
    ::chmod(path.c_str(), 0777);
    if (::write(report_fd, "L", 1) != 1) ::_exit(4);  // listening
    for (int i = 0; i < accepts; ++i) {
      const int c = ::accept(l, nullptr, nullptr);
      char buf[4096];
      uint32_t got = 0;
      // Read what the client sends until it closes or goes quiet for 1 s.
      timeval tv{1, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      for (ssize_t n; (n = ::read(c, buf, sizeof buf)) > 0;) got += static_cast<uint32_t>(n);
      ::close(c);
      if (::write(report_fd, &got, sizeof got) != sizeof got) ::_exit(5);
    }
    ::pause();  // keep listening until killed
    ::_exit(0);
  };
  auto reap = [](pid_t pid) {
    ::kill(pid, SIGKILL);
    int ws;
    ::waitpid(pid, &ws, 0);
  };

  // (1) A client refuses a server of another uid before sending anything, and
  // accepts it only when that uid is named.
  {
    const std::string path = shared + "/squat.sock";
    int rep[2];
    ASSERT_EQ(::pipe(rep), 0);
    const pid_t sq = squat(path, 2, rep[1]);
    ::close(rep[1]);
    char ready;
    ASSERT_EQ(::read(rep[0], &ready, 1), 1);
    ClientConfig cc;
    cc.socket_path = path;
    cc.timeout = 3s;
    Result<std::unique_ptr<Client>> c = Client::Connect(cc);
    ASSERT_FALSE(c.ok());
    ExpectReason(c.status(), StatusCode::kPermissionDenied, "uid " + S);
    uint32_t got = ~0u;
    ASSERT_EQ(::read(rep[0], &got, sizeof got), static_cast<ssize_t>(sizeof got));
    EXPECT_EQ(got, 0u) << "the squatter received bytes from a refusing client";
    cc.server_uid = squatter->first;
    c = Client::Connect(cc);
    EXPECT_FALSE(c.ok());  // the squatter speaks no protocol
    ASSERT_EQ(::read(rep[0], &got, sizeof got), static_cast<ssize_t>(sizeof got));
    EXPECT_GT(got, 0u) << "with server_uid named, the client talks to that uid";
    ::close(rep[0]);
    reap(sq);
  }

  // The Manager as the victim user, on its default socket (no XDG_RUNTIME_DIR).
  if (::access(manager_bin_.c_str(), R_OK | X_OK) != 0) GTEST_SKIP() << "binary not readable";
  auto run_as_victim = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = {"/usr/bin/setpriv",
                                     "--reuid",
                                     V,
                                     "--regid",
                                     V,
                                     "--clear-groups",
                                     "env",
                                     "-u",
                                     "XDG_RUNTIME_DIR",
                                     manager_bin_,
                                     "--pool-size",
                                     "8mib",
                                     "--metrics-port",
                                     "0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return std::make_unique<Proc>("manager as " + V, argv);
  };
  const std::string victim_dir = "/tmp/orbitkv-" + V;
  std::filesystem::remove_all(victim_dir);
  {
    std::unique_ptr<Proc> probe = run_as_victim({"--version"});
    std::optional<int> st = probe->WaitExit(10s);
    if (!st || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
      GTEST_SKIP() << "cannot run the Manager as uid " << V << ": " << probe->Tail();
    }
  }
  // (2) A squatter's directory at the default path: the Manager refuses to
  // start and names the squatter's uid.
  ASSERT_EQ(::mkdir(victim_dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(victim_dir.c_str(), 0777), 0);
  ASSERT_EQ(::chown(victim_dir.c_str(), squatter->first, squatter->second), 0);
  {
    std::unique_ptr<Proc> m = run_as_victim({});
    std::optional<int> st = m->WaitExit(20s);
    ASSERT_TRUE(st && WIFEXITED(*st)) << m->Tail();
    EXPECT_NE(WEXITSTATUS(*st), 0);
    m->WaitEof(5s);
    EXPECT_NE(m->Output().find("owned by uid " + S), std::string::npos) << m->Output();
  }
  std::filesystem::remove_all(victim_dir);
  // (3) No squatter: the Manager creates a private directory; a stale socket
  // of a killed Manager is replaced on restart.
  for (int round = 0; round < 2; ++round) {
    std::unique_ptr<Proc> m = run_as_victim({});
    ASSERT_TRUE(m->WaitOutput("orbitkv-cache-manager ready", 20s)) << m->Tail();
    struct stat st {};
    ASSERT_EQ(::lstat(victim_dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_uid, victim->first);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    m->Signal(SIGKILL);  // leaves its socket behind
    m->WaitExit(10s);
  }
  std::filesystem::remove_all(victim_dir);
  // (4) A live socket of another user on an explicit --socket: the Manager
  // refuses it and names that user's uid.
  {
    const std::string path = shared + "/live.sock";
    int rep[2];
    ASSERT_EQ(::pipe(rep), 0);
    const pid_t sq = squat(path, 1, rep[1]);
    ::close(rep[1]);
    char ready;
    ASSERT_EQ(::read(rep[0], &ready, 1), 1);
    std::unique_ptr<Proc> m = run_as_victim({"--socket", path});
    std::optional<int> st = m->WaitExit(20s);
    ASSERT_TRUE(st && WIFEXITED(*st)) << m->Tail();
    EXPECT_NE(WEXITSTATUS(*st), 0);
    m->WaitEof(5s);
    EXPECT_NE(m->Output().find("uid " + S), std::string::npos) << m->Output();
    ::close(rep[0]);
    reap(sq);
  }
}

}  // namespace
}  // namespace orbitkv::integration
