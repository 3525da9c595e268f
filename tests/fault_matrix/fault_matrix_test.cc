// The integrity fault matrix (issue 10): every fault kind x site x workload
// against an in-process Manager, each cell on a fresh Manager and SSD cache.
// A cell passes when every block ends in an error or a miss, or in exactly
// the published bytes, never a wrong byte, and leases, pins, reservations,
// queries, restores, assemblies, DRAM and GPU staging, cuFile workers and
// platform resources are all back at zero. The matrix is printed with the
// outcome of every cell and the counts per outcome; cells that cannot apply
// are printed as n/a with the reason.
//
// Sites: "ssd-read" / "ssd-write" are the io_uring routes of a host instance
// (faults on the completion path, IoFaultInjector); "cufile-read" /
// "cufile-write" are a cuda:0 instance over FakePlatform (cuFile = pread /
// pwrite) wrapped in FaultInjectingPlatform. Corruption faults (torn write,
// misdirected extent, bit flips) hit the bytes in flight on the io_uring
// routes and the extent on disk on the cuFile routes (right after the write,
// or right before the read), which is what the Manager sees either way.
//
// Phases of a cell: publish 4 keys (write-site faults armed) -> the workload
// (read-site faults armed) -> verify every key with the faults off. Workloads:
// publish (nothing else), restore, prepare (then restore from DRAM), cancel
// (every restore cancelled at once), client-killed (the engine's session
// closes while its work is in flight, as the server does on a disconnect),
// manager-restart (the Manager is destroyed mid-work and started again on the
// same SSD path).
//
// ORBITKV_FAULT_MATRIX_CELLS=substring runs only cells whose name contains it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "gpu/fake_platform.h"
#include "gpu/fault_injecting_platform.h"
#include "io/io_engine.h"
#include "manager/manager.h"
#include "store/object_format.h"
#include "store/shard_file.h"
#include "testing/host_pages.h"
#include "testing/temp_dir.h"

