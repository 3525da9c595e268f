// FaultInjectingPlatform: see fault_injecting_platform.h.
//
// Holds: State::epoch counts ReleaseHeld() calls. An operation submitted while
// its hold is on stamps its stream with the current epoch; an event recorded
// on a stamped stream takes the stamp. A stamp equal to the current epoch is
// held; ReleaseHeld() bumps the epoch, which releases every stamp at once.
#include "gpu/fault_injecting_platform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <optional>
#include <set>
#include <utility>

namespace orbitkv::gpu {

struct FaultInjectingPlatform::State {
  // REQUIRES: mu held.
  bool Held(uint64_t stamp) const { return stamp != 0 && stamp == epoch; }

  mutable std::mutex mu;
  std::condition_variable cv;  // signalled by ReleaseHeld
  Status open_storage_fault;
  Status register_file_fault;
  int register_buffer_failures = 0;
  Status register_buffer_fault;
  int read_failures = 0;
  IoFault read_fault = IoFault::kError;
  int write_failures = 0;
  IoFault write_fault = IoFault::kError;
  int refused_reads = 0;
  Status refuse_status;
  int corrupt_reads = 0;
  uint64_t corrupt_offset = 0;
  uint8_t corrupt_value = 0;
  int corrupt_crcs = 0;
  int refused_crcs = 0;
  bool deny_kernel_host_reads = false;
  bool deny_slot_tables = false;
  Status refuse_crc_status;
  int refused_host_funcs = 0;
  Status refuse_host_func_status;
  int failed_encodes = 0;
  Status encode_fault;
  int refused_copies = 0;
  DevPtr refuse_copy_begin = 0;
  uint64_t refuse_copy_bytes = 0;
  Status refuse_copy_status;
  int failed_allocations = 0;
  Status allocation_fault;
  bool hold_reads = false;
  bool stall_read_submits = false;
  int stalled_read_submits = 0;
  bool hold_writes = false;
  uint64_t epoch = 1;           // stamps are epochs; 0 is "not held"
  std::set<const Event*> held;  // events whose stamp is the current epoch
  Calls calls;
};

namespace {

using State = FaultInjectingPlatform::State;
using IoFault = FaultInjectingPlatform::IoFault;

class WrappedStream : public Stream {
 public:
  explicit WrappedStream(std::unique_ptr<Stream> inner) : inner_(std::move(inner)) {}
  Stream& inner() { return *inner_; }
  uint64_t stamp = 0;  // guarded by State::mu

 private:
  std::unique_ptr<Stream> inner_;
};

class WrappedEvent : public Event {
 public:
  WrappedEvent(std::shared_ptr<State> state, std::unique_ptr<Event> inner)
      : state_(std::move(state)), inner_(std::move(inner)) {}
  ~WrappedEvent() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->held.erase(this);
  }
  Event& inner() { return *inner_; }
  uint64_t stamp = 0;  // guarded by State::mu

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<Event> inner_;
};

// Forwards to the inner device's decoder with the inner stream.
class WrappedFrameDecoder : public FrameDecoder {
 public:
  explicit WrappedFrameDecoder(std::unique_ptr<FrameDecoder> inner) : inner_(std::move(inner)) {}
  uint64_t scratch_bytes() const override { return inner_->scratch_bytes(); }
  Status DecodeAsync(codec::CodecId codec, uint32_t head_dim, std::span<const DecodeOp> ops,
                     Stream& stream) override {
    auto* s = dynamic_cast<WrappedStream*>(&stream);
    if (s == nullptr) return Status::InvalidArgument("DecodeAsync: foreign stream");
    return inner_->DecodeAsync(codec, head_dim, ops, s->inner());
  }
  Result<std::vector<DecodeResult>> Finish(Stream& stream) override {
    auto* s = dynamic_cast<WrappedStream*>(&stream);
    if (s == nullptr) return Status::InvalidArgument("Finish: foreign stream");
    return inner_->Finish(s->inner());
  }

