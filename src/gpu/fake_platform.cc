// FakePlatform: see fake_platform.h. One mutex (Shared::mu) guards every
// registry; each stream has its own queue, mutex and thread. Work closures
// never run under Shared::mu, and take it only briefly to look up a
// registration.
#include "gpu/fake_platform.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "gpu/slot_spans.h"
#include "store/crc32c.h"

namespace orbitkv::gpu {

namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint8_t kFill = 0xA5;
// IpcHandle bytes: this magic, then the export id (8 bytes, little endian).
constexpr char kIpcMagic[8] = {'O', 'K', 'V', 'F', 'A', 'K', 'E', '\0'};

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::string FakePlatformCounters::ToString() const {
  return fmt::format(
      "allocations {} ({} bytes), registered buffers {}, streams {}, files {}, live streams {}, "
      "events {}, open IPC mappings {}, pinned host allocations {}",
      live_allocations, live_allocation_bytes, registered_buffers, registered_streams,
      registered_files, live_streams, live_events, open_ipc_mappings, host_allocations);
}

std::ostream& operator<<(std::ostream& os, const FakePlatformCounters& c) {
  return os << c.ToString();
}

struct FakePlatform::Shared {
  struct Allocation {
    int device;
    uint64_t bytes;
  };
  struct Exported {
    DevPtr base;
    uint64_t bytes;
    int device;
  };
  struct Mapping {
    uint64_t bytes;
    int refs;
  };
  struct Buffer {
    int device;
    uint64_t bytes;
  };

  explicit Shared(FakePlatformOptions o)
      : options(std::move(o)), device_bytes(static_cast<size_t>(std::max(options.devices, 0))) {}

  // REQUIRES: mu held. Whether a registered buffer lies in [base, base + bytes).
  bool HasBufferIn(DevPtr base, uint64_t bytes) const {
    auto it = buffers.lower_bound(base);
    return it != buffers.end() && it->first < base + bytes;
  }

  const FakePlatformOptions options;
  mutable std::mutex mu;
  bool storage_open = false;
  std::vector<uint64_t> device_bytes;  // allocated (rounded) per device
  std::map<DevPtr, Allocation> allocations;
  std::map<uint64_t, Exported> exports;                // by export id
  std::map<std::pair<int, DevPtr>, Mapping> mappings;  // (device, base)
  std::map<DevPtr, Buffer> buffers;                    // registered, by base
  std::set<uint64_t> registered_streams;               // stream ids
  std::map<uint64_t, int> files;                       // file id -> fd
  uint64_t next_id = 1;
  int live_streams = 0;
  int live_events = 0;
  int host_allocations = 0;  // AllocateHost not yet freed
};

namespace {

using Shared = FakePlatform::Shared;

// A stream's queue; shared with the events recorded on it so they can be
// polled after the stream is gone.
class StreamQueue {
 public:
  // Returns the ticket of `fn`: it has run once completed() >= ticket.
  uint64_t Enqueue(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    cv_.notify_all();
    return ++enqueued_;
  }
  // The ticket of the latest item enqueued so far (0: none).
  uint64_t Tail() const {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }
  bool Done(uint64_t ticket) const {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= ticket;
  }
  void WaitDone(uint64_t ticket) const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return completed_ >= ticket; });
  }
  // The stream thread: runs items in order until Stop() and the queue drained.
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      fn = nullptr;  // destroy captures outside the lock too
      lock.lock();
      ++completed_;
      cv_.notify_all();
    }
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
};

class FakeStream : public Stream {
 public:
  FakeStream(std::shared_ptr<Shared> shared, int device, uint64_t id)
      : shared_(std::move(shared)),
        device_(device),
        id_(id),
        queue_(std::make_shared<StreamQueue>()),
        thread_([q = queue_] { q->Run(); }) {}
  ~FakeStream() override {
    queue_->Stop();
    thread_.join();
    std::lock_guard<std::mutex> lock(shared_->mu);
    --shared_->live_streams;
  }
  int device() const { return device_; }
  uint64_t id() const { return id_; }
  const std::shared_ptr<StreamQueue>& queue() const { return queue_; }

 private:
  std::shared_ptr<Shared> shared_;
  const int device_;
  const uint64_t id_;
  std::shared_ptr<StreamQueue> queue_;
  std::thread thread_;
};

class FakeEvent : public Event {
 public:
  FakeEvent(std::shared_ptr<Shared> shared, int device)
      : shared_(std::move(shared)), device_(device) {}
  ~FakeEvent() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    --shared_->live_events;
  }
  int device() const { return device_; }
  void Record(std::shared_ptr<StreamQueue> queue) {
    const uint64_t ticket = queue->Tail();
    std::lock_guard<std::mutex> lock(mu_);
    queue_ = std::move(queue);
    ticket_ = ticket;
  }
  // The stream and ticket of the latest Record (null queue: never recorded).
  std::pair<std::shared_ptr<StreamQueue>, uint64_t> Latest() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {queue_, ticket_};
  }

 private:
  std::shared_ptr<Shared> shared_;
  const int device_;
  mutable std::mutex mu_;
  std::shared_ptr<StreamQueue> queue_;
  uint64_t ticket_ = 0;
};

