// OrbitKV's own declarations of the part of NVIDIA's cuFile (GPUDirect
// Storage) C API that the GPU tier uses, written from the public cuFile API
// reference; NVIDIA's cufile.h is not a build dependency (CI and development
// machines lack it). libcufile.so.0 is only ever dlopen()ed (cufile_loader.h),
// so this header declares types, constants and function-pointer types, not
// functions. tests/gpu/cufile_header_check_test.cc compiles against the real
// cufile.h where it exists and static_asserts that sizes, offsets, enum values
// and function shapes agree with these.
// Names follow the C API so they can be matched against its documentation.
#pragma once

#include <cuda.h>  // CUresult, CUstream
#include <sys/types.h>

#include <cstddef>

namespace orbitkv::gpu::cufile {

// cuFile status codes (CUfileOpError). Only the values OrbitKV inspects or
// names in messages; any other value is reported by number.
enum CUfileOpError {
  CU_FILE_SUCCESS = 0,
  CU_FILE_DRIVER_NOT_INITIALIZED = 5001,  // nvidia-fs not loaded (native path unavailable)
  CU_FILE_DRIVER_INVALID_PROPS = 5002,
  CU_FILE_DRIVER_UNSUPPORTED_LIMIT = 5003,
  CU_FILE_DRIVER_VERSION_MISMATCH = 5004,
  CU_FILE_DRIVER_VERSION_READ_ERROR = 5005,
  CU_FILE_DRIVER_CLOSING = 5006,
  CU_FILE_PLATFORM_NOT_SUPPORTED = 5007,
  CU_FILE_IO_NOT_SUPPORTED = 5008,
  CU_FILE_DEVICE_NOT_SUPPORTED = 5009,
  CU_FILE_NVFS_DRIVER_ERROR = 5010,
  CU_FILE_CUDA_DRIVER_ERROR = 5011,  // see CUfileError_t::cu_err
  CU_FILE_CUDA_POINTER_INVALID = 5012,
  CU_FILE_CUDA_MEMORY_TYPE_INVALID = 5013,
  CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014,
  CU_FILE_CUDA_CONTEXT_MISMATCH = 5015,
  CU_FILE_INVALID_MAPPING_SIZE = 5016,
  CU_FILE_INVALID_MAPPING_RANGE = 5017,
  CU_FILE_INVALID_FILE_TYPE = 5018,
  CU_FILE_INVALID_FILE_OPEN_FLAG = 5019,
  CU_FILE_DIO_NOT_SET = 5020,
  CU_FILE_INVALID_VALUE = 5022,
  CU_FILE_MEMORY_ALREADY_REGISTERED = 5023,
  CU_FILE_MEMORY_NOT_REGISTERED = 5024,
  CU_FILE_PERMISSION_DENIED = 5025,
  CU_FILE_DRIVER_ALREADY_OPEN = 5026,
  CU_FILE_HANDLE_NOT_REGISTERED = 5027,  // file registration refused (e.g. unsupported mount)
  CU_FILE_HANDLE_ALREADY_REGISTERED = 5028,
  CU_FILE_DEVICE_NOT_FOUND = 5029,
  CU_FILE_INTERNAL_ERROR = 5030,
  CU_FILE_GETNEWFD_FAILED = 5031,
  CU_FILE_NVFS_SETUP_ERROR = 5033,
  CU_FILE_IO_DISABLED = 5034,
  CU_FILE_BATCH_SUBMIT_FAILED = 5035,
  CU_FILE_GPU_MEMORY_PINNING_FAILED = 5036,
  CU_FILE_BATCH_FULL = 5037,
  CU_FILE_ASYNC_NOT_SUPPORTED = 5038,
  CU_FILE_NOMEM_ERROR = 5043,
  CU_FILE_IO_ERROR = 5044,
};

// Every cuFile control call returns this pair: the cuFile status and, when
// err == CU_FILE_CUDA_DRIVER_ERROR, the CUDA driver's result.
struct CUfileError_t {
  CUfileOpError err;
  CUresult cu_err;
};

// How CUfileDescr_t::handle identifies the file.
enum CUfileFileHandleType {
  CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1,  // a Linux file descriptor
  CU_FILE_HANDLE_TYPE_OPAQUE_WIN32 = 2,
  CU_FILE_HANDLE_TYPE_USERSPACE_FS = 3,
};

// A user-space file system's operation table; OrbitKV never supplies one.
struct CUfileFSOps_t;

// The file to register: type, then the OS handle, then an optional operation
// table (nullptr for kernel file systems).
struct CUfileDescr_t {
  CUfileFileHandleType type;
  union {
    int fd;
    void* handle;
  } handle;
  const CUfileFSOps_t* fs_ops;
};

// An opaque registered-file handle.
using CUfileHandle_t = void*;

// Boolean configuration parameters (cuFile 1.14+ parameter API). They must be
// set before the driver is opened.
enum CUFileBoolConfigParameter_t {
  CUFILE_PARAM_PROPERTIES_USE_POLL_MODE = 0,
  CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE = 1,  // may fall back to POSIX host staging
  CUFILE_PARAM_FORCE_COMPAT_MODE = 2,             // always use POSIX host staging
};

// cuFileStreamRegister flags: promises about the async calls' parameters.
inline constexpr unsigned kStreamFixedBufOffset = 1;     // CU_FILE_STREAM_FIXED_BUF_OFFSET
inline constexpr unsigned kStreamFixedFileOffset = 2;    // CU_FILE_STREAM_FIXED_FILE_OFFSET
inline constexpr unsigned kStreamFixedFileSize = 4;      // CU_FILE_STREAM_FIXED_FILE_SIZE
inline constexpr unsigned kStreamPageAlignedInputs = 8;  // CU_FILE_STREAM_PAGE_ALIGNED_INPUTS

// Function types, one per libcufile symbol. The comment names the exported
// symbol the loader resolves.
// cuFileDriverOpen
using DriverOpenFn = CUfileError_t (*)();
// cuFileDriverClose_v2 (cufile.h maps the unversioned name onto it)
using DriverCloseFn = CUfileError_t (*)();
// cuFileUseCount: how many users hold the driver open.
using UseCountFn = long (*)();
// cuFileGetVersion: 1000 * major + 10 * minor.
using GetVersionFn = CUfileError_t (*)(int* version);
// cuFileSetParameterBool / cuFileGetParameterBool
using SetParameterBoolFn = CUfileError_t (*)(CUFileBoolConfigParameter_t param, bool value);
using GetParameterBoolFn = CUfileError_t (*)(CUFileBoolConfigParameter_t param, bool* value);
// cuFileHandleRegister / cuFileHandleDeregister
using HandleRegisterFn = CUfileError_t (*)(CUfileHandle_t* fh, CUfileDescr_t* descr);
using HandleDeregisterFn = void (*)(CUfileHandle_t fh);
// cuFileBufRegister / cuFileBufDeregister: device memory used for I/O.
using BufRegisterFn = CUfileError_t (*)(const void* base, size_t length, int flags);
using BufDeregisterFn = CUfileError_t (*)(const void* base);
// cuFileRead / cuFileWrite: synchronous; bytes transferred, -1 with errno, or
// the negated CUfileOpError.
using ReadFn = ssize_t (*)(CUfileHandle_t fh, void* base, size_t size, off_t file_offset,
                           off_t buf_offset);
using WriteFn = ssize_t (*)(CUfileHandle_t fh, const void* base, size_t size, off_t file_offset,
                            off_t buf_offset);
// cuFileStreamRegister / cuFileStreamDeregister
using StreamRegisterFn = CUfileError_t (*)(CUstream stream, unsigned flags);
using StreamDeregisterFn = CUfileError_t (*)(CUstream stream);
// cuFileReadAsync / cuFileWriteAsync: enqueued on `stream`; the pointed-to
// parameters are read when the stream reaches the operation and *bytes_* is
// written at completion, so all must stay valid until then.
using ReadAsyncFn = CUfileError_t (*)(CUfileHandle_t fh, void* base, size_t* size,
                                      off_t* file_offset, off_t* buf_offset, ssize_t* bytes_read,
                                      CUstream stream);
using WriteAsyncFn = CUfileError_t (*)(CUfileHandle_t fh, void* base, size_t* size,
                                       off_t* file_offset, off_t* buf_offset,
                                       ssize_t* bytes_written, CUstream stream);

}  // namespace orbitkv::gpu::cufile
