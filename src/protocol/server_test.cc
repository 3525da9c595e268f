#include "protocol/server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "protocol/protocol_test_util.h"
#include "protocol/wire.h"
#include "testing/temp_dir.h"

namespace orbitkv::protocol {
namespace {

using orbitkv::testing::TempDir;
using testing::RecordingHandler;

// A raw client socket connected to `path` (-1 on failure).
UniqueFd RawConnect(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return {};
  return fd;
}

// True when the server closes `fd` within the timeout (recv sees EOF/reset).
bool ClosedByPeer(int fd, int timeout_ms = 5000) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  const ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// The reason the server sent before closing `fd` (an ErrorReply with id 0),
// after which the stream must end. OK when it just closed; Internal when
// something else came.
Status ReasonThenClose(int fd, int timeout_ms = 5000) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  Result<Frame> f = RecvFrame(fd, 1 << 20, 0);
  if (!f.ok()) {
    return f.status().IsCancelled() ? Status::OK() : Status::Internal(f.status().ToString());
  }
  Result<DecodedMessage> m = DecodeMessage(f->payload);
  if (!m.ok() || m->id != 0 || !std::holds_alternative<ErrorReply>(m->body)) {
    return Status::Internal("not a closing ErrorReply");
  }
  if (!ClosedByPeer(fd, timeout_ms)) return Status::Internal("the server did not close");
  return std::get<ErrorReply>(m->body).status;
}

// Expects a closing reason of `code` whose message contains `needle`.
void ExpectReason(int fd, StatusCode code, std::string_view needle) {
  const Status why = ReasonThenClose(fd);
  EXPECT_EQ(why.code(), code) << why.ToString();
  EXPECT_NE(why.message().find(needle), std::string_view::npos) << why.ToString();
}

// Two sessions are open at a limit of two: once `leaving` closes, a third
// connection is admitted.
void ExpectRoomAgainOnceOneLeaves(SocketServer& server, RecordingHandler& h, UniqueFd* leaving) {
  leaving->Reset();
  ASSERT_TRUE(h.WaitCloses(1));
  for (int i = 0; i < 100 && server.Stats().active != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  UniqueFd d = RawConnect(server.path());
  EXPECT_TRUE(h.WaitOpens(3));
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ServerOptions Options(const TempDir& dir) {
  ServerOptions o;
  o.path = dir.File("manager.sock");
  return o;
}

TEST(SocketServerTest, SocketIsOwnerOnly) {
  TempDir dir;
  RecordingHandler h;
  const mode_t old_mask = ::umask(0);  // the mode must not depend on the process umask
  auto server = SocketServer::Start(Options(dir), &h);
  ::umask(old_mask);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  struct stat st {};
  ASSERT_EQ(::lstat((*server)->path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  (*server)->Stop();
  EXPECT_NE(::access((*server)->path().c_str(), F_OK), 0) << "Stop removes the socket file";
}

TEST(SocketServerTest, RefusesToReplaceARegularFile) {
  TempDir dir;
  const std::string path = dir.File("manager.sock");
  {
    std::ofstream out(path);
    out << "precious data";
  }
  RecordingHandler h;
  ServerOptions o;
  o.path = path;
  auto server = SocketServer::Start(o, &h);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kFailedPrecondition) << server.status().ToString();
  EXPECT_EQ(Slurp(path), "precious data");
}

TEST(SocketServerTest, RefusesASymlinkAndADirectory) {
  TempDir dir;
  const std::string target = dir.File("target");
  {
    std::ofstream out(target);
    out << "keep";
  }
  const std::string link = dir.File("link.sock");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  RecordingHandler h;
  ServerOptions o;
  o.path = link;
  auto s1 = SocketServer::Start(o, &h);
  EXPECT_EQ(s1.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Slurp(target), "keep");
  o.path = dir.File("subdir");
  ASSERT_EQ(::mkdir(o.path.c_str(), 0700), 0);
  auto s2 = SocketServer::Start(o, &h);
  EXPECT_EQ(s2.status().code(), StatusCode::kFailedPrecondition);
}

TEST(SocketServerTest, ReplacesAStaleSocketButNotALiveOne) {
  TempDir dir;
  const std::string path = dir.File("manager.sock");
  {
    // A socket file whose server is gone.
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  RecordingHandler h;
  ServerOptions o;
  o.path = path;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto second = SocketServer::Start(o, &h);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  // The first server still works.
  UniqueFd c = RawConnect(path);
  ASSERT_TRUE(c);
  EXPECT_TRUE(h.WaitOpens(1));
}

TEST(SocketServerTest, PathTooLong) {
  RecordingHandler h;
  ServerOptions o;
  o.path = "/tmp/" + std::string(200, 'p');
  EXPECT_EQ(SocketServer::Start(o, &h).status().code(), StatusCode::kInvalidArgument);
}

TEST(SocketServerTest, SameUidPeerIsAcceptedWithCredentials) {
  TempDir dir;
  RecordingHandler h;
  std::promise<std::tuple<pid_t, uid_t, uint64_t>> seen;
  h.on_frame = [&](Session& s, Frame&& f) {
    seen.set_value({s.peer_pid(), s.peer_uid(), s.id()});
    ASSERT_TRUE(s.Send(f.payload).ok());  // echo
  };
  auto server = SocketServer::Start(Options(dir), &h);
  ASSERT_TRUE(server.ok());
  UniqueFd c = RawConnect((*server)->path());
  ASSERT_TRUE(c);
  const std::vector<uint8_t> ping = {'p', 'i', 'n', 'g'};
  ASSERT_TRUE(SendFrame(c.get(), ping).ok());
  auto reply = RecvFrame(c.get(), 1024, 0);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->payload, ping);
  auto [pid, uid, id] = seen.get_future().get();
  EXPECT_EQ(pid, ::getpid());
  EXPECT_EQ(uid, ::geteuid());
  EXPECT_GE(id, 1u);
  EXPECT_EQ((*server)->Stats().accepted, 1u);
  EXPECT_EQ((*server)->Stats().rejected_peer, 0u);
}

TEST(SocketServerTest, OtherUidIsRejected) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  RecordingHandler h;
  auto server = SocketServer::Start(Options(dir), &h);
  ASSERT_TRUE(server.ok());
  // Let the other user reach the socket, so that only SO_PEERCRED stops it.
  ASSERT_EQ(::chmod((*server)->path().c_str(), 0666), 0);
  const std::string path = (*server)->path();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const int pipe_r = pipe_fds[0], pipe_w = pipe_fds[1];
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls from here on.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(3);
    // Forward what the server says (its reason, then EOF) to the parent.
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) {
      if (::write(pipe_w, buf, static_cast<size_t>(n)) != n) ::_exit(5);
    }
    ::_exit(n == 0 || (n < 0 && errno == ECONNRESET) ? 0 : 4);
  }
  ::close(pipe_w);
  UniqueFd from_child(pipe_r);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_r, buf, sizeof(buf))) > 0;) said.append(buf, n);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  // The refused peer was told why: PermissionDenied naming its uid.
  ASSERT_GT(said.size(), kFrameHeaderBytes);
  Result<DecodedMessage> m =
      DecodeMessage(std::span(reinterpret_cast<const uint8_t*>(said.data()) + kFrameHeaderBytes,
                              said.size() - kFrameHeaderBytes));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Status why = std::get<ErrorReply>(m->body).status;
  EXPECT_EQ(why.code(), StatusCode::kPermissionDenied) << why.ToString();
  EXPECT_NE(why.message().find("uid 65534"), std::string_view::npos) << why.ToString();
  EXPECT_EQ((*server)->Stats().rejected_peer, 1u);
  EXPECT_EQ((*server)->Stats().accepted, 0u);
  EXPECT_TRUE(h.opens().empty());
}

