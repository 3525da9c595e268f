// FakePlatform: the Platform seam (gpu/platform.h) without a GPU, for unit
// tests and CI. Builds everywhere (no CUDA headers, no libcufile).
//
// Model:
//  * Device memory is host memory: DevPtr values are host addresses. Allocate
//    returns 4 KiB aligned memory filled with 0xA5 (not zeroed, so a test that
//    forgets to write a buffer reads garbage), charged against a per-device
//    limit. Copies and memsets are memcpy/memset.
//  * IPC: Export() poses a host buffer as an engine's cudaMalloc allocation and
//    returns its handle; OpenIpc of that handle maps it (reference counted per
//    device, as CUDA does when one context opens a handle twice).
//  * Streams: one thread per stream runs its work in FIFO order. An Event's
//    Record marks the stream's current tail; Poll is true once everything
//    enqueued before the latest Record has run. No fake work fails, so Poll and
//    Wait never return an error.
//  * cuFile: the contract of cuFileBufRegister / cuFileStreamRegister /
//    cuFileHandleRegister / cuFileReadAsync / cuFileWriteAsync, executed with
//    pread/pwrite on the stream's thread. Submission checks that storage was
//    opened and that the file, stream and buffer base are registered (else
//    FailedPrecondition). The operation reads io->size, io->file_offset and
//    io->buf_offset when it runs, not when it is submitted, and stores the byte
//    count (short at end of file) or -errno in io->bytes_done: -EINVAL when
//    buf_offset + size leaves the registered buffer, -EBADF when the file was
//    deregistered before the operation ran.
//  * CreateFrameDecoder: the CPU codec (codec/codec.h) on the stream's thread,
//    with the CUDA decoder's checks (prefix against the op and the frame's
//    CRC32C before any output byte); no device scratch.
//  * CreateFrameEncoder: the CPU codec's Encode on the stream's thread (its
//    frames are the CPU encoder's); no device scratch.
//  * CreateSlotTable / GatherObjectsAsync: the slot rules (gpu/slot_spans.h),
//    each slot's pages inside one allocation or IPC mapping of the device,
//    then memcpy, zeroed gaps and ISA-L CRC32Cs on the stream's thread.
//
// Stricter than CUDA where that catches bugs cheaply (each refusal is
// FailedPrecondition unless noted): RegisterBuffer/RegisterStream/RegisterFile
// and I/O before a successful OpenStorage; RegisterBuffer of memory that is
// not a live allocation or open IPC mapping of that device (InvalidArgument)
// or that overlaps a registered buffer (AlreadyExists); Free or the last
// CloseIpc of memory that still holds a registered buffer; RegisterFile of an
// fd without O_DIRECT (InvalidArgument); streams and events used with another
// device, or objects from another Platform (InvalidArgument).
//
// Counters (counters()) let tests assert that everything was released:
// allocations, registrations, open mappings, live streams and events.
//
// Thread-safety: as Platform (every method of FakePlatform and its devices is
// thread-safe). Ownership: devices are owned by the FakePlatform; Streams,
// Events and StorageFiles by the caller, and they may outlive the platform
// (their bookkeeping is shared), though a destroyed stream first runs the
// work still queued on it. Allocations leaked at destruction are freed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::gpu {

struct FakePlatformOptions {
  int devices = 1;
  // Per device; Allocate beyond it is ResourceExhausted.
  uint64_t device_memory_bytes = uint64_t{1} << 30;
  // When set, OpenStorage fails with Unavailable and this text (e.g.
  // "cuFileDriverOpen: 5001 CU_FILE_DRIVER_NOT_INITIALIZED").
  std::string storage_error;
  // When set, RegisterFile fails with Unavailable and this text.
  std::string register_file_error;
};

// A snapshot of what is live; all zero once everything was released.
struct FakePlatformCounters {
  int live_allocations = 0;
  uint64_t live_allocation_bytes = 0;  // as requested (not rounded up)
  int registered_buffers = 0;
  int registered_streams = 0;
  int registered_files = 0;
  int live_streams = 0;
  int live_events = 0;
  int open_ipc_mappings = 0;  // open references (each OpenIpc not yet closed)
  int host_allocations = 0;   // AllocateHost not yet freed

  bool operator==(const FakePlatformCounters&) const = default;
  std::string ToString() const;
};
std::ostream& operator<<(std::ostream& os, const FakePlatformCounters& c);

class FakePlatform : public Platform {
 public:
  explicit FakePlatform(FakePlatformOptions options = {});
  ~FakePlatform() override;
  FakePlatform(const FakePlatform&) = delete;
  FakePlatform& operator=(const FakePlatform&) = delete;

  // Test API: poses [host, host + bytes) as an allocation an engine made on
  // `device` and exported with cudaIpcGetMemHandle. Exporting the same base
  // again returns the same handle. REQUIRES: host != nullptr, bytes > 0, the
  // buffer stays valid while mapped.
  IpcHandle Export(void* host, uint64_t bytes, int device);

  FakePlatformCounters counters() const;
  int open_ipc_mappings() const;

  // Platform.
  std::string Describe() const override;  // "fake, 2 devices"
  int device_count() const override;
  Result<Device*> device(int ordinal) override;
  // Unavailable with options.storage_error when that is set.
  Result<std::string> OpenStorage(StoragePolicy policy) override;
  // Unavailable with options.register_file_error when that is set.
  Result<std::unique_ptr<StorageFile>> RegisterFile(int fd) override;

  struct Shared;  // bookkeeping shared with devices, streams, events, files

 private:
  std::shared_ptr<Shared> shared_;
  mutable std::mutex devices_mu_;
  std::vector<std::unique_ptr<Device>> devices_;  // by ordinal, created lazily
};

}  // namespace orbitkv::gpu