class FakeStorageFile : public StorageFile {
 public:
  FakeStorageFile(std::shared_ptr<Shared> shared, int fd, uint64_t id)
      : shared_(std::move(shared)), fd_(fd), id_(id) {}
  ~FakeStorageFile() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->files.erase(id_);
  }
  int fd() const override { return fd_; }
  uint64_t id() const { return id_; }

 private:
  std::shared_ptr<Shared> shared_;
  const int fd_;
  const uint64_t id_;
};

// The body of an async cuFile operation, run on the stream's thread.
void RunStorageIo(const std::shared_ptr<Shared>& shared, uint64_t file_id, DevPtr buffer,
                  AsyncIo* io, bool write) {
  // cuFile semantics: the arguments are read when the operation runs.
  const size_t size = io->size;
  const off_t file_offset = io->file_offset;
  const off_t buf_offset = io->buf_offset;
  int fd = -1;
  uint64_t buffer_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    auto f = shared->files.find(file_id);
    if (f == shared->files.end()) {
      io->bytes_done = -EBADF;
      return;
    }
    fd = f->second;
    auto b = shared->buffers.find(buffer);
    if (b == shared->buffers.end()) {
      io->bytes_done = -EINVAL;
      return;
    }
    buffer_bytes = b->second.bytes;
  }
  if (file_offset < 0 || buf_offset < 0 || size > buffer_bytes ||
      static_cast<uint64_t>(buf_offset) > buffer_bytes - size) {
    io->bytes_done = -EINVAL;
    return;
  }
  char* data = reinterpret_cast<char*>(buffer + static_cast<uint64_t>(buf_offset));
  size_t done = 0;
  while (done < size) {
    const off_t at = file_offset + static_cast<off_t>(done);
    const ssize_t n = write ? ::pwrite(fd, data + done, size - done, at)
                            : ::pread(fd, data + done, size - done, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      io->bytes_done = -errno;
      return;
    }
    if (n == 0) break;  // end of file: a short count, as cuFile reports it
    done += static_cast<size_t>(n);
  }
  io->bytes_done = static_cast<ssize_t>(done);
}

// The fake's frame decoder: the CPU codec on the stream's thread, with the
// checks of the CUDA decoder (prefix and CRC before any output byte).
class FakeFrameDecoder : public FrameDecoder {
 public:
  FakeFrameDecoder(int device, uint32_t max_frames) : device_(device), max_frames_(max_frames) {}
  uint64_t scratch_bytes() const override { return 0; }

  Status DecodeAsync(codec::CodecId codec, uint32_t head_dim, std::span<const DecodeOp> ops,
                     Stream& stream) override {
    auto* s = dynamic_cast<FakeStream*>(&stream);
    if (s == nullptr || s->device() != device_) {
      return Status::InvalidArgument(fmt::format(
          "FrameDecoder::DecodeAsync: stream is not a FakePlatform stream of device {}", device_));
    }
    if (codec == codec::CodecId::kNone || static_cast<int>(codec) >= codec::kNumCodecs) {
      return Status::InvalidArgument("FrameDecoder: no decoder for codec " +
                                     std::string(codec::CodecName(codec)));
    }
    if (ops.size() > max_frames_) {
      return Status::InvalidArgument(
          fmt::format("FrameDecoder: {} frames, created for {}", ops.size(), max_frames_));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const DecodeOp& op = ops[i];
      if (op.frame % 16 != 0 || op.frame == 0 ||
          (!op.check_only && (op.out % 16 != 0 || op.out == 0))) {
        return Status::InvalidArgument(
            fmt::format("FrameDecoder: frame {}: input and output must be 16-byte aligned", i));
      }
      if (op.group != DecodeOp::kOwnGroup && op.group >= ops.size()) {
        return Status::InvalidArgument(
            fmt::format("FrameDecoder: frame {}: group {} out of range", i, op.group));
      }
      if (op.check_only && !op.segment_crc) {
        return Status::InvalidArgument(
            fmt::format("FrameDecoder: frame {}: a check-only frame needs its segment CRC", i));
      }
    }
    auto results = std::make_shared<std::vector<DecodeResult>>(ops.size());
    results_ = results;
    s->queue()->Enqueue(
        [results, codec, head_dim, v = std::vector<DecodeOp>(ops.begin(), ops.end())] {
          DecodeAll(codec, head_dim, v, *results);
        });
    return Status::OK();
  }

  Result<std::vector<DecodeResult>> Finish(Stream& stream) override {
    auto* s = dynamic_cast<FakeStream*>(&stream);
    if (s == nullptr || s->device() != device_) {
      return Status::InvalidArgument("FrameDecoder::Finish: not a stream of this device");
    }
    s->queue()->WaitDone(s->queue()->Tail());
    std::shared_ptr<std::vector<DecodeResult>> r = std::move(results_);
    return r ? std::move(*r) : std::vector<DecodeResult>{};
  }

