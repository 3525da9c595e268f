// CuFileLibrary: NVIDIA's cuFile (GPUDirect Storage) user-space library,
// loaded at run time with dlopen (never linked), plus the driver-open policy
// the Manager's SSD backend selection depends on. A host without the library
// gets a clear Unavailable status, never a crash or a link error.
//
// Library: $ORBITKV_CUFILE_LIBRARY if set, else "libcufile.so.0" through the
// dynamic loader's search path. Every required symbol is resolved at Load();
// a missing one fails Load naming it. The parameter API, cuFileGetVersion and
// cuFileUseCount are optional symbols (older libraries lack them).
//
// Driver policy (spec "Automatic selection", "Enable and qualify"):
//  * kAutoNativeOnly (--ssd-backend auto): compatibility mode, which stages
//    through host memory inside cuFile, is disabled with the parameter API
//    before cuFileDriverOpen, so a successful open is evidence of the native
//    path. CUFILE_ALLOW_COMPAT_MODE / CUFILE_FORCE_COMPAT_MODE set in the
//    environment are honoured instead (and reported in CuFileDriverInfo). No
//    parameter API, or a driver some other code already opened in this
//    process, is Unavailable: the policy cannot be enforced.
//  * kExplicit (--ssd-backend cufile): cuFile's own configuration decides
//    (cufile.json and those environment variables); nothing is overridden.
//
// Thread-safe. cuFile errors become Status with the numeric cuFile code in the
// message ("cuFileDriverOpen: 5001 CU_FILE_DRIVER_NOT_INITIALIZED ...").
// Registrations must be released before the CuFileLibrary that made them.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "gpu/cufile_api.h"
#include "orbitkv/status.h"

namespace orbitkv::gpu {

// Environment variable naming the libcufile to load instead of libcufile.so.0.
inline constexpr const char* kCuFileLibraryEnv = "ORBITKV_CUFILE_LIBRARY";
inline constexpr const char* kCuFileDefaultLibrary = "libcufile.so.0";
// cuFile's own compatibility-mode switches (read by cuFile and by OpenDriver).
inline constexpr const char* kCuFileAllowCompatEnv = "CUFILE_ALLOW_COMPAT_MODE";
inline constexpr const char* kCuFileForceCompatEnv = "CUFILE_FORCE_COMPAT_MODE";

enum class CuFileInitPolicy {
  kAutoNativeOnly,  // auto backend selection: native GDS or nothing
  kExplicit,        // explicit cufile backend: cuFile's configuration as is
};

std::string_view CuFileInitPolicyName(CuFileInitPolicy policy);

// Every resolved libcufile entry point. Optional ones may be null.
struct CuFileApi {
  cufile::DriverOpenFn driver_open = nullptr;
  cufile::DriverCloseFn driver_close = nullptr;
  cufile::HandleRegisterFn handle_register = nullptr;
  cufile::HandleDeregisterFn handle_deregister = nullptr;
  cufile::BufRegisterFn buf_register = nullptr;
  cufile::BufDeregisterFn buf_deregister = nullptr;
  cufile::ReadFn read = nullptr;
  cufile::WriteFn write = nullptr;
  cufile::StreamRegisterFn stream_register = nullptr;
  cufile::StreamDeregisterFn stream_deregister = nullptr;
  cufile::ReadAsyncFn read_async = nullptr;
  cufile::WriteAsyncFn write_async = nullptr;
  // Optional.
  cufile::SetParameterBoolFn set_parameter_bool = nullptr;
  cufile::GetParameterBoolFn get_parameter_bool = nullptr;
  cufile::GetVersionFn get_version = nullptr;
  cufile::UseCountFn use_count = nullptr;
};

// What OpenDriver did, for the selection log line.
struct CuFileDriverInfo {
  CuFileInitPolicy policy = CuFileInitPolicy::kAutoNativeOnly;
  // Whether compatibility mode may be used / is forced, as far as OrbitKV set
  // or read it; unknown values (explicit policy without an environment
  // override or parameter read-back) are reported as allowed, not forced.
  bool compat_allowed = false;
  bool compat_forced = false;
  // True when the values above came from the environment, not the policy.
  bool compat_from_environment = false;
  // Native-only: compatibility disallowed and not forced. Even then, only
  // gdscheck / cuFile statistics prove I/O takes the native path.
  bool native_only() const { return !compat_allowed && !compat_forced; }
  std::string ToString() const;
};

// The Status for a cuFile control-call failure: "<call>: <code> <name> <hint>"
// followed by `detail` (the fd or buffer) when given.
// Capability failures (driver, platform, device, file registration, I/O
// disabled) are kUnavailable; bad arguments kInvalidArgument; double
// registration kAlreadyExists; missing registration kFailedPrecondition;
// out of memory kResourceExhausted; anything else kInternal. OK for success.
Status CuFileErrorStatus(std::string_view call, cufile::CUfileError_t error,
                         std::string_view detail = {});

// The symbolic name of a cuFile status code, or "CU_FILE_UNKNOWN_ERROR".
std::string_view CuFileOpErrorName(int code);

class CuFileLibrary;

// A file registered with cuFile (cuFileHandleRegister); deregistered by the
// destructor. Move-only. REQUIRES: destroyed before its CuFileLibrary, and
// before the fd is closed.
class FileRegistration {
 public:
  FileRegistration() = default;
  ~FileRegistration();
  FileRegistration(FileRegistration&& other) noexcept;
  FileRegistration& operator=(FileRegistration&& other) noexcept;
  FileRegistration(const FileRegistration&) = delete;
  FileRegistration& operator=(const FileRegistration&) = delete;

