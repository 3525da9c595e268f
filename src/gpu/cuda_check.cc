#include "gpu/cuda_check.h"

#include <string>

#include "orbitkv/logging.h"

namespace orbitkv::gpu {

bool IsStickyCudaError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorExternalDevice:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

cudaError_t CopyToDeviceAndWait(void* dst, const void* src, size_t bytes) {
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return err;
  err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  const cudaError_t destroyed = cudaStreamDestroy(stream);
  if (err == cudaSuccess) err = synced;
  return err == cudaSuccess ? destroyed : err;
}

std::string CudaErrorText(cudaError_t err) {
  const char* name = cudaGetErrorName(err);
  const char* text = cudaGetErrorString(err);
  std::string out = name != nullptr ? name : "cudaError";
  out += " (" + std::to_string(static_cast<int>(err)) + ")";
  if (text != nullptr) out += std::string(": ") + text;
  return out;
}

namespace {

StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotSupported:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return StatusCode::kUnavailable;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return StatusCode::kInvalidArgument;
    case cudaErrorHostMemoryAlreadyRegistered:
      return StatusCode::kAlreadyExists;
    case cudaErrorHostMemoryNotRegistered:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kInternal;
  }
}

Status MakeStatus(StatusCode code, std::string msg) {
  return Status::FromCode(code, std::move(msg));
}

const char* BaseName(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

}  // namespace

Status CudaCallStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return Status::OK();
  // Clear the last-error slot so the next check reports its own failure. A
  // sticky error stays: every later call in this process returns it.
  (void)cudaGetLastError();
  std::string msg = std::string(call) + " failed at " + BaseName(file) + ":" +
                    std::to_string(line) + ": " + CudaErrorText(err);
  if (IsStickyCudaError(err)) msg += " (sticky: the CUDA context is unusable until restart)";
  OKV_LOG_WARN("{}", msg);
  return MakeStatus(CodeFor(err), std::move(msg));
}

}  // namespace orbitkv::gpu