 private:
  // The CUDA decoder's order: every op's checks, then the ops of groups
  // that passed are decoded.
  static void DecodeAll(codec::CodecId codec, uint32_t head_dim, const std::vector<DecodeOp>& v,
                        std::vector<DecodeResult>& out) {
    std::vector<bool> group_failed(v.size(), false);
    auto group = [&](size_t i) { return v[i].group == DecodeOp::kOwnGroup ? i : v[i].group; };
    for (size_t i = 0; i < v.size(); ++i) {
      out[i] = Check(codec, head_dim, v[i], i);
      if (out[i].check != DecodeCheck::kPassed) group_failed[group(i)] = true;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (out[i].check != DecodeCheck::kPassed) continue;
      if (group_failed[group(i)]) {
        out[i] = {Status::Corruption(fmt::format(
                      "frame {}: not decoded: another segment of its object failed its check", i)),
                  DecodeCheck::kSibling};
        continue;
      }
      if (v[i].check_only) continue;
      const DecodeOp& op = v[i];
      const std::span<const uint8_t> frame{reinterpret_cast<const uint8_t*>(op.frame),
                                           op.frame_size};
      const std::span<uint8_t> dst{reinterpret_cast<uint8_t*>(op.out), op.out_size};
      if (Status st = codec::Decode(frame, dst, codec); !st.ok()) {
        out[i].status = Status::Corruption(fmt::format("decode of frame {}: {}", i, st.message()));
      }
    }
  }

  static DecodeResult Check(codec::CodecId codec, uint32_t head_dim, const DecodeOp& op, size_t i) {
    const std::span<const uint8_t> frame{reinterpret_cast<const uint8_t*>(op.frame), op.frame_size};
    if (op.segment_crc && Crc32c(frame) != *op.segment_crc) {
      return {Status::Corruption(
                  fmt::format("frame {}: payload CRC32C differs from the object header's", i)),
              DecodeCheck::kSegmentCrc};
    }
    if (op.check_only) return {};
    Result<codec::FrameInfo> info = codec::ParseFrame(frame);  // prefix and the frame's own CRC
    Status st = info.status();
    const bool tq = codec == codec::CodecId::kTurboQuant4 || codec == codec::CodecId::kTurboQuant3;
    if (st.ok() && (info->codec != codec || info->decoded_size != op.out_size ||
                    (tq && info->param != head_dim) ||
                    (op.dtype != 0 && static_cast<uint8_t>(info->dtype) != op.dtype) ||
                    (op.param && info->param != *op.param))) {
      st = Status::Corruption("prefix does not match the expected codec, dtype and sizes");
    }
    if (st.ok()) return {};
    return {Status::Corruption(fmt::format("frame {}: {}", i, st.message())), DecodeCheck::kFrame};
  }

  const int device_;
  const uint32_t max_frames_;
  std::shared_ptr<std::vector<DecodeResult>> results_;
};

// The fake's frame encoder: the CPU codec on the stream's thread (so its
// frames are the CPU encoder's by construction), with the CUDA encoder's
// argument checks.
class FakeFrameEncoder : public FrameEncoder {
 public:
  FakeFrameEncoder(int device, uint32_t max_segments)
      : device_(device), max_segments_(max_segments) {}
  uint64_t scratch_bytes() const override { return 0; }

  Status EncodeAsync(codec::CodecId codec, const codec::SegmentInfo& info,
                     std::span<const EncodeOp> ops, Stream& stream) override {
    auto* s = dynamic_cast<FakeStream*>(&stream);
    if (s == nullptr || s->device() != device_) {
      return Status::InvalidArgument(fmt::format(
          "FrameEncoder::EncodeAsync: stream is not a FakePlatform stream of device {}", device_));
    }
    if (codec == codec::CodecId::kNone || static_cast<int>(codec) >= codec::kNumCodecs) {
      return Status::InvalidArgument("FrameEncoder: no encoder for codec " +
                                     std::string(codec::CodecName(codec)));
    }
    if (ops.size() > max_segments_) {
      return Status::InvalidArgument(
          fmt::format("FrameEncoder: {} segments, created for {}", ops.size(), max_segments_));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const EncodeOp& op = ops[i];
      if (op.raw % 16 != 0 || op.frame % 16 != 0 || op.raw == 0 || op.frame == 0) {
        return Status::InvalidArgument(
            fmt::format("FrameEncoder: segment {}: input and frame must be 16-byte aligned", i));
      }
      if (op.frame_capacity < codec::MaxEncodedSize(codec, info, op.raw_size)) {
        return Status::InvalidArgument(
            fmt::format("FrameEncoder: segment {}: frame buffer of {} bytes, {} needed", i,
                        op.frame_capacity, codec::MaxEncodedSize(codec, info, op.raw_size)));
      }
    }
    auto results = std::make_shared<Result<std::vector<uint64_t>>>(std::vector<uint64_t>{});
    results_ = results;
    s->queue()->Enqueue([results, codec, info, v = std::vector<EncodeOp>(ops.begin(), ops.end())] {
      std::vector<uint64_t> sizes;
      for (size_t i = 0; i < v.size(); ++i) {
        Result<size_t> n =
            codec::Encode(codec, info, {reinterpret_cast<const uint8_t*>(v[i].raw), v[i].raw_size},
                          {reinterpret_cast<uint8_t*>(v[i].frame), v[i].frame_capacity});
        if (!n.ok()) {
          *results = n.status().WithContext(fmt::format("encode of segment {}", i));
          return;
        }
        sizes.push_back(*n);
      }
      *results = std::move(sizes);
    });
    return Status::OK();
  }

