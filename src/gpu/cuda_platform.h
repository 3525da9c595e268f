// The CUDA implementation of the GPU seam (gpu/platform.h): the CUDA runtime
// (linked statically) and NVIDIA's libcufile (dlopen()ed through
// gpu/cufile_loader.h, never linked). CUDA builds only; everything else
// reaches it through gpu/platform_default.h.
//
// Devices are created on first device(i), after CheckDevice(i) (existing,
// usable, new enough for this build's kernels), and owned by the platform.
// Every Device method first makes its device current on the calling thread
// (cudaSetDevice), so it leaves that device current for the caller.
//
// Mapping onto CUDA:
//  * Streams are cudaStreamNonBlocking; events cudaEventDisableTiming (Wait
//    follows the device's scheduling flags: spin, yield or block). Poll is
//    cudaEventQuery; Wait cudaEventSynchronize. Streams and events belong to
//    the device that created them: using them with another device, or passing
//    objects of another Platform implementation, is InvalidArgument.
//  * Allocate / Free: cudaMalloc / cudaFree with the thread's stream-capture
//    mode relaxed (an engine thread of the same process may be capturing).
//  * CopyAsync classifies each op's addresses with cudaPointerGetAttributes,
//    reusing an allocation's answer (its extent from cuMemGetAddressRange) for
//    later ops of the same call only, so freed and reused addresses are safe:
//    ops between memory the device's kernels can address (its own device
//    memory, IPC mappings opened on it, managed memory) go through one
//    gather/scatter kernel launch per kCopyOpsPerLaunch ops (per
//    kCopyOpsPerLargeLaunch in a call of more); ops between
//    mapped pinned host memory and this device go as ORBITKV_GPU_COPY says
//    (gpu/copy_options.h): staged through double-buffered device staging
//    (gpu/staged_mover.h, the default), one copy-engine DMA each, or the
//    gather kernel; other ops (another device's memory) use the copy engines
//    (gpu/copy_kernels.h). Staged chunks run on the device's internal streams
//    after the caller stream's earlier work, and the caller stream waits for
//    them, so an event recorded on it after the call covers them. An address CUDA does not know as
//    device or pinned host memory (pageable host memory, garbage) is InvalidArgument and nothing of
//    the call is enqueued. Zero-byte ops are skipped.
//  * MemsetAsync: cudaMemsetAsync (device memory).
//  * HostFuncAsync: cudaLaunchHostFunc; fn lives on the heap until it has
//    run. If the context faults before the stream reaches it, CUDA never
//    calls it and fn (with whatever it captured) is leaked. An exception
//    escaping fn is logged and swallowed (it cannot cross the runtime).
//  * OpenIpc: cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess); the
//    allocation's size comes from the driver's cuMemGetAddressRange, resolved
//    through cudaGetDriverEntryPointByVersion (libcuda is not linked).
//    CloseIpc: cudaIpcCloseMemHandle.
//  * Storage: OpenStorage loads CuFileLibrary (Unavailable without the
//    library) and opens the driver with the matching CuFileInitPolicy.
//    Calling it again with the policy that succeeded returns the same
//    description; with another policy it is FailedPrecondition. A failed open
//    may be retried (parameters the auto policy set stay set). RegisterFile,
//    RegisterBuffer, RegisterStream and the async I/O calls before a
//    successful OpenStorage are FailedPrecondition; cuFile's refusals carry
//    its numeric code (CuFileErrorStatus). RegisterStream passes flags 0:
//    cuFile reads AsyncIo's size and offsets when the operation runs.
//
// Ownership and lifetime: Streams, Events and StorageFiles belong to the
// caller and REQUIRE destruction before the Platform; a Stream destroyed while
// still registered with cuFile is deregistered first. Destroying a stream or
// event with work pending is allowed (CUDA releases it when the work ends).
//
// Thread-safety: as Platform (every method thread-safe).
#pragma once

#include <functional>
#include <memory>

#include "gpu/platform.h"
#include "orbitkv/status.h"

namespace orbitkv::gpu {

// Makes a frame decoder on device `ordinal` (codec/cuda_frame_decoder.h's
// CreateCudaFrameDecoder: the codec library builds on this one, so it is
// passed in rather than linked).
using FrameDecoderFactory =
    std::function<Result<std::unique_ptr<FrameDecoder>>(int ordinal, uint32_t max_frames)>;

// Makes a frame encoder on device `ordinal` (codec/cuda_frame_encoder.h's
// CreateCudaFrameEncoder), passed in for the same reason.
using FrameEncoderFactory =
    std::function<Result<std::unique_ptr<FrameEncoder>>(int ordinal, uint32_t max_segments)>;

// The CUDA platform. Unavailable when the host has no usable CUDA device or
// driver (DeviceCount() == 0), or when the runtime fails to enumerate devices.
// Device::CreateFrameDecoder calls `decoders`, CreateFrameEncoder `encoders`
// (Unavailable without one).
Result<std::unique_ptr<Platform>> CreateCudaPlatform(FrameDecoderFactory decoders = {},
                                                     FrameEncoderFactory encoders = {});

// The cudaStream_t, as a pointer, of a stream a CUDA platform's device made;
// nullptr for any other Stream.
void* CudaStreamHandle(Stream& stream);

}  // namespace orbitkv::gpu