TEST(SocketServerTest, StopClosesEverySessionOnce) {
  TempDir dir;
  RecordingHandler h;
  auto server = SocketServer::Start(Options(dir), &h);
  ASSERT_TRUE(server.ok());
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 5; ++i) clients.push_back(RawConnect((*server)->path()));
  ASSERT_TRUE(h.WaitOpens(5));
  // One client leaves on its own first.
  clients[0].Reset();
  ASSERT_TRUE(h.WaitCloses(1));
  EXPECT_EQ((*server)->Stats().active, 4u);
  (*server)->Stop();
  auto opens = h.opens();
  auto closes = h.closes();
  EXPECT_EQ(opens.size(), 5u);
  EXPECT_EQ(closes.size(), 5u);
  for (auto& [id, n] : opens) {
    EXPECT_EQ(n, 1) << "session " << id;
    EXPECT_EQ(closes[id], 1) << "session " << id;
  }
  for (size_t i = 1; i < clients.size(); ++i) EXPECT_TRUE(ClosedByPeer(clients[i].get()));
  // A session kept by the handler can no longer send.
  for (auto& s : h.sessions()) {
    EXPECT_TRUE(s->closed());
    EXPECT_TRUE(s->Send(std::vector<uint8_t>{1}).IsCancelled());
  }
  (*server)->Stop();  // idempotent
  EXPECT_EQ(h.closes().size(), 5u);
}