  cufile::CUfileHandle_t handle() const { return handle_; }
  int fd() const { return fd_; }
  explicit operator bool() const { return handle_ != nullptr; }
  // Deregisters now (idempotent).
  void Reset();

 private:
  friend class CuFileLibrary;
  FileRegistration(const CuFileLibrary* library, cufile::CUfileHandle_t handle, int fd)
      : library_(library), handle_(handle), fd_(fd) {}
  const CuFileLibrary* library_ = nullptr;
  cufile::CUfileHandle_t handle_ = nullptr;
  int fd_ = -1;
};

class CuFileLibrary {
 public:
  // Loads $ORBITKV_CUFILE_LIBRARY, else libcufile.so.0. Unavailable when the
  // library cannot be opened or lacks a required symbol (named).
  static Result<std::unique_ptr<CuFileLibrary>> Load();
  // Loads `path` (a file path, or a soname for the loader's search path).
  static Result<std::unique_ptr<CuFileLibrary>> LoadFrom(const std::string& path);

  // Closes the driver if this object opened it. The library stays mapped:
  // cuFile keeps internal threads, and unmapping their code is unsafe.
  ~CuFileLibrary();
  CuFileLibrary(const CuFileLibrary&) = delete;
  CuFileLibrary& operator=(const CuFileLibrary&) = delete;

  const std::string& path() const { return path_; }
  // cuFileGetVersion's value (1000 * major + 10 * minor), 0 if unknown.
  int version() const { return version_; }
  // "1.15" or "unknown".
  std::string VersionString() const;
  bool has_parameter_api() const { return api_.set_parameter_bool != nullptr; }
  // The raw entry points, for the I/O worker (async and stream calls).
  const CuFileApi& api() const { return api_; }

  // Applies `policy` (see the header comment) and calls cuFileDriverOpen.
  // FailedPrecondition if this object already opened it; Unavailable if the
  // native-only policy cannot be enforced or the driver does not open (the
  // message carries the cuFile code, e.g. 5001); InvalidArgument for an
  // unparsable CUFILE_*_COMPAT_MODE value.
  Result<CuFileDriverInfo> OpenDriver(CuFileInitPolicy policy);
  // cuFileDriverClose_v2, if this object opened the driver. REQUIRES: no
  // registrations or I/O outstanding.
  Status CloseDriver();
  bool driver_open() const;

  // Registers an open file (opened with O_DIRECT for the native path).
  // Unavailable for 5027-style refusals, e.g. an unsupported mount.
  Result<FileRegistration> RegisterFile(int fd) const;
  // cuFileBufRegister / cuFileBufDeregister of device memory used for I/O.
  Status RegisterBuffer(void* device_ptr, size_t size) const;
  Status DeregisterBuffer(void* device_ptr) const;

  // Synchronous cuFileRead / cuFileWrite of `size` bytes between the file and
  // device_base + buf_offset. Returns the bytes transferred (a short count is
  // returned, not an error: the caller decides). Failures are IOError naming
  // the fd, range and cuFile code (or errno).
  Result<size_t> Read(const FileRegistration& file, void* device_base, size_t size,
                      off_t file_offset, off_t buf_offset = 0) const;
  Result<size_t> Write(const FileRegistration& file, const void* device_base, size_t size,
                       off_t file_offset, off_t buf_offset = 0) const;

 private:
  friend class FileRegistration;
  CuFileLibrary(std::string path, void* handle, const CuFileApi& api, int version);
  // Sets `param` to `value` and reads it back when possible.
  Status SetBoolParameter(cufile::CUFileBoolConfigParameter_t param, const char* name, bool value);
  void Deregister(cufile::CUfileHandle_t handle) const;

  // Constant after construction.
  const std::string path_;
  void* const handle_;  // dlopen handle; never dlclose()d
  const CuFileApi api_;
  const int version_;

  mutable std::mutex mu_;
  bool driver_opened_ = false;  // guarded by mu_
};

// Parses a CUFILE_*_COMPAT_MODE style boolean: true/false, 1/0, yes/no, on/off
// (any case); InvalidArgument naming `name` otherwise.
Result<bool> ParseEnvBool(const char* name, const char* value);

}  // namespace orbitkv::gpu
