// The GPU tier's seam: what the Manager needs from CUDA and cuFile, as an
// interface with no CUDA types, so the code above it (the per instance/device
// SSD worker, CUDA page registration, backend selection) builds and is
// unit-tested everywhere.
//
// Implementations:
//  * CreateCudaPlatform() (gpu/cuda_platform.h, CUDA builds only): the CUDA
//    runtime and the dlopen()ed libcufile.
//  * FakePlatform (gpu/fake_platform.h): host memory posing as device memory,
//    one thread per stream, pread/pwrite for cuFile; CPU tests and CI.
//  * FaultInjectingPlatform (gpu/fault_injecting_platform.h): wraps either one
//    to fail, shorten or hold cuFile operations and to count them (the spec's
//    gates run against it on the H200 and in CI).
//
// Model (mirrors CUDA): work enqueued on one Stream runs in order; an Event
// recorded on a stream completes when everything enqueued before it has run.
// Enqueue calls return an error only for a refused submission; failures of
// the work itself show up at Poll/Wait of a later event, or, for storage I/O,
// in AsyncIo::bytes_done (cuFile's contract: a short or negative count).
//
// DevPtr is a device address in the device's unified address space (fake:
// a host address). Host pointers passed to copies must be pinned (the DRAM
// pool and read staging are registered with CUDA).
//
// Thread-safety: every method of Platform and Device is thread-safe. A Stream
// may be enqueued on from several threads; callers that need their copies and
// their event to be contiguous serialise themselves.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "orbitkv/status.h"