 private:
  std::unique_ptr<FrameDecoder> inner_;
};

// Forwards to the inner device's encoder with the inner stream; Finish
// reports the FailEncodes fault instead of the sizes.
class WrappedFrameEncoder : public FrameEncoder {
 public:
  WrappedFrameEncoder(std::shared_ptr<State> state, std::unique_ptr<FrameEncoder> inner)
      : state_(std::move(state)), inner_(std::move(inner)) {}
  uint64_t scratch_bytes() const override { return inner_->scratch_bytes(); }
  Status EncodeAsync(codec::CodecId codec, const codec::SegmentInfo& info,
                     std::span<const EncodeOp> ops, Stream& stream) override {
    auto* s = dynamic_cast<WrappedStream*>(&stream);
    if (s == nullptr) return Status::InvalidArgument("EncodeAsync: foreign stream");
    ORBITKV_RETURN_IF_ERROR(inner_->EncodeAsync(codec, info, ops, s->inner()));
    std::lock_guard<std::mutex> lock(state_->mu);
    fail_ = Status::OK();
    if (state_->failed_encodes > 0) {
      --state_->failed_encodes;
      fail_ = state_->encode_fault;
    }
    return Status::OK();
  }
  Result<std::vector<uint64_t>> Finish(Stream& stream) override {
    auto* s = dynamic_cast<WrappedStream*>(&stream);
    if (s == nullptr) return Status::InvalidArgument("Finish: foreign stream");
    Result<std::vector<uint64_t>> r = inner_->Finish(s->inner());
    if (!fail_.ok()) return std::exchange(fail_, Status::OK());
    return r;
  }

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<FrameEncoder> inner_;
  Status fail_;  // this encoder's last EncodeAsync drew a fault (one call at a time)
};

class WrappedFile : public StorageFile {
 public:
  explicit WrappedFile(std::unique_ptr<StorageFile> inner) : inner_(std::move(inner)) {}
  int fd() const override { return inner_->fd(); }
  StorageFile& inner() { return *inner_; }

 private:
  std::unique_ptr<StorageFile> inner_;
};

ssize_t Injected(IoFault fault, size_t size) {
  if (fault == IoFault::kError) return -EIO;
  return static_cast<ssize_t>(size > 4096 ? size - 4096 : size / 2);
}

// A SlotTable of the inner device, with its slots (RefuseCopiesFrom looks at
// a gather's sources).
class WrappedSlotTable final : public SlotTable {
 public:
  WrappedSlotTable(std::unique_ptr<SlotTable> inner, std::vector<SlotSpan> spans)
      : inner_(std::move(inner)), spans_(std::move(spans)) {}
  size_t slots() const override { return inner_->slots(); }
  uint64_t pages() const override { return inner_->pages(); }
  uint64_t object_bytes() const override { return inner_->object_bytes(); }
  const SlotTable& inner() const { return *inner_; }
  const std::vector<SlotSpan>& spans() const { return spans_; }

 private:
  const std::unique_ptr<SlotTable> inner_;
  const std::vector<SlotSpan> spans_;
};

class WrappedDevice : public Device {
 public:
  WrappedDevice(std::shared_ptr<State> state, Device* inner)
      : state_(std::move(state)), inner_(inner) {}

