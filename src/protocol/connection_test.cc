#include "protocol/connection.h"

#include <gtest/gtest.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "protocol/protocol_test_util.h"
#include "protocol/server.h"
#include "protocol/wire.h"
#include "testing/temp_dir.h"

namespace orbitkv::protocol {
namespace {

using orbitkv::testing::TempDir;
using testing::MemfdWith;
using testing::RecordingHandler;
using namespace std::chrono_literals;

template <typename T>
T Decode(const Result<Frame>& frame, uint64_t want_id) {
  EXPECT_TRUE(frame.ok()) << frame.status().ToString();
  if (!frame.ok()) return T{};
  auto d = DecodeMessage(frame->payload);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return T{};
  EXPECT_EQ(d->id, want_id);
  const T* m = std::get_if<T>(&d->body);
  EXPECT_NE(m, nullptr) << MessageName(d->body);
  return m ? *m : T{};
}

struct Fixture {
  TempDir dir;
  RecordingHandler handler;
  std::unique_ptr<SocketServer> server;
  std::unique_ptr<ClientConnection> client;

  void Start() {
    ServerOptions o;
    o.path = dir.File("m.sock");
    auto s = SocketServer::Start(o, &handler);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    auto c = ClientConnection::Connect(o.path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client = std::move(c).value();
  }
};

// The server's reason for refusing a connection reaches the caller as its
// typed status, not as "peer closed" (the old client dropped id-0 replies).
TEST(ClientConnectionTest, ServerReasonFailsTheCallWithItsStatus) {
  TempDir dir;
  RecordingHandler h;
  ServerOptions o;
  o.path = dir.File("m.sock");
  o.max_connections = 1;
  auto s = SocketServer::Start(o, &h);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto first = ClientConnection::Connect(o.path);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(h.WaitOpens(1));
  auto second = ClientConnection::Connect(o.path);
  ASSERT_TRUE(second.ok());
  const uint64_t id = (*second)->NextId();
  Result<Frame> r =
      (*second)->Call(EncodeRequest(id, HelloRequest{}), {}, id, std::chrono::seconds(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("--max-connections"), std::string_view::npos);
  EXPECT_TRUE((*second)->closed());
  EXPECT_FALSE((*first)->closed());
}

TEST(ClientConnectionTest, WaitAfterATimeoutStillGetsTheReply) {
  Fixture f;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  f.handler.on_frame = [&](Session& s, Frame&& frame) {
    std::unique_lock l(mu);
    cv.wait(l, [&] { return release; });
    s.Send(frame.payload).IgnoreError("test");
  };
  f.Start();
  const uint64_t id = f.client->NextId();
  const std::vector<uint8_t> req = EncodeRequest(id, HelloRequest{});
  ASSERT_TRUE(f.client->Start(req, {}, id).ok());
  EXPECT_EQ(f.client->Wait(id, 50ms).status().code(), StatusCode::kDeadlineExceeded);
  {
    std::lock_guard l(mu);
    release = true;
  }
  cv.notify_all();
  Result<Frame> r = f.client->Wait(id, 5s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(PeekEnvelopeId(r->payload), id);
  // Done: the id is no longer outstanding.
  EXPECT_EQ(f.client->Wait(id, 10ms).status().code(), StatusCode::kInvalidArgument);
}

TEST(ClientConnectionTest, ConnectToNothingIsUnavailable) {
  TempDir dir;
  auto c = ClientConnection::Connect(dir.File("nobody.sock"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
}

TEST(ClientConnectionTest, ConcurrentCallsGetTheirOwnRepliesOutOfOrder) {
  Fixture f;
  constexpr int kThreads = 8;
  constexpr int kCallsPerThread = 25;
  // The server holds requests until a batch of kThreads is in, then answers
  // the batch in reverse order of arrival.
  std::mutex mu;
  std::vector<std::pair<std::shared_ptr<Session>, DecodedMessage>> batch;
  f.handler.on_frame = [&](Session& s, Frame&& frame) {
    auto d = DecodeMessage(frame.payload);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    std::vector<std::pair<std::shared_ptr<Session>, DecodedMessage>> ready;
    {
      std::lock_guard lock(mu);
      batch.emplace_back(s.Ref(), std::move(d).value());
      if (batch.size() < kThreads) return;
      ready.swap(batch);
    }
    std::reverse(ready.begin(), ready.end());
    for (auto& [session, msg] : ready) {
      const auto& q = std::get<QueryRequest>(msg.body);
      QueryResult r;
      r.query = msg.id * 1000 + q.group_id;  // proves which request this answers
      ASSERT_TRUE(session->Send(EncodeReply(msg.id, r)).ok());
    }
  };
  f.Start();
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        const uint64_t id = f.client->NextId();
        QueryRequest q;
        q.group_id = static_cast<uint32_t>(t);
        auto reply = f.client->Call(EncodeRequest(id, q), {}, id, 10s);
        auto r = Decode<QueryResult>(reply, id);
        if (r.query == id * 1000 + static_cast<uint64_t>(t)) good++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kThreads * kCallsPerThread);
}

TEST(ClientConnectionTest, CancelRestoreOvertakesABlockedRestore) {
  Fixture f;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t held_restore = 0;  // envelope id of the restore the server holds
  bool released = false;
  std::thread restore_worker;
  f.handler.on_frame = [&](Session& s, Frame&& frame) {
    auto d = DecodeMessage(frame.payload);
    ASSERT_TRUE(d.ok());
    if (auto* r = std::get_if<RestoreRequest>(&d->body)) {
      // A restore replies from a worker once it is done (here: cancelled).
      std::lock_guard lock(mu);
      held_restore = d->id;
      restore_worker = std::thread([&, session = s.Ref(), id = d->id, n = r->blocks.size()] {
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return released; });
        }
        RestoreResult res;
        for (uint32_t b = 0; b < n; ++b) {
          res.blocks.push_back({b, Tier::kSsd, Status::Cancelled("restore cancelled")});
        }
        EXPECT_TRUE(session->Send(EncodeReply(id, res)).ok());
      });
    } else if (auto* c = std::get_if<CancelRestoreRequest>(&d->body)) {
      std::lock_guard lock(mu);
      // Reply to the cancel first, then release the restore.
      EXPECT_TRUE(
          s.Send(EncodeReply(d->id, CancelRestoreReply{c->restore_id == held_restore})).ok());
      released = true;
      cv.notify_all();
    }
  };
  f.Start();
  const uint64_t rid = f.client->NextId();
  RestoreRequest rr;
  rr.blocks = {0, 1};
  rr.pages = {5, 6};
  std::thread restorer([&] {
    auto reply = f.client->Call(EncodeRequest(rid, rr), {}, rid, 10s);
    auto r = Decode<RestoreResult>(reply, rid);
    ASSERT_EQ(r.blocks.size(), 2u);
    EXPECT_TRUE(r.blocks[1].status.IsCancelled());
  });
  // Wait until the server holds the restore, then cancel it from this thread.
  for (int i = 0; i < 5000; ++i) {
    {
      std::lock_guard lock(mu);
      if (held_restore != 0) break;
    }
    std::this_thread::sleep_for(2ms);
  }
  const uint64_t cid = f.client->NextId();
  auto cancel = f.client->Call(EncodeRequest(cid, CancelRestoreRequest{rid}), {}, cid, 10s);
  EXPECT_TRUE(Decode<CancelRestoreReply>(cancel, cid).cancelled);
  restorer.join();
  restore_worker.join();
}

TEST(ClientConnectionTest, TimeoutThenLateReplyIsDropped) {
  Fixture f;
  std::mutex mu;
  std::vector<std::pair<std::shared_ptr<Session>, uint64_t>> held;
  f.handler.on_frame = [&](Session& s, Frame&& frame) {
    auto d = DecodeMessage(frame.payload);
    ASSERT_TRUE(d.ok());
    const auto& u = std::get<UnregisterRequest>(d->body);
    if (u.instance == 1) {  // "slow": answered only with the next request
      std::lock_guard lock(mu);
      held.emplace_back(s.Ref(), d->id);
      return;
    }
    std::lock_guard lock(mu);
    for (auto& [session, id] : held) {
      EXPECT_TRUE(session->Send(EncodeReply(id, UnregisterReply{})).ok());
    }
    held.clear();
    EXPECT_TRUE(s.Send(EncodeReply(d->id, RegisterReply{42})).ok());
  };
  f.Start();
  const uint64_t slow = f.client->NextId();
  auto r = f.client->Call(EncodeRequest(slow, UnregisterRequest{1}), {}, slow, 50ms);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  const uint64_t fast = f.client->NextId();
  auto r2 = f.client->Call(EncodeRequest(fast, UnregisterRequest{2}), {}, fast, 10s);
  EXPECT_EQ(Decode<RegisterReply>(r2, fast).instance, 42u);
}

TEST(ClientConnectionTest, BadIds) {
  Fixture f;
  std::mutex mu;
  std::condition_variable cv;
  bool got = false;
  f.handler.on_frame = [&](Session&, Frame&&) {
    std::lock_guard lock(mu);
    got = true;
    cv.notify_all();
  };  // never replies
  f.Start();
  EXPECT_EQ(f.client->Call(EncodeRequest(0, UnregisterRequest{}), {}, 0, 10ms).status().code(),
            StatusCode::kInvalidArgument);
  std::thread waiter([&] {
    auto r = f.client->Call(EncodeRequest(5, UnregisterRequest{}), {}, 5, 10s);
    EXPECT_TRUE(r.status().IsCancelled()) << r.status().ToString();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return got; }));
  }
  EXPECT_EQ(f.client->Call(EncodeRequest(5, UnregisterRequest{}), {}, 5, 10ms).status().code(),
            StatusCode::kInvalidArgument);
  f.client->Close();  // fails the waiter with Cancelled
  waiter.join();
  EXPECT_TRUE(
      f.client->Call(EncodeRequest(6, UnregisterRequest{}), {}, 6, 10ms).status().IsCancelled());
}

TEST(ClientConnectionTest, ServerStopCancelsCallers) {
  Fixture f;
  std::atomic<int> arrived{0};
  f.handler.on_frame = [&](Session&, Frame&&) { arrived++; };  // never replies
  f.Start();
  std::vector<std::thread> callers;
  std::atomic<int> cancelled{0};
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&] {
      const uint64_t id = f.client->NextId();
      auto r = f.client->Call(EncodeRequest(id, QueryRequest{}), {}, id, 30s);
      if (r.status().IsCancelled()) cancelled++;
    });
  }
  for (int i = 0; i < 1000 && arrived.load() < 4; ++i) std::this_thread::sleep_for(2ms);
  ASSERT_EQ(arrived.load(), 4);
  f.server->Stop();
  for (auto& t : callers) t.join();
  EXPECT_EQ(cancelled.load(), 4);
  EXPECT_TRUE(f.client->closed());
  const uint64_t id = f.client->NextId();
  EXPECT_TRUE(f.client->Call(EncodeRequest(id, QueryRequest{}), {}, id, 1s).status().IsCancelled());
}

