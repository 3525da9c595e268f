// FakePlatform and FaultInjectingPlatform: stream ordering, events, cuFile
// emulation through an O_DIRECT file, the refusals the fake shares with cuFile,
// every fault knob, call accounting, and that the counters return to zero.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <latch>
#include <thread>
#include <vector>

#include "gpu/fake_platform.h"
#include "gpu/fault_injecting_platform.h"
#include "store/crc32c.h"
#include "testing/temp_dir.h"

namespace orbitkv::gpu {
namespace {

using std::chrono_literals::operator""ms;
using IoFault = FaultInjectingPlatform::IoFault;

constexpr uint64_t kPage = 4096;

uint8_t* Host(DevPtr p) { return reinterpret_cast<uint8_t*>(p); }

// Polls until `pred` holds (2 s at most).
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// Everything one cuFile test needs on `platform`: an opened driver, a
// registered 64 KiB staging buffer and stream, an event and a registered
// O_DIRECT file. Released in cuFile's order by the destructor.
class Rig {
 public:
  Rig(Platform* platform, const std::string& path) : platform_(platform) {
    auto opened = platform->OpenStorage(StoragePolicy::kExplicit);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    dev = platform->device(0).value();
    stream = std::move(dev->CreateStream()).value();
    event = std::move(dev->CreateEvent()).value();
    buf = dev->Allocate(kBufBytes).value();
    EXPECT_TRUE(dev->RegisterBuffer(buf, kBufBytes).ok());
    EXPECT_TRUE(dev->RegisterStream(*stream).ok());
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
    EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
    auto f = platform->RegisterFile(fd);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (f.ok()) file = std::move(f).value();
  }
  ~Rig() {
    EXPECT_TRUE(dev->Synchronize(*stream).ok());
    EXPECT_TRUE(dev->DeregisterStream(*stream).ok());
    EXPECT_TRUE(dev->DeregisterBuffer(buf).ok());
    EXPECT_TRUE(dev->Free(buf).ok());
    file.reset();
    event.reset();
    stream.reset();
    if (fd >= 0) ::close(fd);
  }

  // Submits and waits for one operation through the event.
  ssize_t Io(bool write, size_t size, off_t file_offset, off_t buf_offset) {
    AsyncIo io{size, file_offset, buf_offset, 0};
    Status st = write ? dev->WriteAsync(*file, buf, &io, *stream)
                      : dev->ReadAsync(*file, buf, &io, *stream);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(dev->Record(*event, *stream).ok());
    EXPECT_TRUE(dev->Wait(*event).ok());
    return io.bytes_done;
  }

  static constexpr uint64_t kBufBytes = 16 * kPage;
  Platform* platform_;
  Device* dev = nullptr;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Event> event;
  DevPtr buf = 0;
  std::unique_ptr<StorageFile> file;
  int fd = -1;
};

class FakePlatformTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_EQ(fake_.counters(), FakePlatformCounters{}) << "something was not released";
  }
  std::string File(const std::string& name = "cache.bin") const { return dir_.File(name); }

  testing::TempDir dir_;
  FakePlatform fake_;
};