  int ordinal() const override { return inner_->ordinal(); }
  Result<IpcMapping> OpenIpc(const IpcHandle& handle) override { return inner_->OpenIpc(handle); }
  Status CloseIpc(DevPtr base) override { return inner_->CloseIpc(base); }
  Result<DevPtr> Allocate(uint64_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->failed_allocations > 0) {
        --state_->failed_allocations;
        return state_->allocation_fault;
      }
    }
    return inner_->Allocate(bytes);
  }
  Status Free(DevPtr ptr) override { return inner_->Free(ptr); }
  Result<uint8_t*> AllocateHost(uint64_t bytes) override { return inner_->AllocateHost(bytes); }
  bool KernelsReadHost(const uint8_t* p, uint64_t bytes) const override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->deny_kernel_host_reads) return false;
    }
    return inner_->KernelsReadHost(p, bytes);
  }
  Status FreeHost(uint8_t* ptr) override { return inner_->FreeHost(ptr); }

  Status Crc32cAsync(std::span<const CrcOp> ops, uint32_t* out, Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "Crc32cAsync"));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->refused_crcs > 0) {
        --state_->refused_crcs;
        return state_->refuse_crc_status;
      }
    }
    ORBITKV_RETURN_IF_ERROR(inner_->Crc32cAsync(ops, out, s->inner()));
    return MaybeCorruptCrcs(!ops.empty(), out, *s, "Crc32cAsync");
  }

  Result<std::unique_ptr<SlotTable>> CreateSlotTable(std::span<const SlotSpan> slots,
                                                     uint64_t pages) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->deny_slot_tables) {
        return Status::Unavailable("fault injection: this device does not gather whole objects");
      }
    }
    std::unique_ptr<SlotTable> inner;
    ORBITKV_ASSIGN_OR_RETURN(inner, inner_->CreateSlotTable(slots, pages));
    return std::unique_ptr<SlotTable>(std::make_unique<WrappedSlotTable>(
        std::move(inner), std::vector<SlotSpan>(slots.begin(), slots.end())));
  }

  // The copy and the CRC knobs both apply: a gather is a copy and a CRC.
  Status GatherObjectsAsync(const SlotTable& table, std::span<const ObjectGather> objects,
                            uint32_t* crcs, Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "GatherObjectsAsync"));
    const auto* t = dynamic_cast<const WrappedSlotTable*>(&table);
    if (t == nullptr) {
      return Status::InvalidArgument("GatherObjectsAsync: the table is not one of this platform");
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->refused_crcs > 0 && !objects.empty()) {
        --state_->refused_crcs;
        return state_->refuse_crc_status;
      }
      if (state_->refused_copies > 0) {
        const DevPtr lo = state_->refuse_copy_begin;
        const DevPtr hi = lo + state_->refuse_copy_bytes;
        const bool hit = std::any_of(objects.begin(), objects.end(), [&](const ObjectGather& o) {
          return std::any_of(t->spans().begin(), t->spans().end(), [&](const SlotSpan& sl) {
            const DevPtr src = sl.base + o.page * sl.stride;
            return src < hi && src + sl.bytes > lo;
          });
        });
        if (hit) {
          --state_->refused_copies;
          return state_->refuse_copy_status;
        }
      }
    }
    ORBITKV_RETURN_IF_ERROR(inner_->GatherObjectsAsync(t->inner(), objects, crcs, s->inner()));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->calls.gathers;
      state_->calls.gathered_objects += objects.size();
    }
    return MaybeCorruptCrcs(!objects.empty(), crcs, *s, "GatherObjectsAsync");
  }

  Result<std::unique_ptr<Stream>> CreateStream() override {
    std::unique_ptr<Stream> inner;
    ORBITKV_ASSIGN_OR_RETURN(inner, inner_->CreateStream());
    return std::unique_ptr<Stream>(std::make_unique<WrappedStream>(std::move(inner)));
  }

  Result<std::unique_ptr<Event>> CreateEvent() override {
    std::unique_ptr<Event> inner;
    ORBITKV_ASSIGN_OR_RETURN(inner, inner_->CreateEvent());
    return std::unique_ptr<Event>(std::make_unique<WrappedEvent>(state_, std::move(inner)));
  }

  Status Record(Event& event, Stream& stream) override {
    WrappedEvent* e = nullptr;
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(e, Unwrap(event, "Record"));
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "Record"));
    ORBITKV_RETURN_IF_ERROR(inner_->Record(e->inner(), s->inner()));
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->Held(s->stamp)) {
      e->stamp = s->stamp;
      state_->held.insert(e);
    } else {
      e->stamp = 0;
      state_->held.erase(e);
    }
    return Status::OK();
  }

  Result<bool> Poll(Event& event) override {
    WrappedEvent* e = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(e, Unwrap(event, "Poll"));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->calls.polls;
      if (state_->Held(e->stamp)) return false;
    }
    return inner_->Poll(e->inner());
  }

  Status Wait(Event& event) override { return WaitFor(event, /*long_wait=*/false); }
  Status WaitLong(Event& event) override { return WaitFor(event, /*long_wait=*/true); }

  Status Synchronize(Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "Synchronize"));
    ORBITKV_RETURN_IF_ERROR(inner_->Synchronize(s->inner()));
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return !state_->Held(s->stamp); });
    return Status::OK();
  }

  Status CopyAsync(std::span<const CopyOp> ops, Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "CopyAsync"));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->refused_copies > 0) {
        const DevPtr lo = state_->refuse_copy_begin;
        const DevPtr hi = lo + state_->refuse_copy_bytes;
        const bool hit = std::any_of(ops.begin(), ops.end(), [&](const CopyOp& op) {
          return op.bytes > 0 && op.src < hi && op.src + op.bytes > lo;
        });
        if (hit) {
          --state_->refused_copies;
          return state_->refuse_copy_status;
        }
      }
    }
    return inner_->CopyAsync(ops, s->inner());
  }

  Status MemsetAsync(DevPtr dst, uint8_t value, uint64_t bytes, Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "MemsetAsync"));
    return inner_->MemsetAsync(dst, value, bytes, s->inner());
  }

  Status HostFuncAsync(std::function<void()> fn, Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "HostFuncAsync"));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->refused_host_funcs > 0) {
        --state_->refused_host_funcs;
        return state_->refuse_host_func_status;
      }
    }
    return inner_->HostFuncAsync(std::move(fn), s->inner());
  }

  Status RegisterBuffer(DevPtr ptr, uint64_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->calls.register_buffers;
      if (state_->register_buffer_failures > 0) {
        --state_->register_buffer_failures;
        return state_->register_buffer_fault;
      }
    }
    return inner_->RegisterBuffer(ptr, bytes);
  }

  Status DeregisterBuffer(DevPtr ptr) override { return inner_->DeregisterBuffer(ptr); }

  Status RegisterStream(Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "RegisterStream"));
    return inner_->RegisterStream(s->inner());
  }

  Status DeregisterStream(Stream& stream) override {
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, "DeregisterStream"));
    return inner_->DeregisterStream(s->inner());
  }

  Status ReadAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) override {
    return Submit(file, buffer, io, stream, /*write=*/false);
  }
  Status WriteAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) override {
    return Submit(file, buffer, io, stream, /*write=*/true);
  }
  Result<std::unique_ptr<FrameDecoder>> CreateFrameDecoder(uint32_t max_frames) override {
    std::unique_ptr<FrameDecoder> inner;
    ORBITKV_ASSIGN_OR_RETURN(inner, inner_->CreateFrameDecoder(max_frames));
    return std::unique_ptr<FrameDecoder>(std::make_unique<WrappedFrameDecoder>(std::move(inner)));
  }
  Result<std::unique_ptr<FrameEncoder>> CreateFrameEncoder(uint32_t max_segments) override {
    std::unique_ptr<FrameEncoder> inner;
    ORBITKV_ASSIGN_OR_RETURN(inner, inner_->CreateFrameEncoder(max_segments));
    return std::unique_ptr<FrameEncoder>(
        std::make_unique<WrappedFrameEncoder>(state_, std::move(inner)));
  }

 private:
  // CorruptCrcs: after the kernel wrote them, the first result is wrong
  // (`out` is host memory).
  Status MaybeCorruptCrcs(bool any, uint32_t* out, WrappedStream& s, const char* what) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->corrupt_crcs <= 0 || !any) return Status::OK();
      --state_->corrupt_crcs;
    }
    return inner_->HostFuncAsync([out] { out[0] ^= 0x00010000u; }, s.inner())
        .WithContext(std::string(what) + " submitted, but its injected fault was not");
  }
  static Result<WrappedStream*> Unwrap(Stream& stream, const char* what) {
    auto* s = dynamic_cast<WrappedStream*>(&stream);
    if (s == nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}: stream does not come from this FaultInjectingPlatform", what));
    }
    return s;
  }
  static Result<WrappedEvent*> Unwrap(Event& event, const char* what) {
    auto* e = dynamic_cast<WrappedEvent*>(&event);
    if (e == nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}: event does not come from this FaultInjectingPlatform", what));
    }
    return e;
  }

  // Wait or WaitLong of the inner device, then until the event is not held.
  Status WaitFor(Event& event, bool long_wait) {
    WrappedEvent* e = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(e, Unwrap(event, long_wait ? "WaitLong" : "Wait"));
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++(long_wait ? state_->calls.long_waits : state_->calls.waits);
    }
    ORBITKV_RETURN_IF_ERROR(long_wait ? inner_->WaitLong(e->inner()) : inner_->Wait(e->inner()));
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return !state_->Held(e->stamp); });
    return Status::OK();
  }

  Status Submit(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream, bool write) {
    const char* what = write ? "WriteAsync" : "ReadAsync";
    WrappedStream* s = nullptr;
    ORBITKV_ASSIGN_OR_RETURN(s, Unwrap(stream, what));
    auto* f = dynamic_cast<WrappedFile*>(&file);
    if (f == nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}: file does not come from this FaultInjectingPlatform", what));
    }
    if (io == nullptr) return Status::InvalidArgument(fmt::format("{}: null AsyncIo", what));
    if (!write) {
      std::unique_lock<std::mutex> lock(state_->mu);
      if (state_->stall_read_submits) {
        ++state_->stalled_read_submits;
        state_->cv.wait(lock, [&] { return !state_->stall_read_submits; });
        --state_->stalled_read_submits;
      }
      if (state_->refused_reads > 0) {
        --state_->refused_reads;
        return state_->refuse_status;
      }
    }
    const size_t size = io->size;  // the caller may change it once submitted
    const int fd = f->fd();
    ORBITKV_RETURN_IF_ERROR(write ? inner_->WriteAsync(f->inner(), buffer, io, s->inner())
                                  : inner_->ReadAsync(f->inner(), buffer, io, s->inner()));
    std::optional<IoFault> fault;
    std::optional<std::pair<uint64_t, uint8_t>> corrupt;  // offset in the read, value
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!write && state_->corrupt_reads > 0 && state_->corrupt_offset < size) {
        --state_->corrupt_reads;
        corrupt.emplace(state_->corrupt_offset, state_->corrupt_value);
      }
      FaultInjectingPlatform::Calls& calls = state_->calls;
      if (write) {
        ++calls.writes;
        calls.write_bytes += size;
      } else {
        ++calls.reads;
        calls.read_bytes += size;
        calls.read_sizes.push_back(size);
        calls.read_fds.push_back(fd);
      }
      int& failures = write ? state_->write_failures : state_->read_failures;
      if (failures > 0) {
        --failures;
        fault = write ? state_->write_fault : state_->read_fault;
      }
      if (write ? state_->hold_writes : state_->hold_reads) s->stamp = state_->epoch;
    }
    if (fault) {
      // Runs on the stream after the operation completed; reads the size the
      // operation ran with.
      Status st = inner_->HostFuncAsync(
          [io, f = *fault] { io->bytes_done = Injected(f, io->size); }, s->inner());
      if (!st.ok()) {
        return st.WithContext(fmt::format("{} submitted, but its injected fault was not", what));
      }
    }
    if (corrupt) {
      // A byte the device "read" wrongly: overwritten in the buffer after the read ran.
      const DevPtr at = buffer + static_cast<uint64_t>(io->buf_offset) + corrupt->first;
      Status st = inner_->MemsetAsync(at, corrupt->second, 1, s->inner());
      if (!st.ok()) {
        return st.WithContext(
            fmt::format("{} submitted, but its injected corruption was not", what));
      }
    }
    return Status::OK();
  }

  const std::shared_ptr<State> state_;
  Device* const inner_;
};

}  // namespace