TEST(SocketServerTest, AsyncReplyAfterOnFrameAndSendAfterClose) {
  TempDir dir;
  RecordingHandler h;
  std::vector<std::thread> workers;
  std::mutex wmu;
  h.on_frame = [&](Session& s, Frame&& f) {
    // Reply later from a worker, as a restore does.
    std::lock_guard lock(wmu);
    workers.emplace_back([session = s.Ref(), payload = std::move(f.payload)] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_TRUE(session->Send(payload).ok());
    });
  };
  auto server = SocketServer::Start(Options(dir), &h);
  ASSERT_TRUE(server.ok());
  UniqueFd c = RawConnect((*server)->path());
  ASSERT_TRUE(SendFrame(c.get(), std::vector<uint8_t>{1, 2, 3}).ok());
  auto reply = RecvFrame(c.get(), 1024, 0);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->payload, (std::vector<uint8_t>{1, 2, 3}));
  {
    std::lock_guard lock(wmu);
    for (auto& t : workers) t.join();
    workers.clear();
  }
  // The client leaves; a late worker's Send is Cancelled, not a crash.
  auto session = h.sessions().at(0);
  c.Reset();
  ASSERT_TRUE(h.WaitCloses(1));
  EXPECT_TRUE(session->Send(std::vector<uint8_t>{4}).IsCancelled());
}

TEST(SocketServerTest, MaxConnections) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.max_connections = 2;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  UniqueFd a = RawConnect(o.path), b = RawConnect(o.path);
  ASSERT_TRUE(h.WaitOpens(2));
  UniqueFd c = RawConnect(o.path);
  ASSERT_TRUE(c);
  ExpectReason(c.get(), StatusCode::kResourceExhausted, "--max-connections");
  EXPECT_EQ((*server)->Stats().rejected_full, 1u);
  ExpectRoomAgainOnceOneLeaves(**server, h, &a);
}

TEST(SocketServerTest, OversizedFrameClosesTheSession) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.max_frame_payload = 16;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  UniqueFd c = RawConnect(o.path);
  ASSERT_TRUE(SendFrame(c.get(), std::vector<uint8_t>(17, 0)).ok());
  EXPECT_TRUE(h.WaitCloses(1));
  ExpectReason(c.get(), StatusCode::kResourceExhausted, "frame of 17 bytes");
  EXPECT_EQ((*server)->Stats().rejected_frame, 1u);
}

TEST(SocketServerTest, TooManyFdsGetAReason) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.max_fds_per_frame = 2;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  UniqueFd c = RawConnect(o.path);
  std::vector<UniqueFd> mems;
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    mems.push_back(testing::MemfdWith("x"));
    fds.push_back(mems.back().get());
  }
  ASSERT_TRUE(SendFrame(c.get(), std::vector<uint8_t>(8, 0), fds).ok());
  ExpectReason(c.get(), StatusCode::kResourceExhausted, "3 file descriptors");
  EXPECT_EQ(h.frames(), 0);
}

