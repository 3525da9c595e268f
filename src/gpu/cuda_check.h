// CUDA runtime and syscall checks that return Status instead of aborting.
// ORBITKV_CUDA_STATUS(call) evaluates `call` (a cudaError_t expression) to a
// Status; on failure it names the call and file:line in the message, logs a
// warning, and clears the runtime's last-error slot (cudaGetLastError) so a
// later, unrelated check does not report it again. Errors that poison the CUDA
// context (an illegal address in a kernel, ...) cannot be cleared: their
// Status says so. ORBITKV_SYSCALL_RETRY retries EINTR. Thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cerrno>
#include <string>

#include "orbitkv/status.h"

namespace orbitkv::gpu {

// The Status for `err` returned by `call` at file:line; OK for cudaSuccess.
// On failure: logs a warning and calls cudaGetLastError() to clear the error.
// Codes: allocation failures are kResourceExhausted; no device / no driver /
// unsupported are kUnavailable; bad arguments are kInvalidArgument; stream
// capture conflicts are kFailedPrecondition; anything else is kInternal.
Status CudaCallStatus(cudaError_t err, const char* call, const char* file, int line);

// True when `err` leaves the CUDA context unusable for the rest of the process
// (a kernel fault); cudaGetLastError does not clear these.
bool IsStickyCudaError(cudaError_t err);

// "cudaErrorMemoryAllocation (2): out of memory".
std::string CudaErrorText(cudaError_t err);

// Copies `bytes` of host memory (pageable or pinned) to device memory `dst`
// and returns once they are there. cudaMemcpy from pageable memory may return
// as soon as the bytes are staged, before its DMA reaches the device, and
// kernels on non-blocking streams are not ordered after it: a table uploaded
// that way and read at once by such a kernel can be read before it arrives
// (a gathered publish restored wrong bytes on an H200 beside a busy GPU,
// session 19). A stream of its own, synchronised. REQUIRES: the current
// device is dst's.
cudaError_t CopyToDeviceAndWait(void* dst, const void* src, size_t bytes);

}  // namespace orbitkv::gpu

// A Status for the CUDA runtime call `call` (any expression yielding cudaError_t).
#define ORBITKV_CUDA_STATUS(call) \
  ::orbitkv::gpu::CudaCallStatus(static_cast<cudaError_t>(call), #call, __FILE__, __LINE__)

// Returns a non-OK Status from the enclosing function when `call` fails.
#define ORBITKV_CUDA_RETURN_IF_ERROR(call)                      \
  do {                                                          \
    ::orbitkv::Status _okv_cuda_st = ORBITKV_CUDA_STATUS(call); \
    if (!_okv_cuda_st.ok()) return _okv_cuda_st;                \
  } while (0)

// Evaluates a syscall expression, retrying while it fails with EINTR; yields
// its final result (errno is left as the call set it).
#define ORBITKV_SYSCALL_RETRY(expr)           \
  ([&]() {                                    \
    auto _okv_rc = (expr);                    \
    while (_okv_rc == -1 && errno == EINTR) { \
      _okv_rc = (expr);                       \
    }                                         \
    return _okv_rc;                           \
  }())

// A Status for a syscall expression returning -1 with errno on failure (retried
// on EINTR): Status::IOError(what, errno), where `what` names the file and range.
#define ORBITKV_SYSCALL_STATUS(what, expr)                                       \
  (ORBITKV_SYSCALL_RETRY(expr) == -1 ? ::orbitkv::Status::IOError((what), errno) \
                                     : ::orbitkv::Status::OK())