  Result<std::vector<uint64_t>> Finish(Stream& stream) override {
    auto* s = dynamic_cast<FakeStream*>(&stream);
    if (s == nullptr || s->device() != device_) {
      return Status::InvalidArgument("FrameEncoder::Finish: not a stream of this device");
    }
    s->queue()->WaitDone(s->queue()->Tail());
    std::shared_ptr<Result<std::vector<uint64_t>>> r = std::move(results_);
    return r ? std::move(*r) : Result<std::vector<uint64_t>>(std::vector<uint64_t>{});
  }

 private:
  const int device_;
  const uint32_t max_segments_;
  std::shared_ptr<Result<std::vector<uint64_t>>> results_;
};

// A SlotTable of a FakeDevice: the checked slots, kept on the host.
class FakeSlotTable final : public SlotTable {
 public:
  FakeSlotTable(int ordinal, std::vector<SlotSpan> slots, std::vector<uint64_t> zero_after,
                uint64_t pages, uint64_t object_bytes)
      : ordinal_(ordinal),
        slots_(std::move(slots)),
        zero_after_(std::move(zero_after)),
        pages_(pages),
        object_bytes_(object_bytes) {}
  size_t slots() const override { return slots_.size(); }
  uint64_t pages() const override { return pages_; }
  uint64_t object_bytes() const override { return object_bytes_; }
  int ordinal() const { return ordinal_; }
  const std::vector<SlotSpan>& spans() const { return slots_; }
  const std::vector<uint64_t>& zero_after() const { return zero_after_; }

 private:
  const int ordinal_;
  const std::vector<SlotSpan> slots_;
  const std::vector<uint64_t> zero_after_;
  const uint64_t pages_;
  const uint64_t object_bytes_;
};

class FakeDevice : public Device {
 public:
  FakeDevice(std::shared_ptr<Shared> shared, int ordinal)
      : shared_(std::move(shared)), ordinal_(ordinal) {}

  int ordinal() const override { return ordinal_; }

  Result<IpcMapping> OpenIpc(const IpcHandle& handle) override {
    if (std::memcmp(handle.data(), kIpcMagic, sizeof(kIpcMagic)) != 0) {
      return Status::InvalidArgument(
          "cudaIpcOpenMemHandle: invalid resource handle (not a fake "
          "IPC handle)");
    }
    uint64_t id = 0;
    for (int i = 0; i < 8; ++i) id |= uint64_t{handle[8 + i]} << (8 * i);
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto it = shared_->exports.find(id);
    if (it == shared_->exports.end()) {
      return Status::InvalidArgument(
          fmt::format("cudaIpcOpenMemHandle: invalid resource handle (export {} unknown)", id));
    }
    const Shared::Exported& e = it->second;
    auto [m, inserted] =
        shared_->mappings.try_emplace({ordinal_, e.base}, Shared::Mapping{e.bytes, 0});
    ++m->second.refs;
    return IpcMapping{e.base, e.bytes};
  }