namespace orbitkv::gpu {

using DevPtr = uint64_t;

// cudaIpcMemHandle_t's bytes (64), as an engine exports them.
using IpcHandle = std::array<uint8_t, 64>;

class Stream {
 public:
  virtual ~Stream() = default;
};

class Event {
 public:
  virtual ~Event() = default;
};

// A file registered with cuFile (cuFileHandleRegister). Deregistered by the
// destructor. REQUIRES: destroyed before its Platform.
class StorageFile {
 public:
  virtual ~StorageFile() = default;
  virtual int fd() const = 0;
};

// One asynchronous cuFile operation's arguments. cuFile reads size,
// file_offset and buf_offset when the operation runs on its stream, not when it
// is submitted, and writes bytes_done when it completes: the object must stay
// at the same address until an event recorded after the operation completes.
struct AsyncIo {
  size_t size = 0;
  off_t file_offset = 0;
  off_t buf_offset = 0;    // into the registered buffer passed with it
  ssize_t bytes_done = 0;  // out: bytes transferred, or a negative error
};

// One contiguous copy between device (or pinned host) addresses.
struct CopyOp {
  DevPtr dst = 0;
  DevPtr src = 0;
  uint64_t bytes = 0;
};

// One CRC32C to compute: over device bytes [data, data + bytes).
struct CrcOp {
  DevPtr data = 0;
  uint64_t bytes = 0;
};

// One storage-codec frame (codec/codec.h) in device memory to decode into
// device memory: [frame, +frame_size) into [out, +out_size). Both addresses
// 16-byte aligned (out unused by a check-only op).
struct DecodeOp {
  DevPtr frame = 0;
  uint64_t frame_size = 0;  // the segment's encoded size (object format)
  DevPtr out = 0;
  uint64_t out_size = 0;  // the decoded size the frame must have
  // Checks beyond the frame's own (prefix, CRC32C), all made before any op
  // of the same group writes a byte:
  std::optional<uint32_t> segment_crc;  // CRC32C the stored frame bytes must have
  uint8_t dtype = 0;                    // the dtype the prefix must name (codec::DType); 0: any
  std::optional<uint32_t> param;        // the prefix param it must have (TurboQuant: head_dim)
  bool check_only = false;              // segment_crc only (required); never decoded
  // Ops of one group (an object) decode all or none: one failing a check
  // leaves every output of the group untouched. REQUIRES: group < the number
  // of ops of the call; kOwnGroup: the op's own.
  static constexpr uint32_t kOwnGroup = ~0u;
  uint32_t group = kOwnGroup;
};

// How a DecodeOp ended (FrameDecoder::Finish). status is OK exactly when the
// op passed its checks and (unless check-only) decoded.
enum class DecodeCheck : uint8_t {
  kPassed,      // the checks passed; a failed status is a decode error (output unspecified)
  kSegmentCrc,  // the stored bytes' CRC32C is not segment_crc (its group untouched)
  kFrame,       // prefix, dtype, param, sizes or the frame's own CRC32C (its group untouched)
  kSibling,     // another op of its group failed a check (its group untouched)
};
struct DecodeResult {
  Status status;
  DecodeCheck check = DecodeCheck::kPassed;
};

// Decodes storage-codec frames that are in device memory straight into
// device memory (CUDA: codec/codec_cuda.h's CudaDecoder; fake: the CPU
// codec), giving the CPU decoder's bytes. Each op's checks (DecodeOp) run on
// the device before a byte of its group's outputs is written. A frame
// malformed past them is Corruption with its output unspecified. One
// DecodeAsync then Finish at a time; not thread-safe. REQUIRES: destroyed
// before its Platform.
class FrameDecoder {
 public:
  virtual ~FrameDecoder() = default;
  // Device scratch this decoder holds (a codec budget counts it).
  virtual uint64_t scratch_bytes() const = 0;
  // Enqueues, after the stream's earlier work, the check and decode of every
  // op, all of codec `codec` (TurboQuant: head vectors of `head_dim`).
  // InvalidArgument for kNone, misaligned addresses, a group out of range, a
  // check-only op without segment_crc, or more ops than the decoder was made
  // for (nothing enqueued). Frames and outputs stay valid until Finish returns.
  virtual Status DecodeAsync(codec::CodecId codec, uint32_t head_dim, std::span<const DecodeOp> ops,
                             Stream& stream) = 0;
  // Waits for the stream; one result per op of the last DecodeAsync
  // (Corruption naming the cause), or the stream's failure.
  virtual Result<std::vector<DecodeResult>> Finish(Stream& stream) = 0;
};

// One raw segment in device memory to encode into a frame buffer in device
// memory: [raw, +raw_size) into [frame, +frame_capacity). Both addresses
// 16-byte aligned; frame_capacity at least codec::MaxEncodedSize of it.
struct EncodeOp {
  DevPtr raw = 0;
  uint64_t raw_size = 0;
  DevPtr frame = 0;
  uint64_t frame_capacity = 0;
};

// Encodes raw segments that are in device memory into storage-codec frames in
// device memory (CUDA: codec/codec_cuda.h's CudaEncoder; fake: the CPU codec),
// byte for byte the frames the CPU's codec::Encode(codec, info, raw) gives.
// One EncodeAsync then Finish at a time; not thread-safe. REQUIRES: destroyed
// before its Platform.
class FrameEncoder {
 public:
  virtual ~FrameEncoder() = default;
  // Device scratch this encoder holds now (CUDA's ans grows it for larger
  // batches: a few bytes per 4 KiB chunk and plane, about 5 KiB per segment).
  virtual uint64_t scratch_bytes() const = 0;
  // Enqueues, after the stream's earlier work, the encoding of every op, all
  // of `codec` and `info`. InvalidArgument for kNone, a shape the codec
  // refuses, small or misaligned buffers, more ops than the encoder was made
  // for (nothing enqueued). Inputs and frames stay valid until Finish returns.
  virtual Status EncodeAsync(codec::CodecId codec, const codec::SegmentInfo& info,
                             std::span<const EncodeOp> ops, Stream& stream) = 0;
  // Waits for the stream; the frames are complete, one size per op of the
  // last EncodeAsync, or the stream's (or the encoder's) failure.
  virtual Result<std::vector<uint64_t>> Finish(Stream& stream) = 0;
};

// Whole-object copies of many small slots (Device::CreateSlotTable,
// GatherObjectsAsync): a Publish of a 70B TP=8 rank's block is 160 slots of
// 4 KiB, and per-slot copy and CRC descriptors cost the Manager's request
// thread more CPU per byte than the copy takes (issue 18). A SlotTable says
// once, at the first publish of a group, where each slot of a page sits and
// where it goes in the object; each call then names one page and one object
// address per object.
//
// One slot: page p's bytes of it are [base + p * stride, +bytes) in device
// memory, and go to [object + offset, +bytes) of the object.
struct SlotSpan {
  DevPtr base = 0;
  uint64_t stride = 0;
  uint64_t bytes = 0;
  uint64_t offset = 0;
};
// The largest slot a SlotTable takes (one CRC piece: gpu/crc32c_grid.h).
inline constexpr uint64_t kGatherSlotMaxBytes = 16u << 10;
// The most slots a SlotTable takes (the object format's kMaxSlotsPerGroup).
inline constexpr size_t kGatherMaxSlots = 4096;

// A checked, device-resident table of slots (CreateSlotTable). REQUIRES:
// destroyed before its Device, and before the memory its slots name is freed
// or closed.
class SlotTable {
 public:
  virtual ~SlotTable() = default;
  virtual size_t slots() const = 0;
  virtual uint64_t pages() const = 0;
  virtual uint64_t object_bytes() const = 0;  // the end of the last slot in an object
};

// One object of a GatherObjectsAsync call: the slots of page `page` into the
// object at `object` (pinned host memory registered with CUDA, or device
// memory).
struct ObjectGather {
  uint64_t page = 0;
  DevPtr object = 0;
};

// An engine allocation opened from its IPC handle.
struct IpcMapping {
  DevPtr base = 0;
  uint64_t bytes = 0;  // the size of the whole allocation the handle names
};

// A job that moves at least this many bytes between host and device takes
// longer than the default wait spin (100 us) on any PCIe link (8 MiB: about
// 150 us at 55 GB/s), so its waiter uses WaitLong.
inline constexpr uint64_t kLongWaitBytes = 8u << 20;

class Device {
 public:
  virtual ~Device() = default;
  virtual int ordinal() const = 0;