TEST(ClientConnectionTest, RegisterWithMemfdsEndToEnd) {
  Fixture f;
  f.handler.on_frame = [&](Session& s, Frame&& frame) {
    auto d = DecodeMessage(frame.payload);
    ASSERT_TRUE(d.ok());
    Status fds_ok = CheckAttachedFds(d->body, frame.fds.size());
    if (!fds_ok.ok()) {
      EXPECT_TRUE(s.Send(EncodeError(d->id, fds_ok)).ok());
      return;
    }
    const auto& reg = std::get<RegisterRequest>(d->body);
    // Map each region and check what the engine wrote there.
    bool all_good = true;
    for (size_t i = 0; i < frame.fds.size(); ++i) {
      const size_t len = reg.layout.region_bytes[i];
      void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, frame.fds[i].get(), 0);
      ASSERT_NE(p, MAP_FAILED);
      all_good &= static_cast<const char*>(p)[len - 1] == static_cast<char>('A' + i);
      ::munmap(p, len);
    }
    EXPECT_TRUE(s.Send(EncodeReply(d->id, RegisterReply{all_good ? 7u : 0u})).ok());
  };
  f.Start();
  RegisterRequest reg;
  reg.ns = "test";
  reg.layout.num_pages = 1;
  std::vector<UniqueFd> mems;
  std::vector<int> raw;
  for (int i = 0; i < 3; ++i) {
    const size_t len = 4096 * (i + 1);
    std::string data(len, '\0');
    data[len - 1] = static_cast<char>('A' + i);
    mems.push_back(MemfdWith(data));
    raw.push_back(mems.back().get());
    reg.layout.region_bytes.push_back(len);
  }
  uint64_t id = f.client->NextId();
  auto reply = f.client->Call(EncodeRequest(id, reg), raw, id, 10s);
  EXPECT_EQ(Decode<RegisterReply>(reply, id).instance, 7u);
  // Wrong fd count: a clean ErrorReply.
  id = f.client->NextId();
  auto bad = f.client->Call(EncodeRequest(id, reg), std::span(raw).first(2), id, 10s);
  auto err = Decode<ErrorReply>(bad, id);
  EXPECT_EQ(err.status.code(), StatusCode::kInvalidArgument);
}