TEST_F(FakePlatformTest, DescribeDevicesAndMemory) {
  FakePlatformOptions options;
  options.devices = 2;
  options.device_memory_bytes = 8 * kPage;
  FakePlatform two(options);
  EXPECT_EQ(two.Describe(), "fake, 2 devices");
  EXPECT_EQ(two.device_count(), 2);
  EXPECT_EQ(two.device(2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(two.device(-1).status().code(), StatusCode::kInvalidArgument);
  Device* d1 = two.device(1).value();
  EXPECT_EQ(d1->ordinal(), 1);
  EXPECT_EQ(two.device(1).value(), d1);

  DevPtr a = d1->Allocate(5 * kPage + 1).value();  // charged as 6 pages
  EXPECT_EQ(a % kPage, 0u);
  for (uint64_t i = 0; i < 5 * kPage + 1; ++i) ASSERT_EQ(Host(a)[i], 0xA5) << i;
  EXPECT_EQ(d1->Allocate(3 * kPage).status().code(), StatusCode::kResourceExhausted);
  DevPtr b = d1->Allocate(2 * kPage).value();
  DevPtr c = two.device(0).value()->Allocate(8 * kPage).value();  // device 0 has its own limit
  EXPECT_EQ(two.counters().live_allocations, 3);
  EXPECT_EQ(two.counters().live_allocation_bytes, 15 * kPage + 1);
  EXPECT_EQ(d1->Free(c).code(), StatusCode::kInvalidArgument);  // not device 1's
  EXPECT_EQ(d1->Free(a + 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(d1->Free(a).ok());
  EXPECT_TRUE(d1->Free(b).ok());
  EXPECT_TRUE(two.device(0).value()->Free(c).ok());
  EXPECT_EQ(d1->Allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(two.counters(), FakePlatformCounters{});
}

TEST_F(FakePlatformTest, StreamRunsWorkInOrder) {
  Device* dev = fake_.device(0).value();
  auto stream = std::move(dev->CreateStream()).value();
  DevPtr a = dev->Allocate(kPage).value();
  DevPtr b = dev->Allocate(kPage).value();
  std::vector<int> order;  // written only on the stream thread until Synchronize
  ASSERT_TRUE(dev->MemsetAsync(a, 7, kPage, *stream).ok());
  ASSERT_TRUE(dev->HostFuncAsync([&] { order.push_back(1); }, *stream).ok());
  CopyOp ops[] = {{b, a, kPage / 2}, {b + kPage / 2, a, kPage / 2}};
  ASSERT_TRUE(dev->CopyAsync(ops, *stream).ok());
  ASSERT_TRUE(dev->MemsetAsync(a, 9, 16, *stream).ok());
  ASSERT_TRUE(dev->HostFuncAsync([&] { order.push_back(2); }, *stream).ok());
  ASSERT_TRUE(dev->Synchronize(*stream).ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  for (uint64_t i = 0; i < kPage; ++i) ASSERT_EQ(Host(b)[i], 7) << i;  // copied before the memset
  EXPECT_EQ(Host(a)[0], 9);
  EXPECT_EQ(Host(a)[16], 7);
  EXPECT_EQ(fake_.counters().live_streams, 1);
  stream.reset();
  EXPECT_TRUE(dev->Free(a).ok());
  EXPECT_TRUE(dev->Free(b).ok());
}

// GatherObjectsAsync: each object's slots from its page at their offsets,
// with their CRC32Cs; the slot rules (slot_spans.h) and the memory checks
// refuse before anything is enqueued; the fault wrapper's copy and CRC knobs
// apply to a gather.
TEST_F(FakePlatformTest, GathersWholeObjectsWithTheirSlotCrcs) {
  Device* dev = fake_.device(0).value();
  auto stream = std::move(dev->CreateStream()).value();
  DevPtr a = dev->Allocate(8 * kPage).value();  // two slots: [0, 4 pages), [4 pages, 8)
  for (uint64_t i = 0; i < 8 * kPage; ++i) Host(a)[i] = static_cast<uint8_t>(i * 7 + (i >> 8));
  const SlotSpan spans[] = {{a, kPage, 1000, 0}, {a + 4 * kPage + 8, kPage, 4000, 1024}};
  auto made = dev->CreateSlotTable(spans, 4);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ((*made)->object_bytes(), 5024u);
  std::vector<uint8_t> objects(2 * 5024, 0xEE);
  std::vector<uint32_t> crcs(4, 0);
  const ObjectGather todo[] = {{3, reinterpret_cast<DevPtr>(objects.data())},
                               {0, reinterpret_cast<DevPtr>(objects.data() + 5024)}};
  ASSERT_TRUE(dev->GatherObjectsAsync(**made, todo, crcs.data(), *stream).ok());
  ASSERT_TRUE(dev->Synchronize(*stream).ok());
  for (size_t i = 0; i < 2; ++i) {
    for (size_t j = 0; j < 2; ++j) {
      const uint8_t* want = Host(spans[j].base + todo[i].page * spans[j].stride);
      EXPECT_EQ(std::memcmp(objects.data() + i * 5024 + spans[j].offset, want, spans[j].bytes), 0)
          << "object " << i << " slot " << j;
      EXPECT_EQ(crcs[i * 2 + j], Crc32c({want, spans[j].bytes}));
    }
    EXPECT_EQ(objects[i * 5024 + 1000], 0) << "between the slots: zeros";
    EXPECT_EQ(objects[i * 5024 + 1023], 0) << "between the slots: zeros";
  }
  const ObjectGather bad_page[] = {{4, reinterpret_cast<DevPtr>(objects.data())}};
  EXPECT_EQ(dev->GatherObjectsAsync(**made, bad_page, crcs.data(), *stream).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->GatherObjectsAsync(**made, todo, nullptr, *stream).code(),
            StatusCode::kInvalidArgument);
  const SlotSpan past[] = {{a + 4 * kPage, kPage, 4096, 0}};
  EXPECT_EQ(dev->CreateSlotTable(past, 5).status().code(), StatusCode::kInvalidArgument);
  const SlotSpan overlap[] = {{a, kPage, 1000, 0}, {a, kPage, 1000, 992}};
  EXPECT_EQ(dev->CreateSlotTable(overlap, 1).status().code(), StatusCode::kInvalidArgument);
  const SlotSpan big[] = {{a, kPage, kGatherSlotMaxBytes + 1, 0}};
  EXPECT_EQ(dev->CreateSlotTable(big, 1).status().code(), StatusCode::kInvalidArgument);

  // Through fault injection: a refused source, a refused CRC launch, a wrong CRC.
  FaultInjectingPlatform faults(&fake_);
  Device* wrapped = faults.device(0).value();
  auto ws = std::move(wrapped->CreateStream()).value();
  auto wt = std::move(wrapped->CreateSlotTable(spans, 4)).value();
  faults.RefuseCopiesFrom(spans[1].base + 3 * kPage, 1, 1, Status::Internal("injected"));
  EXPECT_EQ(wrapped->GatherObjectsAsync(*wt, todo, crcs.data(), *ws).code(), StatusCode::kInternal);
  faults.RefuseCrcs(1, Status::Internal("injected"));
  EXPECT_EQ(wrapped->GatherObjectsAsync(*wt, todo, crcs.data(), *ws).code(), StatusCode::kInternal);
  faults.CorruptCrcs(1);
  ASSERT_TRUE(wrapped->GatherObjectsAsync(*wt, todo, crcs.data(), *ws).ok());
  ASSERT_TRUE(wrapped->Synchronize(*ws).ok());
  EXPECT_NE(crcs[0], Crc32c({Host(spans[0].base + 3 * kPage), 1000}));
  EXPECT_EQ(crcs[1], Crc32c({Host(spans[1].base + 3 * kPage), 4000}));
  EXPECT_EQ(faults.calls().gathers, 1u);
  EXPECT_EQ(faults.calls().gathered_objects, 2u);
  faults.DenySlotTables(true);
  EXPECT_EQ(wrapped->CreateSlotTable(spans, 4).status().code(), StatusCode::kUnavailable);
  wt.reset();
  ws.reset();
  made->reset();
  stream.reset();
  EXPECT_TRUE(dev->Free(a).ok());
}

TEST_F(FakePlatformTest, EventsCompleteAfterEarlierWork) {
  Device* dev = fake_.device(0).value();
  auto stream = std::move(dev->CreateStream()).value();
  auto event = std::move(dev->CreateEvent()).value();
  EXPECT_TRUE(dev->Poll(*event).value());  // never recorded: complete

  std::latch gate(1);
  ASSERT_TRUE(dev->HostFuncAsync([&] { gate.wait(); }, *stream).ok());
  ASSERT_TRUE(dev->Record(*event, *stream).ok());
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(dev->Poll(*event).value());
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    EXPECT_TRUE(dev->Wait(*event).ok());
    waited = true;
  });
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(waited);
  gate.count_down();
  waiter.join();
  EXPECT_TRUE(dev->Poll(*event).value());

  // Re-recording tracks the latest Record; later work does not delay it.
  std::latch gate2(1);
  ASSERT_TRUE(dev->Record(*event, *stream).ok());
  ASSERT_TRUE(dev->HostFuncAsync([&] { gate2.wait(); }, *stream).ok());
  EXPECT_TRUE(dev->Wait(*event).ok());
  EXPECT_TRUE(dev->Poll(*event).value());
  ASSERT_TRUE(dev->Record(*event, *stream).ok());
  EXPECT_FALSE(dev->Poll(*event).value());
  gate2.count_down();
  EXPECT_TRUE(dev->Wait(*event).ok());

  // Streams and events of another device are refused.
  FakePlatformOptions options;
  options.devices = 2;
  FakePlatform two(options);
  auto other = std::move(two.device(1).value()->CreateStream()).value();
  EXPECT_EQ(dev->Record(*event, *other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(two.device(0).value()->Synchronize(*other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_.counters().live_events, 1);
}

TEST_F(FakePlatformTest, IpcExportOpenClose) {
  std::vector<uint8_t> engine(3 * kPage, 1);
  const IpcHandle h = fake_.Export(engine.data(), engine.size(), 0);
  EXPECT_EQ(fake_.Export(engine.data(), engine.size(), 0), h);
  Device* dev = fake_.device(0).value();
  IpcMapping m = dev->OpenIpc(h).value();
  EXPECT_EQ(m.base, reinterpret_cast<DevPtr>(engine.data()));
  EXPECT_EQ(m.bytes, engine.size());
  EXPECT_EQ(dev->OpenIpc(h).value().base, m.base);  // reference counted
  EXPECT_EQ(fake_.open_ipc_mappings(), 2);
  IpcHandle bogus{};
  EXPECT_EQ(dev->OpenIpc(bogus).status().code(), StatusCode::kInvalidArgument);
  IpcHandle unknown = h;
  unknown[9] ^= 0x40;
  EXPECT_EQ(dev->OpenIpc(unknown).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->CloseIpc(m.base + 1).code(), StatusCode::kFailedPrecondition);

  // A mapping can be registered with cuFile; it cannot be closed while it is.
  ASSERT_TRUE(fake_.OpenStorage(StoragePolicy::kAutoNativeOnly).ok());
  ASSERT_TRUE(dev->RegisterBuffer(m.base + kPage, kPage).ok());
  EXPECT_TRUE(dev->CloseIpc(m.base).ok());  // 2 -> 1 reference
  EXPECT_EQ(dev->CloseIpc(m.base).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(dev->DeregisterBuffer(m.base + kPage).ok());
  EXPECT_TRUE(dev->CloseIpc(m.base).ok());
  EXPECT_EQ(dev->CloseIpc(m.base).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fake_.open_ipc_mappings(), 0);
}

TEST_F(FakePlatformTest, StorageOptionsFail) {
  FakePlatformOptions options;
  options.storage_error = "cuFileDriverOpen: 5001 CU_FILE_DRIVER_NOT_INITIALIZED";
  options.register_file_error = "cuFileHandleRegister: 5030 unsupported mount";
  FakePlatform broken(options);
  auto st = broken.OpenStorage(StoragePolicy::kAutoNativeOnly).status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("5001"), std::string_view::npos);
  EXPECT_EQ(broken.RegisterFile(0).status().code(), StatusCode::kUnavailable);
}

TEST_F(FakePlatformTest, RefusesWhatCuFileRefuses) {
  Device* dev = fake_.device(0).value();
  auto stream = std::move(dev->CreateStream()).value();
  DevPtr buf = dev->Allocate(4 * kPage).value();
  int fd = ::open(File().c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);

  // Nothing registers before the driver is opened.
  EXPECT_EQ(dev->RegisterBuffer(buf, kPage).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(dev->RegisterStream(*stream).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fake_.RegisterFile(fd).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(fake_.OpenStorage(StoragePolicy::kExplicit).ok());

  std::vector<uint8_t> host(kPage);
  EXPECT_EQ(dev->RegisterBuffer(reinterpret_cast<DevPtr>(host.data()), kPage).code(),
            StatusCode::kInvalidArgument);  // not device memory
  EXPECT_EQ(dev->RegisterBuffer(buf, 5 * kPage).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(dev->RegisterBuffer(buf, 2 * kPage).ok());
  EXPECT_EQ(dev->RegisterBuffer(buf, 2 * kPage).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(dev->RegisterBuffer(buf + kPage, 2 * kPage).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(dev->DeregisterBuffer(buf + kPage).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(dev->Free(buf).code(), StatusCode::kFailedPrecondition);  // still registered

  auto file = std::move(fake_.RegisterFile(fd)).value();
  EXPECT_EQ(file->fd(), fd);
  AsyncIo io{kPage, 0, 0, 0};
  // Unregistered stream, then an interior (unregistered) buffer base.
  EXPECT_EQ(dev->ReadAsync(*file, buf, &io, *stream).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(dev->RegisterStream(*stream).ok());
  EXPECT_EQ(dev->RegisterStream(*stream).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(dev->ReadAsync(*file, buf + kPage, &io, *stream).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(dev->WriteAsync(*file, buf + 2 * kPage, &io, *stream).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(fake_.counters().registered_files, 1);

  // A file without O_DIRECT, or not open at all.
  int plain = ::open(File("plain").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(plain, 0);
  EXPECT_EQ(fake_.RegisterFile(plain).status().code(), StatusCode::kInvalidArgument);
  ::close(plain);
  EXPECT_EQ(fake_.RegisterFile(plain).status().code(), StatusCode::kInvalidArgument);

  // A file deregistered before its operation ran: -EBADF.
  std::latch gate(1);
  ASSERT_TRUE(dev->HostFuncAsync([&] { gate.wait(); }, *stream).ok());
  ASSERT_TRUE(dev->ReadAsync(*file, buf, &io, *stream).ok());
  file.reset();
  gate.count_down();
  ASSERT_TRUE(dev->Synchronize(*stream).ok());
  EXPECT_EQ(io.bytes_done, -EBADF);

  EXPECT_TRUE(dev->DeregisterStream(*stream).ok());
  EXPECT_EQ(dev->DeregisterStream(*stream).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(dev->DeregisterBuffer(buf).ok());
  EXPECT_TRUE(dev->Free(buf).ok());
  ::close(fd);
}

TEST_F(FakePlatformTest, ReadWriteRoundTrip) {
  Rig rig(&fake_, File());
  ASSERT_NE(rig.file, nullptr);
  for (uint64_t i = 0; i < 3 * kPage; ++i) Host(rig.buf)[i] = static_cast<uint8_t>(i * 7 + 3);
  EXPECT_EQ(rig.Io(/*write=*/true, 3 * kPage, kPage, 0), static_cast<ssize_t>(3 * kPage));
  EXPECT_EQ(::lseek(rig.fd, 0, SEEK_END), static_cast<off_t>(4 * kPage));

  EXPECT_EQ(rig.Io(/*write=*/false, 2 * kPage, 2 * kPage, 8 * kPage),
            static_cast<ssize_t>(2 * kPage));
  EXPECT_EQ(std::memcmp(Host(rig.buf) + 8 * kPage, Host(rig.buf) + kPage, 2 * kPage), 0);
  // Past the end of the file: a short count.
  EXPECT_EQ(rig.Io(/*write=*/false, 4 * kPage, 3 * kPage, 4 * kPage), static_cast<ssize_t>(kPage));
  // Outside the registered buffer: -EINVAL, nothing transferred.
  EXPECT_EQ(rig.Io(/*write=*/false, 2 * kPage, 0, 15 * kPage), -EINVAL);
  EXPECT_EQ(rig.Io(/*write=*/false, kPage, 0, -static_cast<off_t>(kPage)), -EINVAL);

  const FakePlatformCounters live = fake_.counters();
  EXPECT_EQ(live.registered_buffers, 1);
  EXPECT_EQ(live.registered_streams, 1);
  EXPECT_EQ(live.registered_files, 1);
  EXPECT_EQ(live.live_streams, 1);
  EXPECT_EQ(live.live_events, 1);
}

TEST_F(FakePlatformTest, ArgumentsAreReadWhenTheOperationRuns) {
  Rig rig(&fake_, File());
  ASSERT_NE(rig.file, nullptr);
  std::memset(Host(rig.buf), 0x3C, 4 * kPage);
  ASSERT_EQ(rig.Io(/*write=*/true, 4 * kPage, 0, 0), static_cast<ssize_t>(4 * kPage));
  std::memset(Host(rig.buf), 0, 8 * kPage);

  std::latch gate(1);
  ASSERT_TRUE(rig.dev->HostFuncAsync([&] { gate.wait(); }, *rig.stream).ok());
  AsyncIo io{kPage, 0, 0, 0};
  ASSERT_TRUE(rig.dev->ReadAsync(*rig.file, rig.buf, &io, *rig.stream).ok());
  ASSERT_TRUE(rig.dev->Record(*rig.event, *rig.stream).ok());
  io.size = 3 * kPage;  // after submission, before the stream reaches it
  io.buf_offset = 4 * kPage;
  gate.count_down();
  ASSERT_TRUE(rig.dev->Wait(*rig.event).ok());
  EXPECT_EQ(io.bytes_done, static_cast<ssize_t>(3 * kPage));
  EXPECT_EQ(Host(rig.buf)[0], 0);
  EXPECT_EQ(Host(rig.buf)[4 * kPage], 0x3C);
  EXPECT_EQ(Host(rig.buf)[7 * kPage - 1], 0x3C);
  EXPECT_EQ(Host(rig.buf)[7 * kPage], 0);
}

// ---- FaultInjectingPlatform over the fake ----------------------------------

class FaultInjectingPlatformTest : public FakePlatformTest {
 protected:
  FaultInjectingPlatform fi_{&fake_};
};

TEST_F(FaultInjectingPlatformTest, ForwardsAndWraps) {
  EXPECT_EQ(fi_.Describe(), "fault injection over fake, 1 device");
  EXPECT_EQ(fi_.device_count(), 1);
  EXPECT_EQ(fi_.device(1).status().code(), StatusCode::kInvalidArgument);
  Device* dev = fi_.device(0).value();
  EXPECT_EQ(fi_.device(0).value(), dev);
  EXPECT_NE(dev, fake_.device(0).value());
  // The inner platform's objects are not this platform's.
  auto inner_stream = std::move(fake_.device(0).value()->CreateStream()).value();
  EXPECT_EQ(dev->Synchronize(*inner_stream).code(), StatusCode::kInvalidArgument);

  Rig rig(&fi_, File());
  ASSERT_NE(rig.file, nullptr);
  std::memset(Host(rig.buf), 0x11, kPage);
  EXPECT_EQ(rig.Io(true, kPage, 0, 0), static_cast<ssize_t>(kPage));
  EXPECT_EQ(rig.Io(false, kPage, 0, kPage), static_cast<ssize_t>(kPage));
  EXPECT_EQ(Host(rig.buf)[kPage], 0x11);
}

TEST_F(FaultInjectingPlatformTest, StorageRegistrationFaults) {
  fi_.FailOpenStorage(Status::Unavailable("cuFileDriverOpen: 5001"));
  EXPECT_EQ(fi_.OpenStorage(StoragePolicy::kAutoNativeOnly).status().code(),
            StatusCode::kUnavailable);
  fi_.FailOpenStorage(Status::OK());
  ASSERT_TRUE(fi_.OpenStorage(StoragePolicy::kAutoNativeOnly).ok());

  int fd = ::open(File().c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ASSERT_GE(fd, 0);
  fi_.FailRegisterFile(Status::Unavailable("cuFileHandleRegister: 5030"));
  EXPECT_EQ(fi_.RegisterFile(fd).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fi_.RegisterFile(fd).status().code(), StatusCode::kUnavailable);  // sticky
  fi_.FailRegisterFile(Status::OK());
  auto file = std::move(fi_.RegisterFile(fd)).value();
  EXPECT_EQ(file->fd(), fd);

  Device* dev = fi_.device(0).value();
  DevPtr buf = dev->Allocate(kPage).value();
  fi_.FailRegisterBuffer(1, Status::Internal("cuFileBufRegister: 5011"));
  EXPECT_EQ(dev->RegisterBuffer(buf, kPage).code(), StatusCode::kInternal);
  EXPECT_EQ(fake_.counters().registered_buffers, 0);
  EXPECT_TRUE(dev->RegisterBuffer(buf, kPage).ok());  // only the next one failed
  const auto calls = fi_.calls();
  EXPECT_EQ(calls.register_files, 3u);
  EXPECT_EQ(calls.register_buffers, 2u);
  EXPECT_TRUE(dev->DeregisterBuffer(buf).ok());
  EXPECT_TRUE(dev->Free(buf).ok());
  file.reset();
  ::close(fd);
}

TEST_F(FaultInjectingPlatformTest, ShortAndFailedIo) {
  Rig rig(&fi_, File());
  ASSERT_NE(rig.file, nullptr);
  ASSERT_EQ(rig.Io(true, 4 * kPage, 0, 0), static_cast<ssize_t>(4 * kPage));

  fi_.FailReads(2, IoFault::kShort);
  EXPECT_EQ(rig.Io(false, 3 * kPage, 0, 0), static_cast<ssize_t>(2 * kPage));
  EXPECT_EQ(rig.Io(false, kPage, 0, 0), static_cast<ssize_t>(kPage / 2));
  EXPECT_EQ(rig.Io(false, kPage, 0, 0), static_cast<ssize_t>(kPage));  // count used up
  fi_.FailReads(1, IoFault::kError);
  EXPECT_EQ(rig.Io(false, kPage, 0, 0), -EIO);
  fi_.FailWrites(1, IoFault::kError);
  EXPECT_EQ(rig.Io(true, kPage, 0, 0), -EIO);
  fi_.FailWrites(1, IoFault::kShort);
  EXPECT_EQ(rig.Io(true, 2 * kPage, 0, 0), static_cast<ssize_t>(kPage));
  EXPECT_EQ(rig.Io(true, 2 * kPage, 0, 0), static_cast<ssize_t>(2 * kPage));

  // The injected short count follows the size the operation ran with.
  fi_.FailReads(1, IoFault::kShort);
  std::latch gate(1);
  ASSERT_TRUE(rig.dev->HostFuncAsync([&] { gate.wait(); }, *rig.stream).ok());
  AsyncIo io{kPage, 0, 0, 0};
  ASSERT_TRUE(rig.dev->ReadAsync(*rig.file, rig.buf, &io, *rig.stream).ok());
  io.size = 4 * kPage;
  gate.count_down();
  ASSERT_TRUE(rig.dev->Synchronize(*rig.stream).ok());
  EXPECT_EQ(io.bytes_done, static_cast<ssize_t>(3 * kPage));
  EXPECT_EQ(fi_.calls().read_sizes.back(), kPage);  // accounted at submission
}

TEST_F(FaultInjectingPlatformTest, RefusedReadSubmissions) {
  Rig rig(&fi_, File());
  ASSERT_NE(rig.file, nullptr);
  fi_.ResetCalls();
  fi_.RefuseReadSubmits(2, Status::IOError("cuFileReadAsync: 5010", EIO));
  AsyncIo io{kPage, 0, 0, 77};
  EXPECT_EQ(rig.dev->ReadAsync(*rig.file, rig.buf, &io, *rig.stream).code(), StatusCode::kIOError);
  EXPECT_EQ(rig.dev->ReadAsync(*rig.file, rig.buf, &io, *rig.stream).code(), StatusCode::kIOError);
  // Writes are not refused.
  EXPECT_EQ(rig.Io(true, kPage, 0, 0), static_cast<ssize_t>(kPage));
  ASSERT_TRUE(rig.dev->Synchronize(*rig.stream).ok());
  EXPECT_EQ(io.bytes_done, 77);  // nothing ran
  EXPECT_EQ(rig.Io(false, kPage, 0, 0), static_cast<ssize_t>(kPage));
  const auto calls = fi_.calls();
  EXPECT_EQ(calls.reads, 1u);  // refused submissions are not counted
  EXPECT_EQ(calls.writes, 1u);
}

TEST_F(FaultInjectingPlatformTest, HeldWritesCompleteOnRelease) {
  Rig rig(&fi_, File());
  ASSERT_NE(rig.file, nullptr);
  auto before = std::move(rig.dev->CreateEvent()).value();
  ASSERT_TRUE(rig.dev->Record(*before, *rig.stream).ok());

  fi_.HoldWrites(true);
  EXPECT_EQ(rig.Io(false, 0, 0, 0), 0);  // a read is not held
  std::memset(Host(rig.buf), 0x5A, kPage);
  AsyncIo io{kPage, 0, 0, 0};
  ASSERT_TRUE(rig.dev->WriteAsync(*rig.file, rig.buf, &io, *rig.stream).ok());
  ASSERT_TRUE(rig.dev->Record(*rig.event, *rig.stream).ok());
  EXPECT_EQ(fi_.held_events(), 1);
  fi_.HoldWrites(false);  // later writes are not held; this one still is

  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    EXPECT_TRUE(rig.dev->Wait(*rig.event).ok());
    waited = true;
  });
  // The write itself runs (the stream is not blocked), but is not reported.
  std::vector<uint8_t> on_disk(kPage);
  ASSERT_TRUE(Eventually([&] {
    int plain = ::open(File().c_str(), O_RDONLY);
    const bool ok = ::pread(plain, on_disk.data(), kPage, 0) == static_cast<ssize_t>(kPage) &&
                    on_disk[0] == 0x5A;
    ::close(plain);
    return ok;
  }));
  EXPECT_TRUE(rig.dev->Poll(*before).value());  // recorded before the held write
  EXPECT_FALSE(rig.dev->Poll(*rig.event).value());
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(waited);

  fi_.ReleaseHeld();
  waiter.join();
  EXPECT_EQ(fi_.held_events(), 0);
  EXPECT_TRUE(rig.dev->Poll(*rig.event).value());
  EXPECT_EQ(io.bytes_done, static_cast<ssize_t>(kPage));
  EXPECT_EQ(rig.Io(true, kPage, 0, 0), static_cast<ssize_t>(kPage));  // no longer held
}

TEST_F(FaultInjectingPlatformTest, HeldReadsBlockSynchronizeUntilRelease) {
  Rig rig(&fi_, File());
  ASSERT_NE(rig.file, nullptr);
  ASSERT_EQ(rig.Io(true, kPage, 0, 0), static_cast<ssize_t>(kPage));
  fi_.HoldReads(true);
  AsyncIo io{kPage, 0, 0, 0};
  ASSERT_TRUE(rig.dev->ReadAsync(*rig.file, rig.buf, &io, *rig.stream).ok());
  ASSERT_TRUE(rig.dev->Record(*rig.event, *rig.stream).ok());
  EXPECT_EQ(fi_.held_events(), 1);
  std::atomic<bool> synced{false};
  std::thread syncer([&] {
    EXPECT_TRUE(rig.dev->Synchronize(*rig.stream).ok());
    synced = true;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(synced);
  EXPECT_FALSE(rig.dev->Poll(*rig.event).value());
  fi_.HoldReads(false);
  fi_.ReleaseHeld();
  syncer.join();
  EXPECT_TRUE(rig.dev->Poll(*rig.event).value());
  EXPECT_EQ(io.bytes_done, static_cast<ssize_t>(kPage));
}

TEST_F(FaultInjectingPlatformTest, CountsCalls) {
  Rig rig(&fi_, File());
  ASSERT_NE(rig.file, nullptr);
  int fd2 = ::open(File("second").c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  ASSERT_GE(fd2, 0);
  auto file2 = std::move(fi_.RegisterFile(fd2)).value();
  EXPECT_EQ(fi_.calls().register_files, 2u);
  EXPECT_EQ(fi_.calls().register_buffers, 1u);
  fi_.ResetCalls();

  EXPECT_EQ(rig.Io(true, 2 * kPage, 0, 0), static_cast<ssize_t>(2 * kPage));
  EXPECT_EQ(rig.Io(false, kPage, 0, 0), static_cast<ssize_t>(kPage));
  AsyncIo io{3 * kPage, 0, 0, 0};
  ASSERT_TRUE(rig.dev->ReadAsync(*file2, rig.buf, &io, *rig.stream).ok());
  ASSERT_TRUE(rig.dev->Synchronize(*rig.stream).ok());
  EXPECT_EQ(io.bytes_done, 0);  // empty file

  const auto calls = fi_.calls();
  EXPECT_EQ(calls.writes, 1u);
  EXPECT_EQ(calls.write_bytes, 2 * kPage);
  EXPECT_EQ(calls.reads, 2u);
  EXPECT_EQ(calls.read_bytes, 4 * kPage);
  EXPECT_EQ(calls.read_sizes, (std::vector<uint64_t>{kPage, 3 * kPage}));
  EXPECT_EQ(calls.read_fds, (std::vector<int>{rig.fd, fd2}));
  EXPECT_EQ(calls.register_files, 0u);
  fi_.ResetCalls();
  EXPECT_EQ(fi_.calls().reads, 0u);
  EXPECT_TRUE(fi_.calls().read_sizes.empty());
  file2.reset();
  ::close(fd2);
}

}  // namespace
}  // namespace orbitkv::gpu