namespace orbitkv {
namespace {

using gpu::FaultInjectingPlatform;

enum class Fault {
  kEio,
  kEnospc,
  kShort,
  kZero,
  kStall,
  kTorn,
  kMisdirect,
  kFlipPayload,
  kFlipHeader
};
enum class Site { kSsdRead, kSsdWrite, kCufileRead, kCufileWrite };
enum class Workload { kPublish, kRestore, kPrepare, kCancel, kClientKilled, kManagerRestart };
enum class Outcome { kOk, kMiss, kError, kNa, kWrong, kLeak };

constexpr Fault kFaults[] = {Fault::kEio,       Fault::kEnospc,      Fault::kShort,
                             Fault::kZero,      Fault::kStall,       Fault::kTorn,
                             Fault::kMisdirect, Fault::kFlipPayload, Fault::kFlipHeader};
constexpr Site kSites[] = {Site::kSsdRead, Site::kSsdWrite, Site::kCufileRead, Site::kCufileWrite};
constexpr Workload kWorkloads[] = {Workload::kPublish,      Workload::kRestore,
                                   Workload::kPrepare,      Workload::kCancel,
                                   Workload::kClientKilled, Workload::kManagerRestart};

const char* Name(Fault f) {
  switch (f) {
    case Fault::kEio:
      return "EIO";
    case Fault::kEnospc:
      return "ENOSPC";
    case Fault::kShort:
      return "short";
    case Fault::kZero:
      return "zero-byte";
    case Fault::kStall:
      return "stall";
    case Fault::kTorn:
      return "torn-write";
    case Fault::kMisdirect:
      return "misdirected";
    case Fault::kFlipPayload:
      return "flip-payload";
    case Fault::kFlipHeader:
      return "flip-header";
  }
  return "?";
}
const char* Name(Site s) {
  switch (s) {
    case Site::kSsdRead:
      return "ssd-read";
    case Site::kSsdWrite:
      return "ssd-write";
    case Site::kCufileRead:
      return "cufile-read";
    case Site::kCufileWrite:
      return "cufile-write";
  }
  return "?";
}
const char* Name(Workload w) {
  switch (w) {
    case Workload::kPublish:
      return "publish";
    case Workload::kRestore:
      return "restore";
    case Workload::kPrepare:
      return "prepare";
    case Workload::kCancel:
      return "cancel";
    case Workload::kClientKilled:
      return "client-killed";
    case Workload::kManagerRestart:
      return "mgr-restart";
  }
  return "?";
}
const char* Name(Outcome o) {
  switch (o) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kMiss:
      return "miss";
    case Outcome::kError:
      return "err";
    case Outcome::kNa:
      return "n/a";
    case Outcome::kWrong:
      return "WRONG";
    case Outcome::kLeak:
      return "LEAK";
  }
  return "?";
}

bool IsRead(Site s) { return s == Site::kSsdRead || s == Site::kCufileRead; }
bool IsCufile(Site s) { return s == Site::kCufileRead || s == Site::kCufileWrite; }

// Why a cell cannot apply; empty when it does.
std::string NotApplicable(Fault f, Site s, Workload w) {
  if (IsRead(s) && w == Workload::kPublish) return "a publish reads nothing from SSD";
  if (IsRead(s) && f == Fault::kEnospc) return "a read cannot run out of space";
  if (IsRead(s) && f == Fault::kTorn) return "a torn write happens on the write path";
  if (s == Site::kCufileRead && w == Workload::kPrepare) {
    return "prepare warms DRAM through io_uring, never through cuFile (see ssd-read / prepare)";
  }
  if (s == Site::kCufileWrite && f == Fault::kEnospc) {
    return "cuFile shards are fallocate()d at startup: a write into a reserved extent cannot "
           "hit ENOSPC";
  }
  if (s == Site::kCufileWrite && f == Fault::kZero) {
    return "not injectable: a cuFile write into a reserved extent cannot complete with zero "
           "bytes, and FaultInjectingPlatform shortens writes to size - 4096 at most";
  }
  return {};
}

BlockKey K(uint64_t v) {
  BlockKey k{};
  std::memcpy(k.data(), &v, sizeof v);
  k[31] = 0x3c;
  return k;
}

constexpr uint64_t kKeys = 4;        // keys 1..4 from pages 0..3
constexpr uint64_t kWorkPage = 4;    // workload restores into pages 4..7
constexpr uint64_t kVerifyPage = 8;  // verification restores into pages 8..11
constexpr uint64_t kPages = 12;
const std::vector<uint64_t> kSlots = {5000, 3000};  // an 8632-byte object in a 12 KiB extent
constexpr uint64_t kPayloadByte = 612;              // inside slot 0's segment (it starts at 512)
constexpr uint64_t kHeaderByte = 40;                // inside the key
constexpr auto kStall = std::chrono::milliseconds(60);

// In-flight faults on the io_uring routes: ScriptedIoFaults for errors, short
// and zero-byte transfers and stalls, plus corruption of the bytes a read
// returns or a write left on disk, and an optional delay per completion that
// keeps work in flight for the cancel / kill workloads.
class MatrixIoFaults final : public IoFaultInjector {
 public:
  void Arm(IoOp op, Fault f) {
    std::lock_guard<std::mutex> l(mu_);
    op_ = op;
    fault_ = f;
    armed_ = true;
    switch (f) {
      case Fault::kEio:
        scripted_.AddRule({op, 1, ScriptedIoFaults::Fault::kError, EIO, true});
        break;
      case Fault::kEnospc:
        scripted_.AddRule({op, 1, ScriptedIoFaults::Fault::kError, ENOSPC, true});
        break;
      case Fault::kShort:
        scripted_.AddRule({op, 1, ScriptedIoFaults::Fault::kShort, 0, true});
        break;
      case Fault::kZero:
        scripted_.AddRule({op, 1, ScriptedIoFaults::Fault::kZero, 0, true});
        break;
      case Fault::kStall:
        scripted_.AddRule({op, 1, ScriptedIoFaults::Fault::kStall, 0, true, kStall});
        break;
      default:
        break;  // corruption: OnCompletion below
    }
  }
  void Disarm() {
    std::lock_guard<std::mutex> l(mu_);
    armed_ = false;
    scripted_.Clear();
  }
  void SetDelay(std::chrono::milliseconds d) { delay_ms_.store(d.count()); }

