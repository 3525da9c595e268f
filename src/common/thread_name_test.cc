#include "common/thread_name.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include <sys/syscall.h>
#include <unistd.h>

namespace orbitkv {
namespace {

TEST(ThreadNameTest, RoleAndIndexAreCutToFifteenBytesKeepingTheIndex) {
  EXPECT_EQ(ThreadName("okv-req"), "okv-req");
  EXPECT_EQ(ThreadName("okv-ssd-read", 1), "okv-ssd-read1");
  EXPECT_EQ(ThreadName("okv-ssd-read", 12), "okv-ssd-read12");
  // Too long for comm: the role is cut, the index kept.
  EXPECT_EQ(ThreadName("okv-gpu-decode-finish", 3), "okv-gpu-decode3");
  EXPECT_EQ(ThreadName("okv-gpu-decode-finish"), "okv-gpu-decode-");
  EXPECT_EQ(ThreadName("okv-gpu-decode-finish").size(), kMaxThreadName);
}

// The calling thread's comm, as top -H and orbitkv-bench read it.
std::string Comm() {
  std::ifstream f("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/comm");
  std::string comm;
  std::getline(f, comm);
  return comm;
}

TEST(ThreadNameTest, NamesOnlyTheCallingThreadAndShowsInProcComm) {
  const std::string before = Comm();
  std::string comm;
  std::thread t([&] {
    SetThreadName("okv-test-name-that-is-long");
    comm = Comm();
  });
  t.join();
  EXPECT_EQ(comm, "okv-test-name-t");
  EXPECT_EQ(Comm(), before);
}

}  // namespace
}  // namespace orbitkv