FaultInjectingPlatform::FaultInjectingPlatform(Platform* inner)
    : inner_(inner), state_(std::make_shared<State>()) {
  devices_.resize(static_cast<size_t>(std::max(inner_->device_count(), 0)));
}

FaultInjectingPlatform::~FaultInjectingPlatform() = default;

void FaultInjectingPlatform::FailOpenStorage(Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->open_storage_fault = std::move(status);
}

void FaultInjectingPlatform::FailRegisterFile(Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->register_file_fault = std::move(status);
}

void FaultInjectingPlatform::FailRegisterBuffer(int count, Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->register_buffer_failures = status.ok() ? 0 : count;
  state_->register_buffer_fault = std::move(status);
}

void FaultInjectingPlatform::FailReads(int count, IoFault fault) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->read_failures = count;
  state_->read_fault = fault;
}

void FaultInjectingPlatform::FailWrites(int count, IoFault fault) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->write_failures = count;
  state_->write_fault = fault;
}

void FaultInjectingPlatform::RefuseReadSubmits(int count, Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->refused_reads = status.ok() ? 0 : count;
  state_->refuse_status = std::move(status);
}

void FaultInjectingPlatform::CorruptReads(int count, uint64_t offset, uint8_t value) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->corrupt_reads = count;
  state_->corrupt_offset = offset;
  state_->corrupt_value = value;
}