  int OnCompletion(const IoRequest& req, uint64_t offset, size_t submitted, int res) override {
    if (int64_t d = delay_ms_.load(); d > 0 && req.op == IoOp::kRead) {
      std::this_thread::sleep_for(std::chrono::milliseconds(d));
    }
    res = scripted_.OnCompletion(req, offset, submitted, res);
    Fault f;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!armed_ || req.op != op_) return res;
      f = fault_;
    }
    // Only a whole first transfer of a request starts at its object.
    if (res <= 0 || offset != req.offset || static_cast<size_t>(res) != submitted) return res;
    if (req.op == IoOp::kRead) {
      CorruptRead(req, submitted, f);
    } else {
      CorruptWrite(req, submitted, f);
    }
    return res;
  }

 private:
  static uint8_t* At(const IoRequest& req, uint64_t pos) {
    if (req.iov.empty()) return static_cast<uint8_t*>(req.buf) + pos;
    for (const iovec& v : req.iov) {
      if (pos < v.iov_len) return static_cast<uint8_t*>(v.iov_base) + pos;
      pos -= v.iov_len;
    }
    return nullptr;
  }
  // Another extent of the same shard: the next one when it fits, else the previous.
  static uint64_t Elsewhere(int fd, uint64_t offset, size_t n) {
    struct stat st {};
    ::fstat(fd, &st);
    if (offset + 2 * n <= static_cast<uint64_t>(st.st_size)) return offset + n;
    return offset >= kShardHeaderSize + n ? offset - n : offset;
  }
  static void Flip(const IoRequest& req, size_t n, uint64_t pos) {
    if (pos >= n) return;
    if (uint8_t* p = At(req, pos)) *p ^= 0x40;
  }
  void CorruptRead(const IoRequest& req, size_t n, Fault f) {
    if (f == Fault::kFlipPayload) Flip(req, n, kPayloadByte);
    if (f == Fault::kFlipHeader) Flip(req, n, kHeaderByte);
    if (f == Fault::kMisdirect) {  // the device returned another extent's bytes
      AlignedBuf other(n);
      if (::pread(req.fd, other.p, n, Elsewhere(req.fd, req.offset, n)) != ssize_t(n)) return;
      for (uint64_t i = 0; i < n; ++i) *At(req, i) = other.p[i];
    }
  }
  void CorruptWrite(const IoRequest& req, size_t n, Fault f) {
    AlignedBuf disk(n);
    if (::pread(req.fd, disk.p, n, req.offset) != ssize_t(n)) return;
    if (f == Fault::kTorn) {  // only the first 4 KiB reached the media
      if (n <= 4096) return;
      std::memset(disk.p + 4096, 0, n - 4096);
    } else if (f == Fault::kFlipPayload) {
      if (kPayloadByte < n) disk.p[kPayloadByte] ^= 0x40;
    } else if (f == Fault::kFlipHeader) {
      disk.p[kHeaderByte] ^= 0x40;
    } else if (f == Fault::kMisdirect) {  // the bytes went to another extent
      ::pwrite(req.fd, disk.p, n, Elsewhere(req.fd, req.offset, n));
      std::memset(disk.p, 0, n);
    } else {
      return;
    }
    ::pwrite(req.fd, disk.p, n, req.offset);
  }
  struct AlignedBuf {  // O_DIRECT fds need aligned buffers
    explicit AlignedBuf(size_t n)
        : p(static_cast<uint8_t*>(std::aligned_alloc(4096, AlignUp(n, 4096)))) {}
    ~AlignedBuf() { std::free(p); }
    uint8_t* p;
  };

  ScriptedIoFaults scripted_;
  std::mutex mu_;
  bool armed_ = false;  // guarded by mu_
  IoOp op_ = IoOp::kRead;
  Fault fault_ = Fault::kEio;
  std::atomic<int64_t> delay_ms_{0};
};

// Engine pages as plain host memory: memfds for host instances, or buffers
// posed as cudaMalloc allocations on the fake platform (its device memory is
// host memory), so both are filled and checked alike.
struct EnginePages {
  InstanceLayout layout = SplitLayout(kPages, kSlots);
  std::unique_ptr<testing::HostPages> host;  // host instances
  std::vector<uint8_t*> fake_cuda;           // cuda:0 instances (aligned_alloc)
  std::vector<gpu::IpcHandle> handles;