  // Opens an allocation another process exported with cudaIpcGetMemHandle.
  // InvalidArgument for a handle that does not open (the driver's message).
  virtual Result<IpcMapping> OpenIpc(const IpcHandle& handle) = 0;
  // REQUIRES: no work that touches the mapping is still enqueued.
  virtual Status CloseIpc(DevPtr base) = 0;

  // Device memory (staging). ResourceExhausted when it cannot be allocated.
  virtual Result<DevPtr> Allocate(uint64_t bytes) = 0;
  virtual Status Free(DevPtr ptr) = 0;

  // Pinned host memory the device can read and write at the same address
  // (cudaHostAlloc, mapped and portable): small results the host reads after
  // an event. ResourceExhausted when it cannot be allocated.
  virtual Result<uint8_t*> AllocateHost(uint64_t bytes) = 0;
  virtual Status FreeHost(uint8_t* ptr) = 0;
  // Whether this device's kernels (CopyAsync's, Crc32cAsync's) can read the
  // host bytes [p, p + bytes) at that address: pinned memory registered with
  // CUDA, where the device uses registered host pointers as they are. False
  // when unsure (the default).
  virtual bool KernelsReadHost(const uint8_t* /*p*/, uint64_t /*bytes*/) const { return false; }

  virtual Result<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual Result<std::unique_ptr<Event>> CreateEvent() = 0;
  virtual Status Record(Event& event, Stream& stream) = 0;
  // true once the work before the event's latest Record has completed; an
  // error when that work failed. An event never recorded is complete.
  virtual Result<bool> Poll(Event& event) = 0;
  // Blocks until Poll would return true (or the error). A short wait: the
  // platform may poll a while before it sleeps (CUDA: ORBITKV_GPU_WAIT_SPIN_US),
  // so that work ending within tens of us (one block's copy) is seen at once.
  virtual Status Wait(Event& event) = 0;
  // Wait's result, without the poll: for work the caller knows to outlast
  // any spin (kLongWaitBytes or more to move), or whose end nobody needs the
  // moment it comes (a Publish job with more of the call's jobs queued behind
  // it). It sleeps at once, so no CPU goes to a spin that could not end in
  // time (issue 18: Manager CPU per GB).
  virtual Status WaitLong(Event& event) { return Wait(event); }
  // Wait, or WaitLong for work that moves kLongWaitBytes or more: the one
  // place that rule lives.
  Status WaitForBytes(Event& event, uint64_t bytes) {
    return bytes >= kLongWaitBytes ? WaitLong(event) : Wait(event);
  }
  virtual Status Synchronize(Stream& stream) = 0;

