#include "gpu/cufile_loader.h"

#include <dlfcn.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "orbitkv/logging.h"

namespace orbitkv::gpu {

namespace cf = cufile;

namespace {

struct OpErrorInfo {
  int code;
  std::string_view name;
  StatusCode status;
  std::string_view hint;  // our words, for operators reading the log
};

constexpr OpErrorInfo kOpErrors[] = {
    {cf::CU_FILE_SUCCESS, "CU_FILE_SUCCESS", StatusCode::kOk, ""},
    {cf::CU_FILE_DRIVER_NOT_INITIALIZED, "CU_FILE_DRIVER_NOT_INITIALIZED", StatusCode::kUnavailable,
     "the nvidia-fs kernel driver is not loaded; native GDS is unavailable"},
    {cf::CU_FILE_DRIVER_INVALID_PROPS, "CU_FILE_DRIVER_INVALID_PROPS", StatusCode::kUnavailable,
     "invalid cuFile configuration (cufile.json)"},
    {cf::CU_FILE_DRIVER_UNSUPPORTED_LIMIT, "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
     StatusCode::kInvalidArgument, "a configured limit is out of range"},
    {cf::CU_FILE_DRIVER_VERSION_MISMATCH, "CU_FILE_DRIVER_VERSION_MISMATCH",
     StatusCode::kUnavailable, "nvidia-fs and libcufile versions do not match"},
    {cf::CU_FILE_DRIVER_VERSION_READ_ERROR, "CU_FILE_DRIVER_VERSION_READ_ERROR",
     StatusCode::kUnavailable, "cannot read the nvidia-fs version"},
    {cf::CU_FILE_DRIVER_CLOSING, "CU_FILE_DRIVER_CLOSING", StatusCode::kUnavailable,
     "the driver is shutting down"},
    {cf::CU_FILE_PLATFORM_NOT_SUPPORTED, "CU_FILE_PLATFORM_NOT_SUPPORTED", StatusCode::kUnavailable,
     "this platform does not support GDS"},
    {cf::CU_FILE_IO_NOT_SUPPORTED, "CU_FILE_IO_NOT_SUPPORTED", StatusCode::kUnavailable,
     "the file system does not support GDS I/O"},
    {cf::CU_FILE_DEVICE_NOT_SUPPORTED, "CU_FILE_DEVICE_NOT_SUPPORTED", StatusCode::kUnavailable,
     "this GPU does not support GDS"},
    {cf::CU_FILE_NVFS_DRIVER_ERROR, "CU_FILE_NVFS_DRIVER_ERROR", StatusCode::kUnavailable,
     "the nvidia-fs driver reported an error"},
    {cf::CU_FILE_CUDA_DRIVER_ERROR, "CU_FILE_CUDA_DRIVER_ERROR", StatusCode::kInternal,
     "a CUDA driver call failed"},
    {cf::CU_FILE_CUDA_POINTER_INVALID, "CU_FILE_CUDA_POINTER_INVALID", StatusCode::kInvalidArgument,
     "not a device pointer"},
    {cf::CU_FILE_CUDA_MEMORY_TYPE_INVALID, "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
     StatusCode::kInvalidArgument, "unsupported memory type"},
    {cf::CU_FILE_CUDA_POINTER_RANGE_ERROR, "CU_FILE_CUDA_POINTER_RANGE_ERROR",
     StatusCode::kInvalidArgument, "range exceeds the allocation"},
    {cf::CU_FILE_CUDA_CONTEXT_MISMATCH, "CU_FILE_CUDA_CONTEXT_MISMATCH",
     StatusCode::kInvalidArgument, "memory belongs to another CUDA context"},
    {cf::CU_FILE_INVALID_MAPPING_SIZE, "CU_FILE_INVALID_MAPPING_SIZE", StatusCode::kInvalidArgument,
     "registration size not supported"},
    {cf::CU_FILE_INVALID_MAPPING_RANGE, "CU_FILE_INVALID_MAPPING_RANGE",
     StatusCode::kInvalidArgument, "I/O range outside the registered buffer"},
    {cf::CU_FILE_INVALID_FILE_TYPE, "CU_FILE_INVALID_FILE_TYPE", StatusCode::kInvalidArgument,
     "unsupported file type"},
    {cf::CU_FILE_INVALID_FILE_OPEN_FLAG, "CU_FILE_INVALID_FILE_OPEN_FLAG",
     StatusCode::kInvalidArgument, "unsupported open flags"},
    {cf::CU_FILE_DIO_NOT_SET, "CU_FILE_DIO_NOT_SET", StatusCode::kInvalidArgument,
     "the file was not opened with O_DIRECT"},
    {cf::CU_FILE_INVALID_VALUE, "CU_FILE_INVALID_VALUE", StatusCode::kInvalidArgument,
     "invalid argument"},
    {cf::CU_FILE_MEMORY_ALREADY_REGISTERED, "CU_FILE_MEMORY_ALREADY_REGISTERED",
     StatusCode::kAlreadyExists, "buffer already registered"},
    {cf::CU_FILE_MEMORY_NOT_REGISTERED, "CU_FILE_MEMORY_NOT_REGISTERED",
     StatusCode::kFailedPrecondition, "buffer not registered"},
    {cf::CU_FILE_PERMISSION_DENIED, "CU_FILE_PERMISSION_DENIED", StatusCode::kPermissionDenied,
     "permission denied"},
    {cf::CU_FILE_DRIVER_ALREADY_OPEN, "CU_FILE_DRIVER_ALREADY_OPEN",
     StatusCode::kFailedPrecondition, "the driver is already open"},
    {cf::CU_FILE_HANDLE_NOT_REGISTERED, "CU_FILE_HANDLE_NOT_REGISTERED", StatusCode::kUnavailable,
     "cuFile refused to register the file; its mount may be unsupported (in containers see "
     "enable-cufile-compat.sh)"},
    {cf::CU_FILE_HANDLE_ALREADY_REGISTERED, "CU_FILE_HANDLE_ALREADY_REGISTERED",
     StatusCode::kAlreadyExists, "file already registered"},
    {cf::CU_FILE_DEVICE_NOT_FOUND, "CU_FILE_DEVICE_NOT_FOUND", StatusCode::kUnavailable,
     "GPU not found"},
    {cf::CU_FILE_INTERNAL_ERROR, "CU_FILE_INTERNAL_ERROR", StatusCode::kInternal,
     "internal cuFile error"},
    {cf::CU_FILE_GETNEWFD_FAILED, "CU_FILE_GETNEWFD_FAILED", StatusCode::kInternal,
     "cuFile could not open a new fd"},
    {cf::CU_FILE_NVFS_SETUP_ERROR, "CU_FILE_NVFS_SETUP_ERROR", StatusCode::kUnavailable,
     "nvidia-fs setup failed"},
    {cf::CU_FILE_IO_DISABLED, "CU_FILE_IO_DISABLED", StatusCode::kUnavailable,
     "GDS I/O is disabled by configuration (compatibility mode off and no native path?)"},
    {cf::CU_FILE_BATCH_SUBMIT_FAILED, "CU_FILE_BATCH_SUBMIT_FAILED", StatusCode::kInternal,
     "batch submission failed"},
    {cf::CU_FILE_GPU_MEMORY_PINNING_FAILED, "CU_FILE_GPU_MEMORY_PINNING_FAILED",
     StatusCode::kResourceExhausted, "pinning GPU memory failed (BAR space?)"},
    {cf::CU_FILE_BATCH_FULL, "CU_FILE_BATCH_FULL", StatusCode::kBusy, "batch queue full"},
    {cf::CU_FILE_ASYNC_NOT_SUPPORTED, "CU_FILE_ASYNC_NOT_SUPPORTED", StatusCode::kUnavailable,
     "stream (async) I/O not supported"},
    {cf::CU_FILE_NOMEM_ERROR, "CU_FILE_NOMEM_ERROR", StatusCode::kResourceExhausted,
     "out of memory"},
    {cf::CU_FILE_IO_ERROR, "CU_FILE_IO_ERROR", StatusCode::kIOError, "I/O error"},
};

const OpErrorInfo* FindOpError(int code) {
  for (const OpErrorInfo& e : kOpErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

Status MakeStatus(StatusCode code, std::string msg) {
  return Status::FromCode(code, std::move(msg));
}

std::string RangeText(int fd, off_t offset, size_t size) {
  return "fd " + std::to_string(fd) + " [" + std::to_string(offset) + ", +" + std::to_string(size) +
         ")";
}

std::string PtrText(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", ptr);
  return buf;
}

template <typename Fn>
Fn Resolve(void* handle, const char* name) {
  // POSIX guarantees a dlsym result converts to a function pointer.
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

// Reads an optional boolean from the environment: nullopt when unset or empty.
Result<std::optional<bool>> EnvBool(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::optional<bool>();
  ORBITKV_ASSIGN_OR_RETURN(bool parsed, ParseEnvBool(name, value));
  return std::optional<bool>(parsed);
}

}  // namespace

std::string_view CuFileInitPolicyName(CuFileInitPolicy policy) {
  switch (policy) {
    case CuFileInitPolicy::kAutoNativeOnly:
      return "auto";
    case CuFileInitPolicy::kExplicit:
      return "explicit cufile";
  }
  return "unknown";
}

std::string CuFileDriverInfo::ToString() const {
  std::string out = "policy " + std::string(CuFileInitPolicyName(policy));
  out += ", compatibility mode ";
  out += compat_forced ? "forced" : (compat_allowed ? "allowed" : "disallowed (native only)");
  if (compat_from_environment) out += " by CUFILE_*_COMPAT_MODE";
  if (!native_only()) out += "; cuFile I/O may be host-staged, not native GDS";
  return out;
}

std::string_view CuFileOpErrorName(int code) {
  const OpErrorInfo* e = FindOpError(code);
  return e != nullptr ? e->name : std::string_view("CU_FILE_UNKNOWN_ERROR");
}

Status CuFileErrorStatus(std::string_view call, cf::CUfileError_t error, std::string_view detail) {
  if (error.err == cf::CU_FILE_SUCCESS) return Status::OK();
  const int code = static_cast<int>(error.err);
  const OpErrorInfo* e = FindOpError(code);
  std::string msg = std::string(call) + ": " + std::to_string(code) + " " +
                    std::string(e != nullptr ? e->name : "CU_FILE_UNKNOWN_ERROR");
  if (error.err == cf::CU_FILE_CUDA_DRIVER_ERROR) {
    msg += " (CUresult " + std::to_string(static_cast<int>(error.cu_err)) + ")";
  }
  if (e != nullptr && !e->hint.empty()) msg += ": " + std::string(e->hint);
  if (!detail.empty()) msg += " [" + std::string(detail) + "]";
  return MakeStatus(e != nullptr ? e->status : StatusCode::kInternal, std::move(msg));
}

Result<bool> ParseEnvBool(const char* name, const char* value) {
  std::string v(value != nullptr ? value : "");
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return Status::InvalidArgument(std::string(name) + "='" + (value != nullptr ? value : "") +
                                 "' is not a boolean (true/false)");
}

// ---- FileRegistration ------------------------------------------------------

FileRegistration::~FileRegistration() { Reset(); }

FileRegistration::FileRegistration(FileRegistration&& other) noexcept
    : library_(std::exchange(other.library_, nullptr)),
      handle_(std::exchange(other.handle_, nullptr)),
      fd_(std::exchange(other.fd_, -1)) {}

FileRegistration& FileRegistration::operator=(FileRegistration&& other) noexcept {
  if (this != &other) {
    Reset();
    library_ = std::exchange(other.library_, nullptr);
    handle_ = std::exchange(other.handle_, nullptr);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void FileRegistration::Reset() {
  if (handle_ != nullptr && library_ != nullptr) library_->Deregister(handle_);
  handle_ = nullptr;
  library_ = nullptr;
  fd_ = -1;
}

// ---- CuFileLibrary ---------------------------------------------------------

Result<std::unique_ptr<CuFileLibrary>> CuFileLibrary::Load() {
  const char* override_path = std::getenv(kCuFileLibraryEnv);
  if (override_path != nullptr && *override_path != '\0') return LoadFrom(override_path);
  return LoadFrom(kCuFileDefaultLibrary);
}

Result<std::unique_ptr<CuFileLibrary>> CuFileLibrary::LoadFrom(const std::string& path) {
  dlerror();  // clear
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Status::Unavailable(
        "cuFile library '" + path +
        "' cannot be loaded: " + (why != nullptr ? why : "unknown dlopen error") +
        " (install NVIDIA's GDS user-space library, or set " + kCuFileLibraryEnv + ")");
  }
  // The library stays mapped even when a symbol is missing: it may already
  // have started threads from its initializers.
  CuFileApi api;
  struct Required {
    const char* name;
    void* resolved;
  };
  api.driver_open = Resolve<cf::DriverOpenFn>(handle, "cuFileDriverOpen");
  api.driver_close = Resolve<cf::DriverCloseFn>(handle, "cuFileDriverClose_v2");
  if (api.driver_close == nullptr) {
    api.driver_close = Resolve<cf::DriverCloseFn>(handle, "cuFileDriverClose");
  }
  api.handle_register = Resolve<cf::HandleRegisterFn>(handle, "cuFileHandleRegister");
  api.handle_deregister = Resolve<cf::HandleDeregisterFn>(handle, "cuFileHandleDeregister");
  api.buf_register = Resolve<cf::BufRegisterFn>(handle, "cuFileBufRegister");
  api.buf_deregister = Resolve<cf::BufDeregisterFn>(handle, "cuFileBufDeregister");
  api.read = Resolve<cf::ReadFn>(handle, "cuFileRead");
  api.write = Resolve<cf::WriteFn>(handle, "cuFileWrite");
  api.stream_register = Resolve<cf::StreamRegisterFn>(handle, "cuFileStreamRegister");
  api.stream_deregister = Resolve<cf::StreamDeregisterFn>(handle, "cuFileStreamDeregister");
  api.read_async = Resolve<cf::ReadAsyncFn>(handle, "cuFileReadAsync");
  api.write_async = Resolve<cf::WriteAsyncFn>(handle, "cuFileWriteAsync");
  api.set_parameter_bool = Resolve<cf::SetParameterBoolFn>(handle, "cuFileSetParameterBool");
  api.get_parameter_bool = Resolve<cf::GetParameterBoolFn>(handle, "cuFileGetParameterBool");
  api.get_version = Resolve<cf::GetVersionFn>(handle, "cuFileGetVersion");
  api.use_count = Resolve<cf::UseCountFn>(handle, "cuFileUseCount");

  const Required required[] = {
      {"cuFileDriverOpen", reinterpret_cast<void*>(api.driver_open)},
      {"cuFileDriverClose_v2", reinterpret_cast<void*>(api.driver_close)},
      {"cuFileHandleRegister", reinterpret_cast<void*>(api.handle_register)},
      {"cuFileHandleDeregister", reinterpret_cast<void*>(api.handle_deregister)},
      {"cuFileBufRegister", reinterpret_cast<void*>(api.buf_register)},
      {"cuFileBufDeregister", reinterpret_cast<void*>(api.buf_deregister)},
      {"cuFileRead", reinterpret_cast<void*>(api.read)},
      {"cuFileWrite", reinterpret_cast<void*>(api.write)},
      {"cuFileStreamRegister", reinterpret_cast<void*>(api.stream_register)},
      {"cuFileStreamDeregister", reinterpret_cast<void*>(api.stream_deregister)},
      {"cuFileReadAsync", reinterpret_cast<void*>(api.read_async)},
      {"cuFileWriteAsync", reinterpret_cast<void*>(api.write_async)},
  };
  for (const Required& r : required) {
    if (r.resolved == nullptr) {
      return Status::Unavailable("cuFile library '" + path + "' lacks required symbol " + r.name +
                                 " (too old, or not libcufile)");
    }
  }

  int version = 0;
  if (api.get_version != nullptr) {
    int v = 0;
    if (api.get_version(&v).err == cf::CU_FILE_SUCCESS && v > 0) version = v;
  }
  auto library = std::unique_ptr<CuFileLibrary>(new CuFileLibrary(path, handle, api, version));
  OKV_LOG_DEBUG("loaded cuFile {} from {} (parameter API: {})", library->VersionString(), path,
                library->has_parameter_api() ? "yes" : "no");
  return library;
}

CuFileLibrary::CuFileLibrary(std::string path, void* handle, const CuFileApi& api, int version)
    : path_(std::move(path)), handle_(handle), api_(api), version_(version) {}

CuFileLibrary::~CuFileLibrary() {
  Status st = CloseDriver();
  if (!st.ok()) OKV_LOG_WARN("closing the cuFile driver: {}", st.ToString());
}

std::string CuFileLibrary::VersionString() const {
  if (version_ <= 0) return "unknown";
  return std::to_string(version_ / 1000) + "." + std::to_string((version_ % 1000) / 10);
}

bool CuFileLibrary::driver_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return driver_opened_;
}

Status CuFileLibrary::SetBoolParameter(cf::CUFileBoolConfigParameter_t param, const char* name,
                                       bool value) {
  const std::string call =
      std::string("cuFileSetParameterBool(") + name + ", " + (value ? "true" : "false") + ")";
  ORBITKV_RETURN_IF_ERROR(CuFileErrorStatus(call, api_.set_parameter_bool(param, value)));
  if (api_.get_parameter_bool == nullptr) return Status::OK();
  bool read_back = !value;
  Status st =
      CuFileErrorStatus("cuFileGetParameterBool", api_.get_parameter_bool(param, &read_back));
  if (!st.ok()) {
    OKV_LOG_DEBUG("{}: {}", name, st.ToString());
    return Status::OK();  // setting succeeded; read-back is best effort
  }
  if (read_back != value) {
    return Status::FailedPrecondition(call + " succeeded but the parameter reads back as " +
                                      (read_back ? "true" : "false"));
  }
  return Status::OK();
}

Result<CuFileDriverInfo> CuFileLibrary::OpenDriver(CuFileInitPolicy policy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (driver_opened_) return Status::FailedPrecondition("the cuFile driver is already open");

  ORBITKV_ASSIGN_OR_RETURN(std::optional<bool> allow_env, EnvBool(kCuFileAllowCompatEnv));
  ORBITKV_ASSIGN_OR_RETURN(std::optional<bool> force_env, EnvBool(kCuFileForceCompatEnv));

  CuFileDriverInfo info;
  info.policy = policy;
  info.compat_from_environment = allow_env.has_value() || force_env.has_value();

  if (policy == CuFileInitPolicy::kAutoNativeOnly) {
    if (!has_parameter_api()) {
      return Status::Unavailable("cuFile " + VersionString() + " at '" + path_ +
                                 "' has no parameter API (cuFileSetParameterBool): cannot enforce "
                                 "the native-only policy of automatic selection");
    }
    if (api_.use_count != nullptr) {
      const long users = api_.use_count();
      if (users > 0) {
        return Status::Unavailable(
            "the cuFile driver is already open in this process (use count " +
            std::to_string(users) +
            "): an initialized, possibly compatibility-mode driver is not native evidence");
      }
    }
    info.compat_allowed = allow_env.value_or(false);
    info.compat_forced = force_env.value_or(false);
    for (const auto& [param, name, value] :
         {std::tuple{cf::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, "allow_compat_mode",
                     info.compat_allowed},
          std::tuple{cf::CUFILE_PARAM_FORCE_COMPAT_MODE, "force_compat_mode",
                     info.compat_forced}}) {
      Status st = SetBoolParameter(param, name, value);
      if (!st.ok()) {
        return Status::Unavailable("cannot enforce the native-only policy: " +
                                   std::string(st.message()));
      }
    }
  } else {
    // cuFile reads these variables itself; setting them through the API as
    // well makes the outcome independent of which source it consults last.
    if (allow_env.has_value() && has_parameter_api()) {
      ORBITKV_RETURN_IF_ERROR(SetBoolParameter(cf::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE,
                                               "allow_compat_mode", *allow_env));
    }
    if (force_env.has_value() && has_parameter_api()) {
      ORBITKV_RETURN_IF_ERROR(
          SetBoolParameter(cf::CUFILE_PARAM_FORCE_COMPAT_MODE, "force_compat_mode", *force_env));
    }
    auto current = [&](cf::CUFileBoolConfigParameter_t param, std::optional<bool> env,
                       bool unknown) {
      if (env.has_value()) return *env;
      bool v = unknown;
      if (api_.get_parameter_bool != nullptr &&
          api_.get_parameter_bool(param, &v).err == cf::CU_FILE_SUCCESS) {
        return v;
      }
      return unknown;
    };
    // Unknown is reported as "allowed, not forced": cuFile's default.
    info.compat_allowed = current(cf::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, allow_env, true);
    info.compat_forced = current(cf::CUFILE_PARAM_FORCE_COMPAT_MODE, force_env, false);
  }

  ORBITKV_RETURN_IF_ERROR(CuFileErrorStatus("cuFileDriverOpen", api_.driver_open()));
  driver_opened_ = true;
  OKV_LOG_INFO("cuFile {} driver open from {}: {}", VersionString(), path_, info.ToString());
  return info;
}

Status CuFileLibrary::CloseDriver() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!driver_opened_) return Status::OK();
  driver_opened_ = false;
  return CuFileErrorStatus("cuFileDriverClose_v2", api_.driver_close());
}

Result<FileRegistration> CuFileLibrary::RegisterFile(int fd) const {
  if (fd < 0) return Status::InvalidArgument("RegisterFile: bad fd " + std::to_string(fd));
  cf::CUfileDescr_t descr{};
  descr.type = cf::CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  descr.handle.fd = fd;
  descr.fs_ops = nullptr;
  cf::CUfileHandle_t handle = nullptr;
  ORBITKV_RETURN_IF_ERROR(CuFileErrorStatus(
      "cuFileHandleRegister", api_.handle_register(&handle, &descr), "fd " + std::to_string(fd)));
  return FileRegistration(this, handle, fd);
}

void CuFileLibrary::Deregister(cf::CUfileHandle_t handle) const { api_.handle_deregister(handle); }

Status CuFileLibrary::RegisterBuffer(void* device_ptr, size_t size) const {
  if (device_ptr == nullptr || size == 0) {
    return Status::InvalidArgument("RegisterBuffer needs a non-empty device range");
  }
  return CuFileErrorStatus("cuFileBufRegister", api_.buf_register(device_ptr, size, 0),
                           PtrText(device_ptr) + ", +" + std::to_string(size));
}

Status CuFileLibrary::DeregisterBuffer(void* device_ptr) const {
  if (device_ptr == nullptr) return Status::InvalidArgument("DeregisterBuffer(nullptr)");
  return CuFileErrorStatus("cuFileBufDeregister", api_.buf_deregister(device_ptr),
                           PtrText(device_ptr));
}

namespace {

Result<size_t> IoResult(const char* call, ssize_t n, int fd, off_t offset, size_t size) {
  if (n >= 0) return static_cast<size_t>(n);
  const std::string what = std::string(call) + " " + RangeText(fd, offset, size);
  if (n == -1) return Status::IOError(what, errno);
  const int code = static_cast<int>(-n);
  return Status::IOError(
      what + ": cuFile " + std::to_string(code) + " " + std::string(CuFileOpErrorName(code)), EIO);
}

}  // namespace

Result<size_t> CuFileLibrary::Read(const FileRegistration& file, void* device_base, size_t size,
                                   off_t file_offset, off_t buf_offset) const {
  if (!file) return Status::FailedPrecondition("cuFileRead on an unregistered file");
  errno = 0;
  const ssize_t n = api_.read(file.handle(), device_base, size, file_offset, buf_offset);
  return IoResult("cuFileRead", n, file.fd(), file_offset, size);
}

Result<size_t> CuFileLibrary::Write(const FileRegistration& file, const void* device_base,
                                    size_t size, off_t file_offset, off_t buf_offset) const {
  if (!file) return Status::FailedPrecondition("cuFileWrite on an unregistered file");
  errno = 0;
  const ssize_t n = api_.write(file.handle(), device_base, size, file_offset, buf_offset);
  return IoResult("cuFileWrite", n, file.fd(), file_offset, size);
}

}  // namespace orbitkv::gpu