  EnginePages(bool cuda, gpu::FakePlatform* fake) {
    if (!cuda) {
      host = std::make_unique<testing::HostPages>(layout);
      return;
    }
    for (uint64_t b : layout.region_bytes) {
      auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, AlignUp(b, 4096)));
      fake_cuda.push_back(p);
      handles.push_back(fake->Export(p, b, 0));
    }
  }
  ~EnginePages() {
    for (uint8_t* p : fake_cuda) std::free(p);
  }
  uint8_t* Slot(size_t s, uint64_t page) {
    if (host) return host->Slot(0, s, page);
    const SlotLayout& sl = layout.groups[0].slots[s];
    return fake_cuda[sl.region] + SlotPageOffset(sl, page);
  }
  static uint8_t Byte(uint64_t seed, size_t slot, uint64_t i) {
    return testing::HostPages::Byte(seed, static_cast<uint32_t>(slot), i);
  }
  void Fill(uint64_t page, uint64_t seed) {
    for (size_t s = 0; s < kSlots.size(); ++s) {
      for (uint64_t i = 0; i < kSlots[s]; ++i) Slot(s, page)[i] = Byte(seed, s, i);
    }
  }
  void Scribble(uint64_t page) {
    for (size_t s = 0; s < kSlots.size(); ++s) std::memset(Slot(s, page), 0xC3, kSlots[s]);
  }
  bool Holds(uint64_t page, uint64_t seed) {
    for (size_t s = 0; s < kSlots.size(); ++s) {
      for (uint64_t i = 0; i < kSlots[s]; ++i) {
        if (Slot(s, page)[i] != Byte(seed, s, i)) return false;
      }
    }
    return true;
  }
};

// The extent of every object of the cache on disk, by key: found by scanning
// the shard for object headers (buffered I/O; the Manager's reads are O_DIRECT).
std::map<uint64_t, uint64_t> FindObjects(const std::string& shard) {
  std::map<uint64_t, uint64_t> out;
  const int fd = ::open(shard.c_str(), O_RDONLY);
  if (fd < 0) return out;
  std::vector<uint8_t> buf(4096);
  const uint64_t object = ObjectSize(kSlots);
  for (uint64_t off = kShardHeaderSize;; off += 4096) {
    if (::pread(fd, buf.data(), buf.size(), off) != ssize_t(buf.size())) break;
    Result<ParsedHeader> h = ParseObjectHeader(buf, object);
    if (!h.ok()) continue;
    uint64_t key = 0;
    std::memcpy(&key, h->id.key.bytes.data(), sizeof key);
    out[key] = off;
  }
  ::close(fd);
  return out;
}

// Applies a corruption fault to every object's extent on disk (the cuFile sites).
void CorruptOnDisk(const std::string& shard, Fault f) {
  const std::map<uint64_t, uint64_t> objects = FindObjects(shard);
  const int fd = ::open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t n = AlignUp(ObjectSize(kSlots), 4096);
  std::vector<uint64_t> offsets;
  for (auto [key, off] : objects) offsets.push_back(off);
  std::vector<std::vector<uint8_t>> bytes;
  for (uint64_t off : offsets) {
    std::vector<uint8_t> b(n);
    ASSERT_EQ(::pread(fd, b.data(), n, off), ssize_t(n));
    bytes.push_back(std::move(b));
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    std::vector<uint8_t> b = bytes[i];
    switch (f) {
      case Fault::kTorn:
        std::memset(b.data() + 4096, 0, n - 4096);
        break;
      case Fault::kFlipPayload:
        b[kPayloadByte] ^= 0x40;
        break;
      case Fault::kFlipHeader:
        b[kHeaderByte] ^= 0x40;
        break;
      case Fault::kMisdirect:
        b = bytes[(i + 1) % bytes.size()];
        break;  // another key's object
      default:
        break;
    }
    ASSERT_EQ(::pwrite(fd, b.data(), n, offsets[i]), ssize_t(n));
  }
  ::close(fd);
}

bool IsCorruption(Fault f) {
  return f == Fault::kTorn || f == Fault::kMisdirect || f == Fault::kFlipPayload ||
         f == Fault::kFlipHeader;
}

struct CellResult {
  Outcome outcome = Outcome::kOk;
  std::string detail;
};

// One cell: its own SSD cache, Manager, platform and engine pages.
class Cell {
 public:
  Cell(Fault f, Site s, Workload w) : fault_(f), site_(s), work_(w), pages_(IsCufile(s), &fake_) {
    gpu_ = std::make_unique<FaultInjectingPlatform>(&fake_);
  }
  ~Cell() {
    StopPump();
    mgr_.reset();
  }

