#include "protocol/frame.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "protocol/protocol_test_util.h"

namespace orbitkv::protocol {
namespace {

using testing::CountOpenFds;
using testing::MakeSocketPair;
using testing::MemfdWith;
using testing::ReadAll;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(FrameTest, PayloadRoundTrip) {
  auto sp = MakeSocketPair();
  ASSERT_TRUE(sp.a && sp.b);
  const auto payload = Bytes("hello, manager");
  ASSERT_TRUE(SendFrame(sp.a.get(), payload).ok());
  ASSERT_TRUE(SendFrame(sp.a.get(), {}).ok());  // empty frames are frames too
  auto f = RecvFrame(sp.b.get(), 1024, 0);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->payload, payload);
  EXPECT_TRUE(f->fds.empty());
  auto empty = RecvFrame(sp.b.get(), 1024, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->payload.empty());
}

TEST(FrameTest, HeaderIsLittleEndianLength) {
  auto sp = MakeSocketPair();
  std::vector<uint8_t> payload(0x010203, 7);
  std::thread sender([&] {
    SendFrame(sp.a.get(), payload).IgnoreError("the receiver hangs up after the header");
  });
  uint8_t hdr[4];
  ASSERT_EQ(::recv(sp.b.get(), hdr, 4, MSG_WAITALL), 4);
  EXPECT_EQ(hdr[0], 0x03);
  EXPECT_EQ(hdr[1], 0x02);
  EXPECT_EQ(hdr[2], 0x01);
  EXPECT_EQ(hdr[3], 0x00);
  ::shutdown(sp.b.get(), SHUT_RDWR);  // unblocks the sender with an error
  sender.join();
}

TEST(FrameTest, LargePayload) {
  auto sp = MakeSocketPair();
  std::vector<uint8_t> payload(9 << 20);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 131);
  std::thread sender([&] { EXPECT_TRUE(SendFrame(sp.a.get(), payload).ok()); });
  auto f = RecvFrame(sp.b.get(), 16 << 20, 0);
  sender.join();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->payload, payload);
}

TEST(FrameTest, MemfdsCrossTheSocket) {
  const int baseline = CountOpenFds();
  {
    auto sp = MakeSocketPair();
    std::vector<UniqueFd> mems;
    std::vector<int> raw;
    for (int i = 0; i < 3; ++i) {
      mems.push_back(MemfdWith("region " + std::to_string(i) + " bytes"));
      ASSERT_TRUE(mems.back());
      raw.push_back(mems.back().get());
    }
    ASSERT_TRUE(SendFrame(sp.a.get(), Bytes("register"), raw).ok());
    mems.clear();  // the receiver's copies keep the memory alive
    auto f = RecvFrame(sp.b.get(), 1024, 8);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->payload, Bytes("register"));
    ASSERT_EQ(f->fds.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(ReadAll(f->fds[i].get()), "region " + std::to_string(i) + " bytes");
      EXPECT_TRUE(::fcntl(f->fds[i].get(), F_GETFD) & FD_CLOEXEC);
    }
    // Writes through the received fd are visible through a new mapping.
    ASSERT_EQ(::pwrite(f->fds[1].get(), "R", 1, 0), 1);
    EXPECT_EQ(ReadAll(f->fds[1].get()), "Region 1 bytes");
  }
  EXPECT_EQ(CountOpenFds(), baseline);
}

TEST(FrameTest, MoreFdsThanOneSendmsgCarries) {
  // 600 fds need three SCM_RIGHTS chunks (253 + 253 + 94).
  const int baseline = CountOpenFds();
  {
    auto sp = MakeSocketPair();
    UniqueFd mem = MemfdWith("shared");
    std::vector<UniqueFd> dups;
    std::vector<int> raw;
    for (int i = 0; i < 600; ++i) {
      dups.emplace_back(::fcntl(mem.get(), F_DUPFD_CLOEXEC, 0));
      ASSERT_TRUE(dups.back());
      raw.push_back(dups.back().get());
    }
    ASSERT_TRUE(SendFrame(sp.a.get(), Bytes("many"), raw).ok());
    ASSERT_TRUE(SendFrame(sp.a.get(), Bytes("next")).ok());
    dups.clear();
    auto f = RecvFrame(sp.b.get(), 1024, 4096);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f->payload, Bytes("many"));
    ASSERT_EQ(f->fds.size(), 600u);
    EXPECT_EQ(ReadAll(f->fds[599].get()), "shared");
    // The next frame is intact and carries no fds.
    auto g = RecvFrame(sp.b.get(), 1024, 4096);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->payload, Bytes("next"));
    EXPECT_TRUE(g->fds.empty());
  }
  EXPECT_EQ(CountOpenFds(), baseline);
}