TEST(SocketServerTest, PerUidConnectionLimitGetsAReason) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.max_connections_per_uid = 2;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  UniqueFd a = RawConnect(o.path), b = RawConnect(o.path);
  ASSERT_TRUE(h.WaitOpens(2));
  UniqueFd c = RawConnect(o.path);
  ExpectReason(c.get(), StatusCode::kResourceExhausted, "--max-connections-per-uid");
  ExpectRoomAgainOnceOneLeaves(**server, h, &a);
}

// The old server ran one reader thread per connection: 200 idle connections
// were 200 threads.
TEST(SocketServerTest, IdleConnectionsTakeNoThreads) {
  TempDir dir;
  RecordingHandler h;
  auto server = SocketServer::Start(Options(dir), &h);
  ASSERT_TRUE(server.ok());
  const int before = testing::CountThreads();
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 200; ++i) clients.push_back(RawConnect((*server)->path()));
  ASSERT_TRUE(h.WaitOpens(200));
  EXPECT_LE(testing::CountThreads(), before) << "threads grew with idle connections";
  // They are all served: each gets its echo.
  h.on_frame = [](Session& s, Frame&& f) { s.Send(f.payload).IgnoreError("test"); };
  for (auto& c : clients) ASSERT_TRUE(SendFrame(c.get(), std::vector<uint8_t>{7}).ok());
  for (auto& c : clients) {
    auto r = RecvFrame(c.get(), 16, 0);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
}