  CellResult Run() {
    if (!Start()) return Fail(Outcome::kLeak, "Manager start failed: " + start_error_);
    session_ = mgr_->OpenSession(getpid());
    inst_ = Register(session_);
    if (inst_ == 0) return Fail(Outcome::kLeak, "register failed");
    for (uint64_t k = 1; k <= kKeys; ++k) pages_.Fill(k - 1, k);

    // Publish phase (write-site faults armed).
    phase_ = "publish";
    if (!IsRead(site_)) ArmWrite();
    if (work_ == Workload::kClientKilled && !IsRead(site_)) {
      PublishFromVictim();
    } else if (work_ == Workload::kManagerRestart && !IsRead(site_)) {
      PublishAll(session_, inst_);
      Restart();  // mid-writeback
    } else {
      PublishAll(session_, inst_);
      mgr_->Drain();
    }
    DisarmWrite();

    // Workload phase (read-site faults armed).
    phase_ = "workload";
    if (IsRead(site_)) {
      ArmRead();
      switch (work_) {
        case Workload::kRestore:
          RestoreAll(/*cancel=*/false);
          break;
        case Workload::kPrepare:
          PrepareAll();
          break;
        case Workload::kCancel:
          RestoreAll(/*cancel=*/true);
          break;
        case Workload::kClientKilled:
          RestoreFromVictim();
          break;
        case Workload::kManagerRestart:
          RestoreAndRestart();
          break;
        case Workload::kPublish:
          break;
      }
      DisarmRead();
    } else if (work_ == Workload::kRestore) {
      RestoreAll(false);
    } else if (work_ == Workload::kPrepare) {
      PrepareAll();
    } else if (work_ == Workload::kCancel) {
      RestoreAll(true);
    }
    StopPump();
    if (!mgr_) return Fail(Outcome::kLeak, "no Manager after the workload");

    // Verify phase: every key alone, faults off.
    phase_ = "verify";
    for (uint64_t k = 1; k <= kKeys; ++k) RestoreKey(k, kVerifyPage + k - 1);
    CheckReleased();
    mgr_.reset();
    if (gpu::FakePlatformCounters c = fake_.counters(); !(c == gpu::FakePlatformCounters{})) {
      Note(Outcome::kLeak, "platform resources after shutdown: " + c.ToString());
    }
    return result_;
  }

 private:
  bool Start() {
    metrics_ = std::make_unique<MetricsRegistry>();
    ManagerConfig c;
    c.options.pool_size = 8u << 20;
    c.options.ssd_cache_path = dir_.File("cache.bin");
    c.options.ssd_cache_capacity = 4u << 20;
    c.options.ssd_shards = 1;
    c.options.ssd_queue_depth = 8;
    c.options.ssd_io_workers = 1;
    c.options.ssd_backend = IsCufile(site_) ? SsdBackend::kCufile : SsdBackend::kUring;
    c.options.admission_reuse = true;  // published objects leave DRAM: restores read SSD
    c.gpu_slot_bytes = 64u << 10;
    c.lock_memory = false;
    c.metrics = metrics_.get();
    c.io_faults = &io_;
    c.gpu = gpu_.get();
    Result<std::unique_ptr<Manager>> m = Manager::Create(c);
    if (!m.ok()) {
      start_error_ = m.status().ToString();
      return false;
    }
    mgr_ = std::move(m).value();
    return true;
  }
  std::string Shard() const { return ShardPaths(dir_.File("cache.bin"), 1)[0]; }

  InstanceId Register(SessionId s) {
    RegisterRequest r;
    r.ns = "matrix";
    r.layout = pages_.layout;
    std::vector<int> fds;
    if (IsCufile(site_)) {
      r.device = "cuda:0";
      r.ipc_handles = pages_.handles;
    } else {
      fds = pages_.host->DupFds();
    }
    Result<InstanceId> id = mgr_->RegisterInstance(s, r, std::move(fds));
    if (!id.ok()) Note(Outcome::kLeak, "register: " + id.status().ToString());
    return id.ok() ? *id : 0;
  }