  // Copies every op, in any order among themselves, after the stream's earlier
  // work. Addresses are device addresses or pinned host addresses (UVA); ops
  // must not overlap. One launch on CUDA.
  virtual Status CopyAsync(std::span<const CopyOp> ops, Stream& stream) = 0;
  virtual Status MemsetAsync(DevPtr dst, uint8_t value, uint64_t bytes, Stream& stream) = 0;
  // After the stream's earlier work, writes the CRC32C (store/crc32c.h:
  // Castagnoli, ~0 in and out, what ISA-L's crc32_iscsi gives) of each op's
  // bytes to out[i]. Ops are taken by value; `out` (device memory or pinned
  // host memory) must stay valid until an event recorded after this call
  // completed. A kernel on CUDA.
  virtual Status Crc32cAsync(std::span<const CrcOp> ops, uint32_t* out, Stream& stream) = 0;
  // A SlotTable of `slots` over pages [0, pages): each slot of 1 to
  // kGatherSlotMaxBytes bytes, every page's bytes of it inside one
  // allocation or IPC mapping of this device, object offsets 16-byte aligned
  // and the slots' object ranges disjoint. InvalidArgument for a slot that
  // breaks a rule (nothing kept); Unavailable where this device does not
  // gather (the default; CUDA where kernels cannot use registered host
  // pointers as they are), so the caller copies slot by slot.
  virtual Result<std::unique_ptr<SlotTable>> CreateSlotTable(std::span<const SlotSpan> /*slots*/,
                                                             uint64_t /*pages*/) {
    return Status::Unavailable("this device does not gather whole objects");
  }
  // After the stream's earlier work, copies each object's slots from its page
  // into it, and writes the CRC32C of slot j's bytes of object i to
  // crcs[i * table.slots() + j]. The bytes between an object's slots are
  // written as zeros; those before its first slot (the header) are not
  // written. Objects (table.object_bytes() each) must lie in pinned host
  // memory registered with this device or in its device memory, and `crcs`
  // in either; all stay valid until an event recorded after this call
  // completed. InvalidArgument for a page out of range or an object or `crcs`
  // the device cannot write (nothing enqueued). A kernel on CUDA.
  virtual Status GatherObjectsAsync(const SlotTable& /*table*/,
                                    std::span<const ObjectGather> /*objects*/, uint32_t* /*crcs*/,
                                    Stream& /*stream*/) {
    return Status::Unavailable("this device does not gather whole objects");
  }
  // Runs fn on a runtime thread when the stream reaches this point; the stream
  // waits for fn to return. fn must not call into the Platform.
  virtual Status HostFuncAsync(std::function<void()> fn, Stream& stream) = 0;

  // cuFile, on this device. Buffers and streams used with ReadAsync/WriteAsync
  // are registered first (cuFileBufRegister, cuFileStreamRegister).
  virtual Status RegisterBuffer(DevPtr ptr, uint64_t bytes) = 0;
  virtual Status DeregisterBuffer(DevPtr ptr) = 0;
  virtual Status RegisterStream(Stream& stream) = 0;
  virtual Status DeregisterStream(Stream& stream) = 0;
  // cuFileReadAsync / cuFileWriteAsync between `file` and buffer + io->buf_offset.
  // `buffer` is the base a RegisterBuffer call registered.
  virtual Status ReadAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) = 0;
  virtual Status WriteAsync(StorageFile& file, DevPtr buffer, AsyncIo* io, Stream& stream) = 0;

  // A frame decoder on this device for batches of up to `max_frames` ops,
  // used with this device's streams. Unavailable when the platform has none
  // (a CUDA platform created without the codec library);
  // ResourceExhausted when its scratch cannot be allocated.
  virtual Result<std::unique_ptr<FrameDecoder>> CreateFrameDecoder(uint32_t max_frames) = 0;
  // A frame encoder on this device for batches of up to `max_segments` ops,
  // used with this device's streams. Unavailable when the platform has none;
  // ResourceExhausted when its scratch cannot be allocated.
  virtual Result<std::unique_ptr<FrameEncoder>> CreateFrameEncoder(uint32_t max_segments) = 0;
};

// How the storage driver is opened (see gpu/cufile_loader.h for the policy).
enum class StoragePolicy {
  kAutoNativeOnly,  // --ssd-backend auto: native GDS or nothing
  kExplicit,        // --ssd-backend cufile: cuFile's configuration as is
};

class Platform {
 public:
  virtual ~Platform() = default;
  // "CUDA 13.0, 1 device" / "fake, 2 devices"; for the startup log.
  virtual std::string Describe() const = 0;
  virtual int device_count() const = 0;
  // The device, created on first use and owned by the Platform.
  // InvalidArgument for an out-of-range ordinal.
  virtual Result<Device*> device(int ordinal) = 0;

  // Loads and opens the storage driver under `policy`. Unavailable (with the
  // driver's code, e.g. "5001", or "libcufile.so.0: not found") when it cannot
  // be used. Returns a one-line description of what was opened.
  virtual Result<std::string> OpenStorage(StoragePolicy policy) = 0;
  // REQUIRES: OpenStorage succeeded. `fd` is open with O_DIRECT.
  virtual Result<std::unique_ptr<StorageFile>> RegisterFile(int fd) = 0;
};

}  // namespace orbitkv::gpu