  Status CloseIpc(DevPtr base) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto it = shared_->mappings.find({ordinal_, base});
    if (it == shared_->mappings.end()) {
      return Status::FailedPrecondition(
          fmt::format("CloseIpc: {:#x} is not an open IPC mapping on device {}", base, ordinal_));
    }
    if (it->second.refs == 1 && shared_->HasBufferIn(base, it->second.bytes)) {
      return Status::FailedPrecondition(
          fmt::format("CloseIpc: IPC mapping {:#x} still holds a registered cuFile buffer", base));
    }
    if (--it->second.refs == 0) shared_->mappings.erase(it);
    return Status::OK();
  }

  Result<DevPtr> Allocate(uint64_t bytes) override {
    if (bytes == 0) return Status::InvalidArgument("Allocate: 0 bytes");
    const uint64_t rounded = RoundUp(bytes);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      uint64_t& used = shared_->device_bytes[ordinal_];
      if (rounded > shared_->options.device_memory_bytes - used) {
        return Status::ResourceExhausted(fmt::format(
            "cudaMalloc: out of memory ({} bytes requested on device {}, {} of {} in use)", bytes,
            ordinal_, used, shared_->options.device_memory_bytes));
      }
      used += rounded;  // reserve; given back below if the host is out of memory
    }
    void* mem = std::aligned_alloc(kAlign, rounded);
    if (mem != nullptr) std::memset(mem, kFill, rounded);
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (mem == nullptr) {
      shared_->device_bytes[ordinal_] -= rounded;
      return Status::ResourceExhausted(
          fmt::format("Allocate: host out of memory ({} bytes)", bytes));
    }
    const DevPtr ptr = reinterpret_cast<DevPtr>(mem);
    shared_->allocations[ptr] = Shared::Allocation{ordinal_, bytes};
    return ptr;
  }

  Status Free(DevPtr ptr) override {
    void* mem = nullptr;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      auto it = shared_->allocations.find(ptr);
      if (it == shared_->allocations.end() || it->second.device != ordinal_) {
        return Status::InvalidArgument(
            fmt::format("cudaFree: {:#x} is not an allocation of device {}", ptr, ordinal_));
      }
      if (shared_->HasBufferIn(ptr, it->second.bytes)) {
        return Status::FailedPrecondition(
            fmt::format("cudaFree: {:#x} still holds a registered cuFile buffer", ptr));
      }
      shared_->device_bytes[ordinal_] -= RoundUp(it->second.bytes);
      shared_->allocations.erase(it);
      mem = reinterpret_cast<void*>(ptr);
    }
    std::free(mem);
    return Status::OK();
  }

  Result<uint8_t*> AllocateHost(uint64_t bytes) override {
    if (bytes == 0) return Status::InvalidArgument("AllocateHost: 0 bytes");
    void* mem = std::aligned_alloc(kAlign, RoundUp(bytes));
    if (mem == nullptr) {
      return Status::ResourceExhausted(
          fmt::format("cudaHostAlloc: host out of memory ({} bytes)", bytes));
    }
    std::lock_guard<std::mutex> lock(shared_->mu);
    ++shared_->host_allocations;
    return static_cast<uint8_t*>(mem);
  }

  // The fake's "kernels" are host code: any host address is readable.
  bool KernelsReadHost(const uint8_t* p, uint64_t bytes) const override {
    return p != nullptr && bytes > 0;
  }

  Status FreeHost(uint8_t* ptr) override {
    if (ptr == nullptr) return Status::OK();
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      --shared_->host_allocations;
    }
    std::free(ptr);
    return Status::OK();
  }

  Status Crc32cAsync(std::span<const CrcOp> ops, uint32_t* out, Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "Crc32cAsync"));
    if (ops.empty()) return Status::OK();
    if (out == nullptr) return Status::InvalidArgument("Crc32cAsync: null result address");
    for (const CrcOp& op : ops) {
      if (op.bytes > 0 && op.data == 0) return Status::InvalidArgument("Crc32cAsync: null address");
    }
    s->queue()->Enqueue([crcs = std::vector<CrcOp>(ops.begin(), ops.end()), out] {
      for (size_t i = 0; i < crcs.size(); ++i) {
        out[i] = Crc32c({reinterpret_cast<const uint8_t*>(crcs[i].data), crcs[i].bytes});
      }
    });
    return Status::OK();
  }

  Result<std::unique_ptr<SlotTable>> CreateSlotTable(std::span<const SlotSpan> slots,
                                                     uint64_t pages) override {
    std::vector<uint64_t> extents, zero_after;
    ORBITKV_ASSIGN_OR_RETURN(const uint64_t object_bytes,
                             CheckSlotSpans(slots, pages, &extents, &zero_after));
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      for (size_t i = 0; i < slots.size(); ++i) {
        if (!IsDeviceMemoryLocked(slots[i].base, extents[i])) {
          return Status::InvalidArgument(fmt::format(
              "CreateSlotTable slot {}: [{:#x}, +{}) is not inside one allocation or IPC mapping "
              "of device {}",
              i, slots[i].base, extents[i], ordinal_));
        }
      }
    }
    return std::unique_ptr<SlotTable>(
        std::make_unique<FakeSlotTable>(ordinal_, std::vector<SlotSpan>(slots.begin(), slots.end()),
                                        std::move(zero_after), pages, object_bytes));
  }

  Status GatherObjectsAsync(const SlotTable& table, std::span<const ObjectGather> objects,
                            uint32_t* crcs, Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "GatherObjectsAsync"));
    const auto* t = dynamic_cast<const FakeSlotTable*>(&table);
    if (t == nullptr || t->ordinal() != ordinal_) {
      return Status::InvalidArgument(
          fmt::format("GatherObjectsAsync: the table is not one of device {}", ordinal_));
    }
    if (objects.empty()) return Status::OK();
    if (crcs == nullptr) return Status::InvalidArgument("GatherObjectsAsync: null CRC address");
    for (size_t i = 0; i < objects.size(); ++i) {
      if (objects[i].page >= t->pages() || objects[i].object == 0) {
        return Status::InvalidArgument(
            fmt::format("GatherObjectsAsync object {}: page {} at {:#x} (a table over {} pages)", i,
                        objects[i].page, objects[i].object, t->pages()));
      }
    }
    s->queue()->Enqueue([spans = t->spans(), zero_after = t->zero_after(),
                         todo = std::vector<ObjectGather>(objects.begin(), objects.end()), crcs] {
      for (size_t i = 0; i < todo.size(); ++i) {
        for (size_t j = 0; j < spans.size(); ++j) {
          const SlotSpan& sl = spans[j];
          const auto* src = reinterpret_cast<const uint8_t*>(sl.base + todo[i].page * sl.stride);
          auto* dst = reinterpret_cast<uint8_t*>(todo[i].object + sl.offset);
          std::memcpy(dst, src, sl.bytes);
          std::memset(dst + sl.bytes, 0, zero_after[j]);
          crcs[i * spans.size() + j] = Crc32c({src, sl.bytes});
        }
      }
    });
    return Status::OK();
  }

  Result<std::unique_ptr<Stream>> CreateStream() override {
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      id = shared_->next_id++;
      ++shared_->live_streams;
    }
    return std::unique_ptr<Stream>(std::make_unique<FakeStream>(shared_, ordinal_, id));
  }

  Result<std::unique_ptr<Event>> CreateEvent() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      ++shared_->live_events;
    }
    return std::unique_ptr<Event>(std::make_unique<FakeEvent>(shared_, ordinal_));
  }

  Status Record(Event& event, Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "Record"));
    auto* e = dynamic_cast<FakeEvent*>(&event);
    if (e == nullptr || e->device() != ordinal_) {
      return Status::InvalidArgument(
          fmt::format("Record: event is not a FakePlatform event of device {}", ordinal_));
    }
    e->Record(s->queue());
    return Status::OK();
  }

  Result<bool> Poll(Event& event) override {
    FakeEvent* e = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(e, Own(event, "Poll"));
    auto [queue, ticket] = e->Latest();
    return queue == nullptr || queue->Done(ticket);
  }

  Status Wait(Event& event) override {
    FakeEvent* e = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(e, Own(event, "Wait"));
    auto [queue, ticket] = e->Latest();
    if (queue != nullptr) queue->WaitDone(ticket);
    return Status::OK();
  }

  Status Synchronize(Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "Synchronize"));
    s->queue()->WaitDone(s->queue()->Tail());
    return Status::OK();
  }

  Status CopyAsync(std::span<const CopyOp> ops, Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "CopyAsync"));
    for (const CopyOp& op : ops) {
      if (op.bytes > 0 && (op.dst == 0 || op.src == 0)) {
        return Status::InvalidArgument("CopyAsync: null address");
      }
    }
    s->queue()->Enqueue([copies = std::vector<CopyOp>(ops.begin(), ops.end())] {
      for (const CopyOp& op : copies) {
        if (op.bytes == 0) continue;
        std::memcpy(reinterpret_cast<void*>(op.dst), reinterpret_cast<const void*>(op.src),
                    op.bytes);
      }
    });
    return Status::OK();
  }

  Status MemsetAsync(DevPtr dst, uint8_t value, uint64_t bytes, Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "MemsetAsync"));
    if (bytes > 0 && dst == 0) return Status::InvalidArgument("MemsetAsync: null address");
    s->queue()->Enqueue([dst, value, bytes] {
      if (bytes > 0) std::memset(reinterpret_cast<void*>(dst), value, bytes);
    });
    return Status::OK();
  }

  Status HostFuncAsync(std::function<void()> fn, Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "HostFuncAsync"));
    if (!fn) return Status::InvalidArgument("HostFuncAsync: empty function");
    s->queue()->Enqueue(std::move(fn));
    return Status::OK();
  }

  Status RegisterBuffer(DevPtr ptr, uint64_t bytes) override {
    if (ptr == 0 || bytes == 0) {
      return Status::InvalidArgument("cuFileBufRegister: null buffer or 0 bytes");
    }
    std::lock_guard<std::mutex> lock(shared_->mu);
    ORBITKV_RETURN_IF_ERROR(StorageOpenLocked("cuFileBufRegister"));
    if (!IsDeviceMemoryLocked(ptr, bytes)) {
      return Status::InvalidArgument(fmt::format(
          "cuFileBufRegister: [{:#x}, +{}) is not in an allocation or IPC mapping of device {}",
          ptr, bytes, ordinal_));
    }
    // Any overlap with a registered buffer (the same base included).
    auto next = shared_->buffers.lower_bound(ptr);
    const bool overlaps_next = next != shared_->buffers.end() && next->first < ptr + bytes;
    bool overlaps_prev = false;
    if (next != shared_->buffers.begin()) {
      auto prev = std::prev(next);
      overlaps_prev = prev->first + prev->second.bytes > ptr;
    }
    if (overlaps_next || overlaps_prev) {
      return Status::AlreadyExists(
          fmt::format("cuFileBufRegister: [{:#x}, +{}) overlaps a registered buffer "
                      "(CU_FILE_MEMORY_ALREADY_REGISTERED)",
                      ptr, bytes));
    }
    shared_->buffers[ptr] = Shared::Buffer{ordinal_, bytes};
    return Status::OK();
  }

  Status DeregisterBuffer(DevPtr ptr) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto it = shared_->buffers.find(ptr);
    if (it == shared_->buffers.end() || it->second.device != ordinal_) {
      return Status::FailedPrecondition(fmt::format(
          "cuFileBufDeregister: {:#x} is not a registered buffer of device {}", ptr, ordinal_));
    }
    shared_->buffers.erase(it);
    return Status::OK();
  }

  Status RegisterStream(Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "cuFileStreamRegister"));
    std::lock_guard<std::mutex> lock(shared_->mu);
    ORBITKV_RETURN_IF_ERROR(StorageOpenLocked("cuFileStreamRegister"));
    if (!shared_->registered_streams.insert(s->id()).second) {
      return Status::AlreadyExists("cuFileStreamRegister: stream already registered");
    }
    return Status::OK();
  }

  Status DeregisterStream(Stream& stream) override {
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, "cuFileStreamDeregister"));
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->registered_streams.erase(s->id()) == 0) {
      return Status::FailedPrecondition("cuFileStreamDeregister: stream not registered");
    }
    return Status::OK();
  }

  Status ReadAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) override {
    return SubmitIo(file, buffer, io, stream, /*write=*/false);
  }
  Status WriteAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) override {
    return SubmitIo(file, buffer, io, stream, /*write=*/true);
  }

  Result<std::unique_ptr<FrameDecoder>> CreateFrameDecoder(uint32_t max_frames) override {
    if (max_frames == 0) return Status::InvalidArgument("CreateFrameDecoder: 0 frames");
    return std::unique_ptr<FrameDecoder>(std::make_unique<FakeFrameDecoder>(ordinal_, max_frames));
  }
  Result<std::unique_ptr<FrameEncoder>> CreateFrameEncoder(uint32_t max_segments) override {
    if (max_segments == 0) return Status::InvalidArgument("CreateFrameEncoder: 0 segments");
    return std::unique_ptr<FrameEncoder>(
        std::make_unique<FakeFrameEncoder>(ordinal_, max_segments));
  }

 private:
  Result<FakeStream*> Own(Stream& stream, const char* what) const {
    auto* s = dynamic_cast<FakeStream*>(&stream);
    if (s == nullptr || s->device() != ordinal_) {
      return Status::InvalidArgument(
          fmt::format("{}: stream is not a FakePlatform stream of device {}", what, ordinal_));
    }
    return s;
  }
  Result<FakeEvent*> Own(Event& event, const char* what) const {
    auto* e = dynamic_cast<FakeEvent*>(&event);
    if (e == nullptr || e->device() != ordinal_) {
      return Status::InvalidArgument(
          fmt::format("{}: event is not a FakePlatform event of device {}", what, ordinal_));
    }
    return e;
  }

  // REQUIRES: shared_->mu held.
  Status StorageOpenLocked(const char* what) const {
    if (!shared_->storage_open) {
      return Status::FailedPrecondition(
          fmt::format("{}: storage driver not opened (OpenStorage)", what));
    }
    return Status::OK();
  }

  // REQUIRES: shared_->mu held. Whether [ptr, ptr + bytes) lies inside one
  // live allocation or open IPC mapping of this device.
  bool IsDeviceMemoryLocked(DevPtr ptr, uint64_t bytes) const {
    auto a = shared_->allocations.upper_bound(ptr);
    if (a != shared_->allocations.begin()) {
      --a;
      if (a->second.device == ordinal_ && ptr - a->first <= a->second.bytes &&
          bytes <= a->second.bytes - (ptr - a->first)) {
        return true;
      }
    }
    auto m = shared_->mappings.upper_bound({ordinal_, ptr});
    if (m != shared_->mappings.begin()) {
      --m;
      const DevPtr base = m->first.second;
      if (m->first.first == ordinal_ && ptr - base <= m->second.bytes &&
          bytes <= m->second.bytes - (ptr - base)) {
        return true;
      }
    }
    return false;
  }

  Status SubmitIo(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream, bool write) {
    const char* what = write ? "cuFileWriteAsync" : "cuFileReadAsync";
    FakeStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Own(stream, what));
    auto* f = dynamic_cast<FakeStorageFile*>(&file);
    if (f == nullptr) {
      return Status::InvalidArgument(fmt::format("{}: file is not a FakePlatform file", what));
    }
    if (io == nullptr) return Status::InvalidArgument(fmt::format("{}: null AsyncIo", what));
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      ORBITKV_RETURN_IF_ERROR(StorageOpenLocked(what));
      if (shared_->files.count(f->id()) == 0) {
        return Status::FailedPrecondition(fmt::format("{}: file not registered", what));
      }
      if (shared_->registered_streams.count(s->id()) == 0) {
        return Status::FailedPrecondition(
            fmt::format("{}: stream not registered (cuFileStreamRegister)", what));
      }
      auto b = shared_->buffers.find(buffer);
      if (b == shared_->buffers.end() || b->second.device != ordinal_) {
        return Status::FailedPrecondition(
            fmt::format("{}: {:#x} is not the base of a registered buffer of device {}", what,
                        buffer, ordinal_));
      }
    }
    s->queue()->Enqueue([shared = shared_, file_id = f->id(), buffer, io, write] {
      RunStorageIo(shared, file_id, buffer, io, write);
    });
    return Status::OK();
  }

  const std::shared_ptr<Shared> shared_;
  const int ordinal_;
};

}  // namespace