  // ---- arming -------------------------------------------------------------
  void ArmWrite() {
    if (site_ == Site::kSsdWrite) io_.Arm(IoOp::kWrite, fault_);
    if (site_ != Site::kCufileWrite) return;
    if (fault_ == Fault::kEio) gpu_->FailWrites(1 << 20, FaultInjectingPlatform::IoFault::kError);
    if (fault_ == Fault::kShort) gpu_->FailWrites(1 << 20, FaultInjectingPlatform::IoFault::kShort);
    if (fault_ == Fault::kStall) {
      gpu_->HoldWrites(true);
      StartPump();
    }
  }
  void DisarmWrite() {
    if (site_ == Site::kSsdWrite) io_.Disarm();
    if (site_ != Site::kCufileWrite) return;
    gpu_->FailWrites(0, FaultInjectingPlatform::IoFault::kError);
    gpu_->HoldWrites(false);
    gpu_->ReleaseHeld();
    // Direct writes finished before Publish returned: corrupt what they left.
    if (IsCorruption(fault_) && mgr_) CorruptOnDisk(Shard(), fault_);
  }
  void ArmRead() {
    const bool keep_in_flight = work_ == Workload::kCancel || work_ == Workload::kClientKilled ||
                                work_ == Workload::kManagerRestart;
    if (site_ == Site::kSsdRead) {
      io_.Arm(IoOp::kRead, fault_);
      if (keep_in_flight) io_.SetDelay(std::chrono::milliseconds(20));
      return;
    }
    if (fault_ == Fault::kEio) gpu_->FailReads(1 << 20, FaultInjectingPlatform::IoFault::kError);
    if (fault_ == Fault::kShort) gpu_->FailReads(1 << 20, FaultInjectingPlatform::IoFault::kShort);
    if (fault_ == Fault::kZero) {  // reads at the end of the file return no bytes
      struct stat st {};
      ASSERT_EQ(::stat(Shard().c_str(), &st), 0);
      shard_size_ = st.st_size;
      ASSERT_EQ(::truncate(Shard().c_str(), kShardHeaderSize), 0);
    }
    if (IsCorruption(fault_)) CorruptOnDisk(Shard(), fault_);
    if (fault_ == Fault::kStall || keep_in_flight) {
      gpu_->HoldReads(true);
      StartPump();
    }
  }
  void DisarmRead() {
    if (site_ == Site::kSsdRead) {
      io_.Disarm();
      io_.SetDelay(std::chrono::milliseconds(0));
      return;
    }
    gpu_->FailReads(0, FaultInjectingPlatform::IoFault::kError);
    gpu_->HoldReads(false);
    gpu_->ReleaseHeld();
    if (shard_size_ != 0) {
      ASSERT_EQ(::truncate(Shard().c_str(), shard_size_), 0);
      shard_size_ = 0;
    }
  }
  // Held cuFile completions are released every few ms: a slow device.
  void StartPump() {
    if (pump_.joinable()) return;
    pumping_ = true;
    pump_ = std::thread([this] {
      while (pumping_) {
        std::this_thread::sleep_for(kStall / 2);
        gpu_->ReleaseHeld();
      }
    });
  }
  void StopPump() {
    if (!pump_.joinable()) return;
    pumping_ = false;
    pump_.join();
    gpu_->HoldReads(false);
    gpu_->HoldWrites(false);
    gpu_->ReleaseHeld();
  }