TEST(FrameTest, TooManyFdsAreClosedAndRejected) {
  const int baseline = CountOpenFds();
  {
    auto sp = MakeSocketPair();
    std::vector<UniqueFd> mems;
    std::vector<int> raw;
    for (int i = 0; i < 5; ++i) {
      mems.push_back(MemfdWith("x"));
      raw.push_back(mems.back().get());
    }
    ASSERT_TRUE(SendFrame(sp.a.get(), Bytes("five"), raw).ok());
    mems.clear();
    const int before_recv = CountOpenFds();
    auto f = RecvFrame(sp.b.get(), 1024, 2);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
    EXPECT_NE(f.status().message().find("file descriptors"), std::string_view::npos);
    EXPECT_EQ(CountOpenFds(), before_recv);  // none of the five stayed open
  }
  EXPECT_EQ(CountOpenFds(), baseline);
}

TEST(FrameTest, OversizedFrameIsRejected) {
  const int baseline = CountOpenFds();
  {
    auto sp = MakeSocketPair();
    // A real frame one byte over the limit, with an fd that must not leak.
    UniqueFd mem = MemfdWith("x");
    const int fd = mem.get();
    std::vector<uint8_t> payload(1025, 1);
    ASSERT_TRUE(SendFrame(sp.a.get(), payload, std::span(&fd, 1)).ok());
    mem.Reset();
    auto f = RecvFrame(sp.b.get(), 1024, 4);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find("1025"), std::string_view::npos) << f.status().ToString();
  }
  EXPECT_EQ(CountOpenFds(), baseline);
  {
    // A header announcing 4 GiB - 1 is refused before anything is allocated.
    auto sp = MakeSocketPair();
    const uint8_t hdr[4] = {0xFF, 0xFF, 0xFF, 0xFF};
    ASSERT_EQ(::write(sp.a.get(), hdr, 4), 4);
    auto f = RecvFrame(sp.b.get(), kDefaultMaxFramePayload, 0);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(FrameTest, UnexpectedFdsOnAnFdlessChannel) {
  auto sp = MakeSocketPair();
  UniqueFd mem = MemfdWith("x");
  const int fd = mem.get();
  ASSERT_TRUE(SendFrame(sp.a.get(), Bytes("p"), std::span(&fd, 1)).ok());
  auto f = RecvFrame(sp.b.get(), 1024, 0);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
}

TEST(FrameTest, EndOfStream) {
  {
    auto sp = MakeSocketPair();
    sp.a.Reset();
    auto f = RecvFrame(sp.b.get(), 1024, 0);
    ASSERT_FALSE(f.ok());
    EXPECT_TRUE(f.status().IsCancelled());
    EXPECT_EQ(f.status().message(), "peer closed");
  }
  {
    auto sp = MakeSocketPair();
    const uint8_t partial[6] = {10, 0, 0, 0, 'a', 'b'};  // announces 10, sends 2
    ASSERT_EQ(::write(sp.a.get(), partial, sizeof(partial)), 6);
    sp.a.Reset();
    auto f = RecvFrame(sp.b.get(), 1024, 0);
    ASSERT_FALSE(f.ok());
    EXPECT_TRUE(f.status().IsCancelled());
    EXPECT_EQ(f.status().message(), "peer closed inside a frame");
  }
  {
    auto sp = MakeSocketPair();
    const uint8_t partial[2] = {10, 0};  // half a header
    ASSERT_EQ(::write(sp.a.get(), partial, sizeof(partial)), 2);
    sp.a.Reset();
    auto f = RecvFrame(sp.b.get(), 1024, 0);
    EXPECT_TRUE(f.status().IsCancelled());
  }
}

TEST(FrameTest, SendToClosedPeerIsCancelledWithoutSigpipe) {
  auto sp = MakeSocketPair();
  sp.b.Reset();
  Status st = SendFrame(sp.a.get(), Bytes("anyone?"));
  EXPECT_TRUE(st.IsCancelled()) << st.ToString();
}

TEST(FrameTest, SendTimeout) {
  auto sp = MakeSocketPair();
  timeval tv{0, 50000};
  ASSERT_EQ(::setsockopt(sp.a.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
  std::vector<uint8_t> big(32 << 20);  // far more than the socket buffers hold
  Status st = SendFrame(sp.a.get(), big);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
}

TEST(FrameTest, FdChunksNeedFrameBytes) {
  auto sp = MakeSocketPair();
  std::vector<int> raw(253 * 4 + 1, 0);  // 5 chunks, but an empty frame has 4 bytes
  EXPECT_EQ(SendFrame(sp.a.get(), {}, raw).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace orbitkv::protocol