// A CUDA register carries its regions as IPC handles in the message: no fds.
// One that also brings fds is refused (and the fds are closed with the frame).
TEST(ClientConnectionTest, CudaRegisterWithIpcHandlesEndToEnd) {
  Fixture f;
  std::mutex mu;
  std::vector<std::array<uint8_t, 64>> seen;
  f.handler.on_frame = [&](Session& s, Frame&& frame) {
    auto d = DecodeMessage(frame.payload);
    if (!d.ok()) {
      EXPECT_TRUE(s.Send(EncodeError(PeekEnvelopeId(frame.payload).value_or(0), d.status())).ok());
      return;
    }
    if (Status st = CheckAttachedFds(d->body, frame.fds.size()); !st.ok()) {
      EXPECT_TRUE(s.Send(EncodeError(d->id, st)).ok());
      return;
    }
    {
      std::lock_guard lock(mu);
      seen = std::get<RegisterRequest>(d->body).ipc_handles;
    }
    EXPECT_TRUE(s.Send(EncodeReply(d->id, RegisterReply{9})).ok());
  };
  f.Start();
  RegisterRequest reg;
  reg.ns = "test";
  reg.device = "cuda:1";
  reg.layout.num_pages = 1;
  for (int i = 0; i < 2; ++i) {
    reg.layout.region_bytes.push_back(1 << 20);
    std::array<uint8_t, 64> h{};
    h.fill(static_cast<uint8_t>(0xA0 + i));
    reg.ipc_handles.push_back(h);
  }
  uint64_t id = f.client->NextId();
  EXPECT_EQ(Decode<RegisterReply>(f.client->Call(EncodeRequest(id, reg), {}, id, 10s), id).instance,
            9u);
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(seen, reg.ipc_handles);
  }

  // Handles and fds on one frame.
  const int before = testing::CountOpenFds();
  {
    UniqueFd a = MemfdWith(std::string(4096, 'a'));
    UniqueFd b = MemfdWith(std::string(4096, 'b'));
    const int raw[] = {a.get(), b.get()};
    id = f.client->NextId();
    auto err = Decode<ErrorReply>(f.client->Call(EncodeRequest(id, reg), raw, id, 10s), id);
    EXPECT_EQ(err.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(err.status.message().find("ipc_handles"), std::string_view::npos)
        << err.status.ToString();
  }
  // The server's copies (same process) close with the frame, just after the
  // reply went out.
  for (int i = 0; i < 500 && testing::CountOpenFds() != before; ++i)
    std::this_thread::sleep_for(2ms);
  EXPECT_EQ(testing::CountOpenFds(), before);

  // A handle short: the decoder's error, naming the field.
  reg.ipc_handles.pop_back();
  id = f.client->NextId();
  auto err = Decode<ErrorReply>(f.client->Call(EncodeRequest(id, reg), {}, id, 10s), id);
  EXPECT_EQ(err.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(err.status.message().find("RegisterInstance.ipc_handles"), std::string_view::npos)
      << err.status.ToString();
}

// ---- Replies read by a spinning caller ------------------------------------------

// A server end the test writes by hand: `peer` is the accepted connection of
// `client`, so a reply can be sent in parts, with fds, or not at all.
struct RawPeer {
  TempDir dir;
  UniqueFd listener;
  UniqueFd peer;
  std::unique_ptr<ClientConnection> client;

  void Start(ClientOptions options) {
    const std::string path = dir.File("raw.sock");
    listener.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(listener);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    ASSERT_EQ(::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(::listen(listener.get(), 4), 0);
    auto c = ClientConnection::Connect(path, std::move(options));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client = std::move(c).value();
    peer.Reset(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(peer);
  }
  // Writes `bytes` whole.
  void Write(std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(peer.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << std::strerror(errno);
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
  }
  // Sends a request (id `id`, or a fresh one) and waits for its reply on
  // another thread, which spins as the client's options say; once that
  // caller is in Wait, runs `meanwhile` (write the reply, close, ...).
  Result<Frame> CallWhile(const std::function<void(uint64_t id)>& meanwhile, uint64_t id = 0) {
    if (id == 0) id = client->NextId();
    Status started = client->Start(EncodeRequest(id, UnregisterRequest{1}), {}, id);
    if (!started.ok()) return started;
    Result<Frame> r = Status::Internal("not waited");
    std::thread waiter([&] { r = client->Wait(id, 30s); });
    std::this_thread::sleep_for(5ms);  // in Wait (spinning) by now
    meanwhile(id);
    waiter.join();
    return r;
  }
  // Reads what the client sent, so that closing the peer is an end of stream
  // and not a reset (unread bytes would make it one).
  void Drain() {
    uint8_t buf[4096];
    while (::recv(peer.get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
  }
  // Waits until the client has read every byte written so far.
  bool WaitConsumed(std::chrono::milliseconds t = 5s) {
    const auto end = std::chrono::steady_clock::now() + t;
    int queued = 0;
    while (::ioctl(peer.get(), SIOCOUTQ, &queued) == 0 && queued > 0) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(100us);
    }
    return queued == 0;
  }
};

// Header and payload of one frame, as the wire carries them.
std::vector<uint8_t> WireFrame(std::span<const uint8_t> payload) {
  std::vector<uint8_t> out(kFrameHeaderBytes + payload.size());
  const auto n = static_cast<uint32_t>(payload.size());
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return out;
}

ClientOptions SpinFor(std::chrono::microseconds spin) {
  ClientOptions o;
  o.spin_wait = spin;
  return o;
}

// A call that failed with `code`, its message naming `needle`.
void ExpectBroken(const Result<Frame>& r, StatusCode code, std::string_view needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string_view::npos) << r.status().ToString();
}

// A larger request's caller spins longer (ClientOptions::spin_wait_per_kib):
// with a 20 ms spin and 1 ms more per KiB, a reply 150 ms after a small
// request finds its caller asleep (the reader thread delivers it), and one
// 150 ms after a 256 KiB request finds its caller still spinning (it reads the
// reply itself; the reader thread stands back while a caller spins).
TEST(ClientConnectionTest, ALargerRequestsCallerSpinsLonger) {
  RawPeer p;
  ClientOptions o = SpinFor(20ms);
  o.spin_wait_per_kib = 1ms;
  o.max_spin_wait = 10s;
  p.Start(std::move(o));
  for (const size_t keys : {size_t{1}, size_t{8192}}) {  // 32 B and 256 KiB of keys
    SCOPED_TRACE(keys);
    QueryRequest q;
    q.instance = 1;
    q.keys.assign(keys, BlockKey{});
    const std::vector<uint8_t> request = EncodeRequest(p.client->NextId(), q);
    const uint64_t id = *PeekEnvelopeId(request);
    const uint64_t before = p.client->frames_read_by_callers();
    std::atomic<bool> waiting{false};
    Result<Frame> r = Status::Internal("not waited");
    // Start may block until the peer reads (a send buffer smaller than the
    // request), so the caller sends and waits on a thread of its own.
    std::thread caller([&] {
      Status st = p.client->Start(request, {}, id);
      waiting = true;
      r = st.ok() ? p.client->Wait(id, 30s) : Result<Frame>(st);
    });
    size_t read = 0;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while ((read < kFrameHeaderBytes + request.size() || !waiting) &&
           std::chrono::steady_clock::now() < give_up) {
      uint8_t buf[65536];
      const ssize_t n = ::recv(p.peer.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) read += static_cast<size_t>(n);
      if (n <= 0) std::this_thread::sleep_for(100us);
    }
    EXPECT_EQ(read, kFrameHeaderBytes + request.size());
    std::this_thread::sleep_for(150ms);
    p.Write(WireFrame(EncodeReply(id, RegisterReply{id})));
    caller.join();
    EXPECT_EQ(Decode<RegisterReply>(r, id).instance, id);
    EXPECT_EQ(p.client->frames_read_by_callers() - before, keys == 1 ? 0u : 1u);
  }
}

// A caller that spins for its own reply reads whatever arrives first and hands
// another caller's reply to that caller (not dropped, not taken as its own).
// Whether the caller or the reader thread reads a frame is a race; the test
// repeats until the caller read both frames once, checking every delivery.
TEST(ClientConnectionTest, AReplyReadByASpinningCallerReachesAnotherWaiter) {
  RawPeer p;
  p.Start(SpinFor(10s));
  bool caller_read_both = false;
  for (int attempt = 0; attempt < 30 && !caller_read_both; ++attempt) {
    const uint64_t other = p.client->NextId();
    const uint64_t mine = p.client->NextId();
    ASSERT_TRUE(p.client->Start(EncodeRequest(other, UnregisterRequest{1}), {}, other).ok());
    ASSERT_TRUE(p.client->Start(EncodeRequest(mine, UnregisterRequest{2}), {}, mine).ok());
    const uint64_t before = p.client->frames_read_by_callers();
    Result<Frame> mine_reply = Status::Internal("not waited");
    std::thread spinner([&] { mine_reply = p.client->Wait(mine, 10s); });
    std::this_thread::sleep_for(5ms);  // spinning by now
    p.Write(WireFrame(EncodeReply(other, RegisterReply{100 + other})));
    ASSERT_TRUE(p.WaitConsumed());
    std::this_thread::sleep_for(2ms);
    p.Write(WireFrame(EncodeReply(mine, RegisterReply{100 + mine})));
    spinner.join();
    EXPECT_EQ(Decode<RegisterReply>(mine_reply, mine).instance, 100 + mine);
    // Already delivered: no spin, no wait.
    EXPECT_EQ(Decode<RegisterReply>(p.client->Wait(other, 0ms), other).instance, 100 + other);
    caller_read_both = p.client->frames_read_by_callers() - before == 2;
  }
  EXPECT_TRUE(caller_read_both) << "the reader thread read every reply first";
}

// One frame in three parts: the reader thread reads the first (no caller
// waits yet), a spinning caller the second, and, once the caller's spin is
// over and it sleeps, the reader thread the third. Both continue the same
// frame, so the reply arrives whole and nothing is misread as a header.
TEST(ClientConnectionTest, AFrameSplitAcrossTheReaderThreadAndASpinningCallerArrivesWhole) {
  RawPeer p;
  p.Start(SpinFor(100ms));
  for (int round = 0; round < 3; ++round) {
    const uint64_t id = p.client->NextId();
    ASSERT_TRUE(p.client->Start(EncodeRequest(id, UnregisterRequest{1}), {}, id).ok());
    RegisterReply reply{id};
    const std::vector<uint8_t> bytes = WireFrame(EncodeReply(id, reply));
    const size_t third = bytes.size() / 3;
    ASSERT_GT(third, kFrameHeaderBytes);
    p.Write(std::span(bytes).first(third));  // header and some payload
    ASSERT_TRUE(p.WaitConsumed());           // by the reader thread: nobody waits
    Result<Frame> r = Status::Internal("not waited");
    const auto wait_start = std::chrono::steady_clock::now();
    std::thread waiter([&] { r = p.client->Wait(id, 10s); });
    std::this_thread::sleep_for(10ms);
    p.Write(std::span(bytes).subspan(third, third));
    ASSERT_TRUE(p.WaitConsumed());
    std::this_thread::sleep_until(wait_start + 200ms);  // the spin is over
    const uint64_t by_callers = p.client->frames_read_by_callers();
    p.Write(std::span(bytes).subspan(2 * third));
    waiter.join();
    EXPECT_EQ(Decode<RegisterReply>(r, id).instance, id);
    EXPECT_EQ(p.client->frames_read_by_callers(), by_callers);  // the reader thread ended it
  }
  EXPECT_FALSE(p.client->closed());
}

// A caller reads fds as RecvFrame did: within max_fds_per_frame they come
// with the frame; more break the connection and are closed.
TEST(ClientConnectionTest, FdsOnAFrameACallerReadsAreKeptOrRefusedAsTheReaderThreadDoes) {
  RawPeer p;
  ClientOptions o = SpinFor(10s);
  o.max_fds_per_frame = 1;
  p.Start(std::move(o));
  bool caller_read = false;
  for (int attempt = 0; attempt < 30 && !caller_read; ++attempt) {
    const uint64_t id = p.client->NextId();
    const uint64_t before = p.client->frames_read_by_callers();
    Result<Frame> r = p.CallWhile(
        [&](uint64_t id) {
          UniqueFd mem = MemfdWith("region " + std::to_string(id));
          const int raw[] = {mem.get()};
          EXPECT_TRUE(SendFrame(p.peer.get(), EncodeReply(id, RegisterReply{id}), raw).ok());
        },
        id);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->fds.size(), 1u);
    EXPECT_EQ(testing::ReadAll(r->fds[0].get()), "region " + std::to_string(id));
    caller_read = p.client->frames_read_by_callers() - before == 1;
  }
  EXPECT_TRUE(caller_read) << "the reader thread read every reply first";

  const int fds_before = testing::CountOpenFds();
  Result<Frame> r = p.CallWhile([&](uint64_t id) {
    UniqueFd a = MemfdWith("a"), b = MemfdWith("b");
    const int raw[] = {a.get(), b.get()};
    EXPECT_TRUE(SendFrame(p.peer.get(), EncodeReply(id, RegisterReply{id}), raw).ok());
  });
  ExpectBroken(r, StatusCode::kInvalidArgument, "more than the limit 1");
  EXPECT_TRUE(p.client->closed());
  EXPECT_EQ(testing::CountOpenFds(), fds_before);  // the client closed both
}

// A reply longer than max_frame_payload breaks the connection with
// InvalidArgument, as RecvFrame reported it, whoever reads its header.
TEST(ClientConnectionTest, AReplyOverThePayloadLimitBreaksTheConnection) {
  for (const auto spin : {std::chrono::microseconds(10s), std::chrono::microseconds(0)}) {
    RawPeer p;
    ClientOptions o = SpinFor(spin);
    o.max_frame_payload = 64;
    p.Start(std::move(o));
    Result<Frame> r = p.CallWhile([&](uint64_t) { p.Write(WireFrame(std::vector<uint8_t>(65))); });
    ExpectBroken(r, StatusCode::kInvalidArgument, "more than the limit 64");
    EXPECT_TRUE(p.client->closed());
  }
}

// Close while a caller spins with half a frame read: the caller fails with
// Cancelled at once (not at its timeout) and Close joins the reader thread;
// the peer closing inside a frame fails a spinning caller the same way.
TEST(ClientConnectionTest, CloseOrPeerCloseWhileACallerReadsFailsItPromptly) {
  for (const bool peer_closes : {false, true}) {
    RawPeer p;
    p.Start(SpinFor(10s));
    std::chrono::steady_clock::time_point t0;
    Result<Frame> r = p.CallWhile([&](uint64_t id) {
      const std::vector<uint8_t> bytes = WireFrame(EncodeReply(id, RegisterReply{1}));
      p.Write(std::span(bytes).first(bytes.size() / 2));
      EXPECT_TRUE(p.WaitConsumed());
      t0 = std::chrono::steady_clock::now();
      if (peer_closes) {
        p.Drain();
        p.peer.Reset();
      } else {
        p.client->Close();
      }
    });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    ExpectBroken(r, StatusCode::kCancelled, peer_closes ? "inside a frame" : "closed");
    EXPECT_TRUE(p.client->closed());
    const uint64_t next = p.client->NextId();
    EXPECT_TRUE(p.client->Call(EncodeRequest(next, UnregisterRequest{}), {}, next, 1s)
                    .status()
                    .IsCancelled());
  }
}

// The server's closing reason (an ErrorReply with id 0) read by a spinning
// caller fails that caller and every other waiter with the reason.
TEST(ClientConnectionTest, AClosingReasonReadByASpinningCallerFailsEveryWaiter) {
  RawPeer p;
  p.Start(SpinFor(10s));
  const uint64_t other = p.client->NextId();
  const uint64_t mine = p.client->NextId();
  ASSERT_TRUE(p.client->Start(EncodeRequest(other, UnregisterRequest{1}), {}, other).ok());
  ASSERT_TRUE(p.client->Start(EncodeRequest(mine, UnregisterRequest{2}), {}, mine).ok());
  Result<Frame> r = Status::Internal("not waited");
  std::thread spinner([&] { r = p.client->Wait(mine, 30s); });
  std::this_thread::sleep_for(5ms);
  p.Write(WireFrame(EncodeError(0, Status::ResourceExhausted("too many engines"))));
  spinner.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("too many engines"), std::string_view::npos);
  Result<Frame> o = p.client->Wait(other, 1s);
  EXPECT_EQ(o.status().code(), StatusCode::kResourceExhausted) << o.status().ToString();
  EXPECT_TRUE(p.client->closed());
}
}  // namespace
}  // namespace orbitkv::protocol