  // ---- phases ---------------------------------------------------------------
  void PublishAll(SessionId s, InstanceId inst) {
    PublishRequest p;
    p.instance = inst;
    for (uint64_t k = 1; k <= kKeys; ++k) {
      p.keys.push_back(K(k));
      p.pages.push_back(k - 1);
    }
    Result<PublishResult> r = mgr_->Publish(s, p);
    if (!r.ok()) Note(Outcome::kError, "publish: " + r.status().ToString());
  }
  // A second session publishes and is closed (killed) while its writes are in flight.
  void PublishFromVictim() {
    SessionId victim = mgr_->OpenSession(getpid());
    InstanceId inst = Register(victim);
    std::thread t([&] { PublishAll(victim, inst); });
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    mgr_->CloseSession(victim);
    t.join();
    mgr_->Drain();
  }
  void Restart() {
    mgr_.reset();  // sessions close, lanes drain: everything in flight ends
    if (!Start()) {
      Note(Outcome::kLeak, "restart failed: " + start_error_);
      return;
    }
    session_ = mgr_->OpenSession(getpid());
    inst_ = Register(session_);
  }

  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    int left = 0;
    std::vector<std::pair<uint64_t, Result<RestoreResult>>> done;  // (key, result)
  };
  // Starts a restore of key k (queried alone) into `page`; false on a miss.
  bool StartKey(SessionId s, InstanceId inst, uint64_t k, uint64_t page, Pending& pend,
                std::vector<RestoreId>* ids) {
    Result<QueryResult> q = mgr_->Query(s, {inst, 0, {K(k)}, 10000});
    if (!q.ok()) {
      Note(Outcome::kError, "query: " + q.status().ToString());
      return false;
    }
    if (q->prefix == 0) {
      Note(Outcome::kMiss, "");
      return false;
    }
    pages_.Scribble(page);
    {
      std::lock_guard<std::mutex> l(pend.mu);
      ++pend.left;
    }
    Result<RestoreId> id =
        mgr_->StartRestore(s, {inst, q->query, {0}, {page}}, [&pend, k](Result<RestoreResult> r) {
          std::lock_guard<std::mutex> l(pend.mu);
          pend.done.emplace_back(k, std::move(r));
          --pend.left;
          pend.cv.notify_all();
        });
    if (!id.ok()) {
      std::lock_guard<std::mutex> l(pend.mu);
      --pend.left;
      Note(Outcome::kError, "start restore: " + id.status().ToString());
      (void)mgr_->ReleaseQuery(s, q->query);
      return false;
    }
    if (ids) ids->push_back(*id);
    return true;
  }
  void Wait(Pending& pend) {
    std::unique_lock<std::mutex> l(pend.mu);
    pend.cv.wait(l, [&] { return pend.left == 0; });
  }
  // Judges finished restores: an OK block must hold exactly key k's bytes.
  void Judge(Pending& pend, uint64_t first_page) {
    for (auto& [k, r] : pend.done) {
      const uint64_t page = first_page + k - 1;
      if (!r.ok()) {
        Note(Outcome::kError, "");
        continue;
      }
      const Status& st = r->blocks.at(0).status;
      if (!st.ok()) {
        Note(Outcome::kError, "");
      } else if (!pages_.Holds(page, k)) {
        Note(Outcome::kWrong,
             phase_ + ": key " + std::to_string(k) + " restored OK with wrong bytes");
      } else {
        Note(Outcome::kOk, "");
      }
    }
  }
  void RestoreKey(uint64_t k, uint64_t page) {
    Pending pend;
    if (!StartKey(session_, inst_, k, page, pend, nullptr)) return;
    Wait(pend);
    Judge(pend, page - (k - 1));
  }
  void RestoreAll(bool cancel) {
    Pending pend;
    std::vector<RestoreId> ids;
    for (uint64_t k = 1; k <= kKeys; ++k)
      StartKey(session_, inst_, k, kWorkPage + k - 1, pend, &ids);
    if (cancel) {
      for (RestoreId id : ids) (void)mgr_->CancelRestore(session_, id);
    }
    Wait(pend);
    Judge(pend, kWorkPage);
  }
  void PrepareAll() {
    PrepareRequest p{inst_, 0, {}};
    for (uint64_t k = 1; k <= kKeys; ++k) p.keys.push_back(K(k));
    Result<uint32_t> n = mgr_->Prepare(session_, p);
    if (!n.ok()) Note(Outcome::kError, "prepare: " + n.status().ToString());
    mgr_->Drain();
    DisarmRead();  // what prepare brought into DRAM is restored with the faults off
    for (uint64_t k = 1; k <= kKeys; ++k) RestoreKey(k, kWorkPage + k - 1);
  }
  // A second session restores and is closed (killed) while its reads are in flight.
  void RestoreFromVictim() {
    SessionId victim = mgr_->OpenSession(getpid());
    InstanceId inst = Register(victim);
    Pending pend;
    for (uint64_t k = 1; k <= kKeys; ++k)
      StartKey(victim, inst, k, kWorkPage + k - 1, pend, nullptr);
    mgr_->CloseSession(victim);
    Wait(pend);
    Judge(pend, kWorkPage);
  }
  void RestoreAndRestart() {
    Pending pend;
    for (uint64_t k = 1; k <= kKeys; ++k)
      StartKey(session_, inst_, k, kWorkPage + k - 1, pend, nullptr);
    Restart();
    Wait(pend);
    Judge(pend, kWorkPage);
  }

  void CheckReleased() {
    if (inst_ != 0) {
      if (Status st = mgr_->UnregisterInstance(session_, inst_); !st.ok()) {
        Note(Outcome::kLeak, "unregister: " + st.ToString());
      }
    }
    mgr_->Drain();
    Manager::Gauges g = mgr_->gauges();
    std::ostringstream leaks;
    auto check = [&](const char* what, double v) {
      if (v != 0) leaks << what << "=" << v << " ";
    };
    check("queries", g.queries);
    check("restores", g.restores_inflight);
    check("budget", g.query_budget_used);
    check("dram_pins", g.dram.pinned_entries);
    check("dram_pinned_bytes", g.dram.pinned_bytes);
    check("assemblies", g.dram.assembling_entries);
    check("dram_scratch", g.dram.scratch_bytes);
    check("ssd_leases", g.ssd_leases);
    check("ssd_pinned_bytes", g.ssd_pinned_bytes);
    check("reservations", g.ssd_reservations);
    check("gpu_workers", g.gpu_workers);
    check("gpu_write_jobs", g.gpu_write_jobs);
    check("gpu_batches", g.gpu_inflight_batches);
    check("ipc_mappings", g.gpu_ipc_mappings);
    check("read_staging", metrics_->Read("orbitkv_ssd_read_staging_used_bytes"));
    if (IsCufile(site_)) {
      check("gpu_staging", metrics_->Read("orbitkv_ssd_gpu_staging_bytes", {{"device", "cuda:0"}}));
    }
    if (!leaks.str().empty()) Note(Outcome::kLeak, "not released: " + leaks.str());
  }

  // The cell's outcome is its worst: WRONG > LEAK > err > miss > ok.
  void Note(Outcome o, const std::string& detail) {
    auto rank = [](Outcome x) {
      switch (x) {
        case Outcome::kWrong:
          return 5;
        case Outcome::kLeak:
          return 4;
        case Outcome::kError:
          return 3;
        case Outcome::kMiss:
          return 2;
        default:
          return 1;
      }
    };
    if (rank(o) > rank(result_.outcome)) result_.outcome = o;
    if (!detail.empty() && (o == Outcome::kWrong || o == Outcome::kLeak)) {
      result_.detail += detail + "; ";
    }
  }
  CellResult Fail(Outcome o, const std::string& why) {
    Note(o, why);
    return result_;
  }

  const Fault fault_;
  const Site site_;
  const Workload work_;
  testing::TempDir dir_;
  gpu::FakePlatform fake_;
  std::unique_ptr<FaultInjectingPlatform> gpu_;
  EnginePages pages_;
  MatrixIoFaults io_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<Manager> mgr_;
  std::string start_error_;
  std::string phase_;
  SessionId session_ = 0;
  InstanceId inst_ = 0;
  uint64_t shard_size_ = 0;
  std::thread pump_;
  std::atomic<bool> pumping_{false};
  CellResult result_;
};