void FaultInjectingPlatform::RefuseCopiesFrom(DevPtr begin, uint64_t bytes, int count,
                                              Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->refused_copies = status.ok() ? 0 : count;
  state_->refuse_copy_begin = begin;
  state_->refuse_copy_bytes = bytes;
  state_->refuse_copy_status = std::move(status);
}

void FaultInjectingPlatform::FailAllocations(int count, Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->failed_allocations = status.ok() ? 0 : count;
  state_->allocation_fault = std::move(status);
}

void FaultInjectingPlatform::CorruptCrcs(int count) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->corrupt_crcs = count;
}

void FaultInjectingPlatform::RefuseCrcs(int count, Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->refused_crcs = status.ok() ? 0 : count;
  state_->refuse_crc_status = std::move(status);
}

void FaultInjectingPlatform::RefuseHostFuncs(int count, Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->refused_host_funcs = status.ok() ? 0 : count;
  state_->refuse_host_func_status = std::move(status);
}

void FaultInjectingPlatform::DenyKernelHostReads(bool deny) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->deny_kernel_host_reads = deny;
}

void FaultInjectingPlatform::DenySlotTables(bool deny) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->deny_slot_tables = deny;
}

void FaultInjectingPlatform::FailEncodes(int count, Status status) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->failed_encodes = count;
  state_->encode_fault = std::move(status);
}