FakePlatform::FakePlatform(FakePlatformOptions options)
    : shared_(std::make_shared<Shared>(std::move(options))) {
  devices_.resize(shared_->device_bytes.size());
}

FakePlatform::~FakePlatform() {
  // Leaked allocations (the counters showed them) go back to the host.
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (auto& [ptr, allocation] : shared_->allocations) std::free(reinterpret_cast<void*>(ptr));
  shared_->allocations.clear();
}

IpcHandle FakePlatform::Export(void* host, uint64_t bytes, int device) {
  const DevPtr base = reinterpret_cast<DevPtr>(host);
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (const auto& [existing, e] : shared_->exports) {
      if (e.base == base) id = existing;
    }
    if (id == 0) {
      id = shared_->next_id++;
      shared_->exports[id] = Shared::Exported{base, bytes, device};
    }
  }
  IpcHandle handle{};
  std::memcpy(handle.data(), kIpcMagic, sizeof(kIpcMagic));
  for (int i = 0; i < 8; ++i) handle[8 + i] = static_cast<uint8_t>(id >> (8 * i));
  return handle;
}

FakePlatformCounters FakePlatform::counters() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  FakePlatformCounters c;
  c.live_allocations = static_cast<int>(shared_->allocations.size());
  for (const auto& [ptr, a] : shared_->allocations) c.live_allocation_bytes += a.bytes;
  c.registered_buffers = static_cast<int>(shared_->buffers.size());
  c.registered_streams = static_cast<int>(shared_->registered_streams.size());
  c.registered_files = static_cast<int>(shared_->files.size());
  c.live_streams = shared_->live_streams;
  c.live_events = shared_->live_events;
  c.host_allocations = shared_->host_allocations;
  for (const auto& [key, m] : shared_->mappings) c.open_ipc_mappings += m.refs;
  return c;
}