TEST(FaultMatrix, EveryCellEndsInAnErrorAMissOrExactBytesAndReleasesEverything) {
  const char* only = std::getenv("ORBITKV_FAULT_MATRIX_CELLS");
  std::map<Outcome, int> counts;
  std::map<std::string, std::string> na_reasons;  // reason -> first cell
  std::ostringstream table;
  table << "\nfault matrix: " << std::size(kFaults) << " faults x " << std::size(kSites)
        << " sites x " << std::size(kWorkloads) << " workloads\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-26s", "fault / site");
  table << line;
  for (Workload w : kWorkloads) {
    std::snprintf(line, sizeof line, " %-13s", Name(w));
    table << line;
  }
  table << "\n";
  for (Fault f : kFaults) {
    for (Site s : kSites) {
      std::snprintf(line, sizeof line, "%-26s", (std::string(Name(f)) + " / " + Name(s)).c_str());
      table << line;
      for (Workload w : kWorkloads) {
        const std::string name = std::string(Name(f)) + "/" + Name(s) + "/" + Name(w);
        CellResult r;
        if (std::string why = NotApplicable(f, s, w); !why.empty()) {
          r.outcome = Outcome::kNa;
          na_reasons.emplace(why, name);
        } else if (only && name.find(only) == std::string::npos) {
          std::snprintf(line, sizeof line, " %-13s", "-");
          table << line;
          continue;
        } else {
          Cell cell(f, s, w);
          r = cell.Run();
        }
        ++counts[r.outcome];
        EXPECT_NE(r.outcome, Outcome::kWrong) << name << ": " << r.detail;
        EXPECT_NE(r.outcome, Outcome::kLeak) << name << ": " << r.detail;
        std::snprintf(line, sizeof line, " %-13s", Name(r.outcome));
        table << line;
      }
      table << "\n";
    }
  }
  table << "cells by outcome:";
  for (Outcome o : {Outcome::kOk, Outcome::kMiss, Outcome::kError, Outcome::kNa, Outcome::kWrong,
                    Outcome::kLeak}) {
    table << " " << Name(o) << " " << counts[o];
  }
  table << "\n(ok: every block restored exactly; miss: some key not found; err: some block failed "
           "or was cancelled; WRONG: a restore returned OK with wrong bytes; LEAK: something was "
           "not released)\n";
  for (const auto& [why, cell] : na_reasons) table << "n/a (e.g. " << cell << "): " << why << "\n";
  std::fputs(table.str().c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace
}  // namespace orbitkv
