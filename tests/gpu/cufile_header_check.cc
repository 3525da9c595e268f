// Checks OrbitKV's cuFile declarations (gpu/cufile_api.h) against NVIDIA's
// cufile.h. Built only where cufile.h exists at configure time (the CUDA test
// host); the static_asserts are the test, so a mismatch fails the build there.
// Needs nothing but the CUDA headers, so it also compiles standalone:
//   g++ -std=c++20 -Isrc -I/usr/local/cuda/include tests/gpu/cufile_header_check.cc
// Our header is included first so that macros in cufile.h (cuFileDriverClose
// is one) cannot rewrite it.
#include "gpu/cufile_api.h"

#include <cufile.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

namespace {

namespace ours = orbitkv::gpu::cufile;

// ---- structs ------------------------------------------------------------------

static_assert(sizeof(ours::CUfileError_t) == sizeof(::CUfileError_t));
static_assert(alignof(ours::CUfileError_t) == alignof(::CUfileError_t));
static_assert(offsetof(ours::CUfileError_t, err) == offsetof(::CUfileError_t, err));
static_assert(offsetof(ours::CUfileError_t, cu_err) == offsetof(::CUfileError_t, cu_err));
static_assert(sizeof(ours::CUfileError_t::cu_err) == sizeof(::CUfileError_t::cu_err));

static_assert(sizeof(ours::CUfileDescr_t) == sizeof(::CUfileDescr_t));
static_assert(alignof(ours::CUfileDescr_t) == alignof(::CUfileDescr_t));
static_assert(offsetof(ours::CUfileDescr_t, type) == offsetof(::CUfileDescr_t, type));
static_assert(offsetof(ours::CUfileDescr_t, handle) == offsetof(::CUfileDescr_t, handle));
static_assert(offsetof(ours::CUfileDescr_t, fs_ops) == offsetof(::CUfileDescr_t, fs_ops));
static_assert(sizeof(ours::CUfileDescr_t::handle) == sizeof(::CUfileDescr_t::handle));
static_assert(sizeof(ours::CUfileDescr_t::type) == sizeof(::CUfileDescr_t::type));
static_assert(std::is_same_v<decltype(ours::CUfileDescr_t{}.handle.fd),
                             decltype(::CUfileDescr_t{}.handle.fd)>);

static_assert(std::is_same_v<ours::CUfileHandle_t, ::CUfileHandle_t>);

// ---- enums --------------------------------------------------------------------

static_assert(sizeof(ours::CUfileOpError) == sizeof(::CUfileOpError));
static_assert(sizeof(ours::CUfileFileHandleType) == sizeof(::CUfileFileHandleType));
static_assert(sizeof(ours::CUFileBoolConfigParameter_t) == sizeof(::CUFileBoolConfigParameter_t));

#define OKV_SAME_VALUE(name) \
  static_assert(static_cast<long>(ours::name) == static_cast<long>(::name), #name)

OKV_SAME_VALUE(CU_FILE_SUCCESS);
OKV_SAME_VALUE(CU_FILE_DRIVER_NOT_INITIALIZED);
OKV_SAME_VALUE(CU_FILE_DRIVER_INVALID_PROPS);
OKV_SAME_VALUE(CU_FILE_DRIVER_UNSUPPORTED_LIMIT);
OKV_SAME_VALUE(CU_FILE_DRIVER_VERSION_MISMATCH);
OKV_SAME_VALUE(CU_FILE_DRIVER_VERSION_READ_ERROR);
OKV_SAME_VALUE(CU_FILE_DRIVER_CLOSING);
OKV_SAME_VALUE(CU_FILE_PLATFORM_NOT_SUPPORTED);
OKV_SAME_VALUE(CU_FILE_IO_NOT_SUPPORTED);
OKV_SAME_VALUE(CU_FILE_DEVICE_NOT_SUPPORTED);
OKV_SAME_VALUE(CU_FILE_NVFS_DRIVER_ERROR);
OKV_SAME_VALUE(CU_FILE_CUDA_DRIVER_ERROR);
OKV_SAME_VALUE(CU_FILE_CUDA_POINTER_INVALID);
OKV_SAME_VALUE(CU_FILE_CUDA_MEMORY_TYPE_INVALID);
OKV_SAME_VALUE(CU_FILE_CUDA_POINTER_RANGE_ERROR);
OKV_SAME_VALUE(CU_FILE_CUDA_CONTEXT_MISMATCH);
OKV_SAME_VALUE(CU_FILE_INVALID_MAPPING_SIZE);
OKV_SAME_VALUE(CU_FILE_INVALID_MAPPING_RANGE);
OKV_SAME_VALUE(CU_FILE_INVALID_FILE_TYPE);
OKV_SAME_VALUE(CU_FILE_INVALID_FILE_OPEN_FLAG);
OKV_SAME_VALUE(CU_FILE_DIO_NOT_SET);
OKV_SAME_VALUE(CU_FILE_INVALID_VALUE);
OKV_SAME_VALUE(CU_FILE_MEMORY_ALREADY_REGISTERED);
OKV_SAME_VALUE(CU_FILE_MEMORY_NOT_REGISTERED);
OKV_SAME_VALUE(CU_FILE_PERMISSION_DENIED);
OKV_SAME_VALUE(CU_FILE_DRIVER_ALREADY_OPEN);
OKV_SAME_VALUE(CU_FILE_HANDLE_NOT_REGISTERED);
OKV_SAME_VALUE(CU_FILE_HANDLE_ALREADY_REGISTERED);
OKV_SAME_VALUE(CU_FILE_DEVICE_NOT_FOUND);
OKV_SAME_VALUE(CU_FILE_INTERNAL_ERROR);
OKV_SAME_VALUE(CU_FILE_GETNEWFD_FAILED);
OKV_SAME_VALUE(CU_FILE_NVFS_SETUP_ERROR);
OKV_SAME_VALUE(CU_FILE_IO_DISABLED);
OKV_SAME_VALUE(CU_FILE_BATCH_SUBMIT_FAILED);
OKV_SAME_VALUE(CU_FILE_GPU_MEMORY_PINNING_FAILED);
OKV_SAME_VALUE(CU_FILE_BATCH_FULL);
OKV_SAME_VALUE(CU_FILE_ASYNC_NOT_SUPPORTED);
OKV_SAME_VALUE(CU_FILE_NOMEM_ERROR);
OKV_SAME_VALUE(CU_FILE_IO_ERROR);
OKV_SAME_VALUE(CU_FILE_HANDLE_TYPE_OPAQUE_FD);
OKV_SAME_VALUE(CU_FILE_HANDLE_TYPE_OPAQUE_WIN32);
OKV_SAME_VALUE(CU_FILE_HANDLE_TYPE_USERSPACE_FS);
OKV_SAME_VALUE(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE);
OKV_SAME_VALUE(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE);
OKV_SAME_VALUE(CUFILE_PARAM_FORCE_COMPAT_MODE);
#undef OKV_SAME_VALUE

static_assert(ours::kStreamFixedBufOffset == CU_FILE_STREAM_FIXED_BUF_OFFSET);
static_assert(ours::kStreamFixedFileOffset == CU_FILE_STREAM_FIXED_FILE_OFFSET);
static_assert(ours::kStreamFixedFileSize == CU_FILE_STREAM_FIXED_FILE_SIZE);
static_assert(ours::kStreamPageAlignedInputs == CU_FILE_STREAM_PAGE_ALIGNED_INPUTS);

// ---- functions ----------------------------------------------------------------
// Same arity, and each parameter and the result agree in kind (pointer, enum,
// class, integer), size and signedness; pointees are compared the same way.
// Constness is not compared (it does not change the ABI).

template <typename A, typename B>
constexpr bool SameSlot() {
  using CA = std::remove_cv_t<A>;
  using CB = std::remove_cv_t<B>;
  if constexpr (std::is_same_v<CA, CB>) {
    return true;
  } else if constexpr (std::is_void_v<CA> || std::is_void_v<CB>) {
    return false;
  } else if constexpr (std::is_pointer_v<CA> && std::is_pointer_v<CB>) {
    return SameSlot<std::remove_pointer_t<CA>, std::remove_pointer_t<CB>>();
  } else if constexpr (std::is_pointer_v<CA> || std::is_pointer_v<CB>) {
    return false;
  } else if constexpr (std::is_enum_v<CA> && std::is_enum_v<CB>) {
    return sizeof(CA) == sizeof(CB);
  } else if constexpr (std::is_class_v<CA> && std::is_class_v<CB>) {
    return sizeof(CA) == sizeof(CB) && alignof(CA) == alignof(CB);
  } else if constexpr (std::is_arithmetic_v<CA> && std::is_arithmetic_v<CB>) {
    return sizeof(CA) == sizeof(CB) && std::is_signed_v<CA> == std::is_signed_v<CB> &&
           std::is_floating_point_v<CA> == std::is_floating_point_v<CB>;
  } else {
    return false;
  }
}

template <typename A, typename B>
struct SameShape : std::false_type {};

template <typename RA, typename... PA, typename RB, typename... PB>
struct SameShape<RA (*)(PA...), RB (*)(PB...)> {
  static constexpr bool Params() {
    if constexpr (sizeof...(PA) != sizeof...(PB)) {
      return false;
    } else {
      return (SameSlot<PA, PB>() && ... && true);
    }
  }
  static constexpr bool value = SameSlot<RA, RB>() && Params();
};

#define OKV_SAME_FUNCTION(ours_type, theirs) \
  static_assert(SameShape<ours::ours_type, decltype(&theirs)>::value, #theirs)

OKV_SAME_FUNCTION(DriverOpenFn, cuFileDriverOpen);
OKV_SAME_FUNCTION(DriverCloseFn, cuFileDriverClose);  // cufile.h maps it to _v2
OKV_SAME_FUNCTION(UseCountFn, cuFileUseCount);
OKV_SAME_FUNCTION(GetVersionFn, cuFileGetVersion);
OKV_SAME_FUNCTION(SetParameterBoolFn, cuFileSetParameterBool);
OKV_SAME_FUNCTION(GetParameterBoolFn, cuFileGetParameterBool);
OKV_SAME_FUNCTION(HandleRegisterFn, cuFileHandleRegister);
OKV_SAME_FUNCTION(HandleDeregisterFn, cuFileHandleDeregister);
OKV_SAME_FUNCTION(BufRegisterFn, cuFileBufRegister);
OKV_SAME_FUNCTION(BufDeregisterFn, cuFileBufDeregister);
OKV_SAME_FUNCTION(ReadFn, cuFileRead);
OKV_SAME_FUNCTION(WriteFn, cuFileWrite);
OKV_SAME_FUNCTION(StreamRegisterFn, cuFileStreamRegister);
OKV_SAME_FUNCTION(StreamDeregisterFn, cuFileStreamDeregister);
OKV_SAME_FUNCTION(ReadAsyncFn, cuFileReadAsync);
OKV_SAME_FUNCTION(WriteAsyncFn, cuFileWriteAsync);
#undef OKV_SAME_FUNCTION

// Self-checks of the checker: constness is ignored, wrong shapes are caught.
static_assert(SameShape<ours::ReadFn, ours::WriteFn>::value);
static_assert(!SameShape<ours::ReadFn, ours::BufDeregisterFn>::value);
static_assert(!SameShape<ours::ReadAsyncFn, ours::ReadFn>::value);
static_assert(!SameShape<size_t (*)(int), ssize_t (*)(int)>::value);

}  // namespace

int main() {
  // The assertions above ran at compile time.
  std::printf("cufile_header_check: OrbitKV's cuFile declarations match cufile.h\n");
  return 0;
}