void FaultInjectingPlatform::HoldWrites(bool hold) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hold_writes = hold;
}

void FaultInjectingPlatform::StallReadSubmits(bool stall) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stall_read_submits = stall;
  }
  state_->cv.notify_all();
}

int FaultInjectingPlatform::stalled_read_submits() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stalled_read_submits;
}

void FaultInjectingPlatform::HoldReads(bool hold) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->hold_reads = hold;
}

void FaultInjectingPlatform::ReleaseHeld() {
  std::lock_guard<std::mutex> lock(state_->mu);
  ++state_->epoch;
  state_->held.clear();
  state_->cv.notify_all();
}

int FaultInjectingPlatform::held_events() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int>(state_->held.size());
}

FaultInjectingPlatform::Calls FaultInjectingPlatform::calls() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->calls;
}

void FaultInjectingPlatform::ResetCalls() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->calls = Calls{};
}

std::string FaultInjectingPlatform::Describe() const {
  return "fault injection over " + inner_->Describe();
}

int FaultInjectingPlatform::device_count() const { return inner_->device_count(); }

Result<Device*> FaultInjectingPlatform::device(int ordinal) {
  Device* inner = nullptr;
  ORBITKV_ASSIGN_OR_RETURN(inner, inner_->device(ordinal));
  std::lock_guard<std::mutex> lock(devices_mu_);
  if (static_cast<size_t>(ordinal) >= devices_.size()) devices_.resize(ordinal + 1);
  auto& d = devices_[ordinal];
  if (d == nullptr) d = std::make_unique<WrappedDevice>(state_, inner);
  return d.get();
}

Result<std::string> FaultInjectingPlatform::OpenStorage(StoragePolicy policy) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->open_storage_fault.ok()) return state_->open_storage_fault;
  }
  return inner_->OpenStorage(policy);
}

Result<std::unique_ptr<StorageFile>> FaultInjectingPlatform::RegisterFile(int fd) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->calls.register_files;
    if (!state_->register_file_fault.ok()) return state_->register_file_fault;
  }
  std::unique_ptr<StorageFile> inner;
  ORBITKV_ASSIGN_OR_RETURN(inner, inner_->RegisterFile(fd));
  return std::unique_ptr<StorageFile>(std::make_unique<WrappedFile>(std::move(inner)));
}

}  // namespace orbitkv::gpu