int FakePlatform::open_ipc_mappings() const { return counters().open_ipc_mappings; }

std::string FakePlatform::Describe() const {
  const int n = device_count();
  return fmt::format("fake, {} device{}", n, n == 1 ? "" : "s");
}

int FakePlatform::device_count() const { return static_cast<int>(devices_.size()); }

Result<Device*> FakePlatform::device(int ordinal) {
  if (ordinal < 0 || ordinal >= device_count()) {
    return Status::InvalidArgument(
        fmt::format("device {} out of range ({} devices)", ordinal, device_count()));
  }
  std::lock_guard<std::mutex> lock(devices_mu_);
  auto& d = devices_[ordinal];
  if (d == nullptr) d = std::make_unique<FakeDevice>(shared_, ordinal);
  return d.get();
}

Result<std::string> FakePlatform::OpenStorage(StoragePolicy policy) {
  if (!shared_->options.storage_error.empty()) {
    return Status::Unavailable(shared_->options.storage_error);
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->storage_open = true;
  return std::string(policy == StoragePolicy::kAutoNativeOnly
                         ? "fake cuFile (pread/pwrite), native only"
                         : "fake cuFile (pread/pwrite), explicit");
}

Result<std::unique_ptr<StorageFile>> FakePlatform::RegisterFile(int fd) {
  if (!shared_->options.register_file_error.empty()) {
    return Status::Unavailable(shared_->options.register_file_error);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) {
    return Status::InvalidArgument(
        fmt::format("cuFileHandleRegister: fd {}: {}", fd, std::strerror(errno)));
  }
  if ((flags & O_DIRECT) == 0) {
    return Status::InvalidArgument(
        fmt::format("cuFileHandleRegister: fd {} is not open with O_DIRECT", fd));
  }
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->storage_open) {
      return Status::FailedPrecondition(
          "cuFileHandleRegister: storage driver not opened (OpenStorage)");
    }
    id = shared_->next_id++;
    shared_->files[id] = fd;
  }
  return std::unique_ptr<StorageFile>(std::make_unique<FakeStorageFile>(shared_, fd, id));
}

}  // namespace orbitkv::gpu
