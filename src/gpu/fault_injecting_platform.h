// FaultInjectingPlatform: wraps any Platform (the fake in CI, the CUDA
// platform on the H200) to fail, shorten, refuse or hold cuFile operations and
// to count them, so the GPU tier's gate tests run unchanged on both.
//
// Every Device, Stream, Event and StorageFile it returns is a wrapper that
// forwards to the inner platform's object; pass only its own wrappers back to
// it (foreign objects are InvalidArgument).
//
// Knobs (thread-safe; they apply to calls made after they are set):
//  * FailOpenStorage / FailRegisterFile: every later call fails with the
//    status, without reaching the inner platform, until set back to OK.
//  * FailRegisterBuffer(count, status): the next `count` RegisterBuffer calls
//    fail with the status without reaching the inner platform.
//  * FailReads / FailWrites(count, fault): the next `count` ReadAsync /
//    WriteAsync submissions are forwarded as usual, followed on the same stream
//    by a host function that overwrites io->bytes_done when the operation has
//    run: kShort makes it io->size - 4096 (io->size / 2 when io->size <= 4096),
//    kError -EIO. The host function neither blocks nor calls the platform, so
//    this works on CUDA streams too.
//  * RefuseReadSubmits(count, status): the next `count` ReadAsync calls return
//    the status without submitting anything (a partial submission, as when
//    cuFileReadAsync refuses one of a batch).
//  * CorruptReads(count, offset, value): the next `count` ReadAsync
//    submissions (of more than `offset` bytes) run as usual, then a 1-byte
//    MemsetAsync on the same stream sets the byte at `offset` of what the read
//    delivered to `value`: a payload bit flip, torn or misdirected read that
//    cuFile reports as complete.
//  * CorruptCrcs(count): the next `count` Crc32cAsync or GatherObjectsAsync
//    calls run, then a host function flips a bit of their first result
//    (REQUIRES: `out` is host memory, as the SSD worker's pinned results are).
//  * RefuseCrcs(count, status): the next `count` Crc32cAsync or
//    GatherObjectsAsync calls return the status without enqueueing anything
//    (a CRC kernel launch that fails).
//  * DenySlotTables(deny): while on, CreateSlotTable is Unavailable (a device
//    that does not gather whole objects: callers copy slot by slot).
//  * RefuseHostFuncs(count, status): the next `count` HostFuncAsync calls of
//    callers return the status without enqueueing anything (the knobs' own
//    host functions are not counted).
//  * DenyKernelHostReads(deny): while on, KernelsReadHost answers false (a
//    system whose kernels cannot use registered host pointers).
//  * FailEncodes(count, status): the next `count` EncodeAsync calls of the
//    frame encoders it made run as usual, then their Finish returns the
//    status instead of the frame sizes (a failed GPU encode).
//  * RefuseCopiesFrom(begin, bytes, count, status): the next `count`
//    CopyAsync (GatherObjectsAsync) calls with an op (an object's slot) whose
//    source overlaps [begin, +bytes) return the status without enqueueing
//    anything (a failed D2H of those pages).
//  * FailAllocations(count, status): the next `count` Device::Allocate calls
//    return the status without allocating (device memory full).
//  * HoldWrites / HoldReads(true): a write (read) submitted while the hold is
//    on runs normally, but its completion is held at the event level: an event
//    recorded after it on the same stream reports false from Poll, and Wait and
//    Synchronize of that stream block, until ReleaseHeld(). No stream is ever
//    blocked, so this is safe on CUDA. Switching a hold off stops holding later
//    operations; what is already held stays held until ReleaseHeld().
//    held_events() counts events currently held (tests wait on it to know an
//    operation is being held).
//
// Call accounting (calls()): ReadAsync / WriteAsync submissions the inner
// platform accepted (refused or failed submissions are not counted), with
// io->size at submission and the file's fd of each read; RegisterBuffer and
// RegisterFile calls, whether or not they succeeded; Device::Wait,
// Device::WaitLong and Device::Poll calls; GatherObjectsAsync calls the inner
// device accepted and their objects. ResetCalls() clears it.
//
// Thread-safety: every method is thread-safe, as Platform requires.
// Ownership: `inner` is not owned and must outlive this object and every
// object it returned; devices are owned by this object; Streams, Events and
// StorageFiles by the caller (they own their inner object) and must be
// destroyed before the inner platform. REQUIRES before destroying an Event
// or Stream that is held: nothing waits on it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::gpu {

class FaultInjectingPlatform : public Platform {
 public:
  enum class IoFault {
    kShort,  // bytes_done = size - 4096 (size / 2 when size <= 4096)
    kError,  // bytes_done = -EIO
  };

  struct Calls {
    uint64_t reads = 0;
    uint64_t read_bytes = 0;  // sum of io->size at submission
    uint64_t writes = 0;
    uint64_t write_bytes = 0;
    std::vector<uint64_t> read_sizes;  // io->size of each read, at submission
    std::vector<int> read_fds;         // StorageFile::fd() of each read
    uint64_t register_buffers = 0;
    uint64_t register_files = 0;
    uint64_t waits = 0;       // Device::Wait calls (short waits: may spin)
    uint64_t long_waits = 0;  // Device::WaitLong calls (sleep at once)
    uint64_t polls = 0;       // Device::Poll calls
    uint64_t gathers = 0;     // GatherObjectsAsync calls accepted
    uint64_t gathered_objects = 0;
  };

  explicit FaultInjectingPlatform(Platform* inner);
  ~FaultInjectingPlatform() override;
  FaultInjectingPlatform(const FaultInjectingPlatform&) = delete;
  FaultInjectingPlatform& operator=(const FaultInjectingPlatform&) = delete;

  // OK clears the fault.
  void FailOpenStorage(Status status);
  void FailRegisterFile(Status status);
  void FailRegisterBuffer(int count, Status status);
  void FailReads(int count, IoFault fault);
  void FailWrites(int count, IoFault fault);
  void RefuseReadSubmits(int count, Status status);
  void CorruptReads(int count, uint64_t offset, uint8_t value);
  void CorruptCrcs(int count);
  void RefuseCrcs(int count, Status status);
  void RefuseHostFuncs(int count, Status status);
  void DenyKernelHostReads(bool deny);
  void DenySlotTables(bool deny);
  void FailEncodes(int count, Status status);
  void RefuseCopiesFrom(DevPtr begin, uint64_t bytes, int count, Status status);
  void FailAllocations(int count, Status status);

  // While on, ReadAsync blocks in the call (a device that does not return);
  // stalled_read_submits() counts the calls blocked now.
  void StallReadSubmits(bool stall);
  int stalled_read_submits() const;

  void HoldWrites(bool hold);
  void HoldReads(bool hold);
  // Releases everything held so far (holds that are still on keep holding
  // operations submitted after this call).
  void ReleaseHeld();
  int held_events() const;

  Calls calls() const;
  void ResetCalls();

  // Platform: forwards to `inner`, applying the knobs above.
  std::string Describe() const override;  // "fault injection over <inner>"
  int device_count() const override;
  Result<Device*> device(int ordinal) override;
  Result<std::string> OpenStorage(StoragePolicy policy) override;
  Result<std::unique_ptr<StorageFile>> RegisterFile(int fd) override;

  struct State;  // knobs, holds and call accounting, shared with the wrappers

 private:
  Platform* const inner_;
  std::shared_ptr<State> state_;
  std::mutex devices_mu_;
  std::vector<std::unique_ptr<Device>> devices_;  // by ordinal, created lazily
};

}  // namespace orbitkv::gpu