// Announced payloads count against max_buffered_bytes as soon as their header
// arrives; a frame that does not fit waits (unread) until room returns.
TEST(SocketServerTest, FramesBeyondTheBufferCapWaitTheirTurn) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.max_frame_payload = 1 << 20;
  o.max_buffered_bytes = 1 << 20;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  UniqueFd a = RawConnect(o.path), b = RawConnect(o.path);
  ASSERT_TRUE(h.WaitOpens(2));
  auto wait_for = [&](auto pred) {
    for (int i = 0; i < 400 && !pred(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  // a: a whole-cap frame, half sent.
  const uint64_t big = 1 << 20;
  const uint8_t hdr[4] = {0, 0, 0x10, 0};
  ASSERT_EQ(::write(a.get(), hdr, 4), 4);
  std::vector<uint8_t> half(big / 2, 1);
  ASSERT_EQ(::write(a.get(), half.data(), half.size()), static_cast<ssize_t>(half.size()));
  wait_for([&] { return (*server)->Stats().buffered_bytes == big; });
  EXPECT_EQ((*server)->Stats().buffered_bytes, big);
  // b: a small frame, which must wait for a.
  ASSERT_TRUE(SendFrame(b.get(), std::vector<uint8_t>(100, 2)).ok());
  wait_for([&] { return (*server)->Stats().waiting_for_buffer == 1; });
  EXPECT_EQ((*server)->Stats().waiting_for_buffer, 1u);
  EXPECT_EQ(h.frames(), 0);
  // a completes: both are handled, and everything is returned.
  ASSERT_EQ(::write(a.get(), half.data(), half.size()), static_cast<ssize_t>(half.size()));
  ASSERT_TRUE(h.WaitFrames(2));
  wait_for([&] { return (*server)->Stats().buffered_bytes == 0; });
  EXPECT_EQ((*server)->Stats().buffered_bytes, 0u);
  EXPECT_EQ((*server)->Stats().waiting_for_buffer, 0u);
}

TEST(SocketServerTest, UnfinishedFrameTimesOutWithAReasonAndFreesItsBuffer) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.frame_timeout = std::chrono::milliseconds(300);
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  UniqueFd a = RawConnect(o.path);
  const uint8_t hdr[4] = {0, 0, 0x10, 0};  // 1 MiB announced, 10 bytes sent
  ASSERT_EQ(::write(a.get(), hdr, 4), 4);
  ASSERT_EQ(::write(a.get(), "0123456789", 10), 10);
  ExpectReason(a.get(), StatusCode::kDeadlineExceeded, "--frame-timeout");
  for (int i = 0; i < 200 && (*server)->Stats().buffered_bytes != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ((*server)->Stats().buffered_bytes, 0u);
  EXPECT_EQ((*server)->Stats().closed_timeout, 1u);
}

TEST(SocketServerTest, IdleTimeoutClosesWithAReasonUnlessTheHandlerKeepsTheSession) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o = Options(dir);
  o.idle_timeout = std::chrono::milliseconds(300);
  std::atomic<uint64_t> keep{0};
  h.may_close_idle = [&](const Session& s) { return s.id() != keep.load(); };
  UniqueFd kept;
  auto server = SocketServer::Start(o, &h);
  ASSERT_TRUE(server.ok());
  keep = 1;  // session ids start at 1: the first connection is kept
  kept = RawConnect(o.path);
  ASSERT_TRUE(h.WaitOpens(1));
  UniqueFd idle = RawConnect(o.path);
  ExpectReason(idle.get(), StatusCode::kDeadlineExceeded, "--idle-timeout");
  // The kept one is still served.
  h.on_frame = [](Session& s, Frame&& f) { s.Send(f.payload).IgnoreError("test"); };
  ASSERT_TRUE(SendFrame(kept.get(), std::vector<uint8_t>{1}).ok());
  EXPECT_TRUE(RecvFrame(kept.get(), 16, 0).ok());
}

TEST(SocketServerTest, HandlerMayCloseItsSession) {
  TempDir dir;
  RecordingHandler h;
  h.on_frame = [](Session& s, Frame&&) { s.Close(); };
  auto server = SocketServer::Start(Options(dir), &h);
  ASSERT_TRUE(server.ok());
  UniqueFd c = RawConnect((*server)->path());
  ASSERT_TRUE(SendFrame(c.get(), std::vector<uint8_t>{1}).ok());
  EXPECT_TRUE(h.WaitCloses(1));
  EXPECT_TRUE(ClosedByPeer(c.get()));
  EXPECT_EQ(h.closes().begin()->second, 1);
}

// Process CPU time (every thread), for the spin tests.
std::chrono::nanoseconds ProcessCpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// ServerOptions::worker_spin also keeps the loop polling after it handled
// events: a connection's next frame, sent just after its reply came, is
// read without waking the loop. With the spin off the loop always blocks.
// Once the calls stop the server goes quiet: it spins only after activity.
TEST(SocketServerTest, TheLoopPollsForTheNextFrameRightAfterAReplyAndNeverWhileIdle) {
  constexpr int kCalls = 200;
  for (const auto spin : {std::chrono::microseconds(1000), std::chrono::microseconds(0)}) {
    TempDir dir;
    RecordingHandler h;
    h.on_frame = [](Session& s, Frame&& f) { s.Send(f.payload).IgnoreError("test"); };
    ServerOptions o = Options(dir);
    o.worker_spin = spin;
    auto server = SocketServer::Start(o, &h);
    ASSERT_TRUE(server.ok());
    UniqueFd c = RawConnect((*server)->path());
    for (int i = 0; i < kCalls; ++i) {
      ASSERT_TRUE(SendFrame(c.get(), std::vector<uint8_t>{7}).ok());
      ASSERT_TRUE(RecvFrame(c.get(), 16, 0).ok());
    }
    const uint64_t polled = (*server)->Stats().frames_polled;
    if (spin.count() > 0) {
      EXPECT_GE(polled, kCalls / 4u) << "of " << kCalls << " frames";
    } else {
      EXPECT_EQ(polled, 0u);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past every window
    const auto cpu0 = ProcessCpu();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_LT(ProcessCpu() - cpu0, std::chrono::milliseconds(30)) << "spinning while idle";
  }
}

}  // namespace
}  // namespace orbitkv::protocol
