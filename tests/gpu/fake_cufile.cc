// A stand-in libcufile for CuFileLibrary's tests on hosts without a GPU or GDS.
// It exports the cuFile entry points with the shapes declared in
// gpu/cufile_api.h, keeps "device" buffers in host memory (cuFileRead/Write
// become pread/pwrite), and records what the loader did: parameter values at
// the moment of cuFileDriverOpen, open/close counts, live registrations.
// The okv_fake_* functions steer and inspect it; tests reach them by dlopen()
// of the same path, which yields the same (shared) instance.
// Variants, by compile definition: OKV_FAKE_NO_PARAM_API drops the parameter
// API (an old cuFile); OKV_FAKE_NO_READ drops cuFileRead (a broken library).
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "gpu/cufile_api.h"

namespace cf = orbitkv::gpu::cufile;

namespace {

struct FakeState {
  std::mutex mu;
  bool driver_open = false;
  int open_calls = 0;
  int close_calls = 0;
  int open_result = 0;
  int register_result = 0;
  int param_result = 0;
  ssize_t io_result = 0;  // 0: do the I/O; otherwise returned as is
  long use_count = 0;
  int live_handles = 0;
  int live_buffers = 0;
  bool params[3] = {false, true, false};  // cuFile defaults: poll off, compat allowed, not forced
  int params_at_open[3] = {-1, -1, -1};
};

FakeState& State() {
  static FakeState* state = new FakeState();  // never destroyed: used from atexit paths
  return *state;
}

cf::CUfileError_t Err(int code) {
  return cf::CUfileError_t{static_cast<cf::CUfileOpError>(code), CUDA_SUCCESS};
}

template <typename F>
auto Locked(F&& f) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return f(s);
}

struct FakeHandle {
  int fd;
};

}  // namespace

extern "C" {

// ---- control ----------------------------------------------------------------

void okv_fake_reset() {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.driver_open = false;
  s.open_calls = s.close_calls = 0;
  s.open_result = s.register_result = s.param_result = 0;
  s.io_result = 0;
  s.use_count = 0;
  s.live_handles = s.live_buffers = 0;
  s.params[0] = false;
  s.params[1] = true;
  s.params[2] = false;
  for (int& p : s.params_at_open) p = -1;
}
void okv_fake_set_open_result(int code) {
  Locked([&](FakeState& s) { s.open_result = code; });
}
void okv_fake_set_register_result(int code) {
  Locked([&](FakeState& s) { s.register_result = code; });
}
void okv_fake_set_param_result(int code) {
  Locked([&](FakeState& s) { s.param_result = code; });
}
void okv_fake_set_io_result(long result) {
  Locked([&](FakeState& s) { s.io_result = result; });
}
void okv_fake_set_use_count(long count) {
  Locked([&](FakeState& s) { s.use_count = count; });
}
int okv_fake_open_calls() {
  return Locked([](FakeState& s) { return s.open_calls; });
}
int okv_fake_close_calls() {
  return Locked([](FakeState& s) { return s.close_calls; });
}
int okv_fake_live_handles() {
  return Locked([](FakeState& s) { return s.live_handles; });
}
int okv_fake_live_buffers() {
  return Locked([](FakeState& s) { return s.live_buffers; });
}
// -1: the driver was not opened since the last reset.
int okv_fake_param_at_open(int param) {
  return Locked([&](FakeState& s) { return s.params_at_open[param]; });
}

// ---- the cuFile API -----------------------------------------------------------

cf::CUfileError_t cuFileDriverOpen() {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.open_calls;
  if (s.open_result != 0) return Err(s.open_result);
  s.driver_open = true;
  ++s.use_count;
  for (int i = 0; i < 3; ++i) s.params_at_open[i] = s.params[i] ? 1 : 0;
  return Err(0);
}

cf::CUfileError_t cuFileDriverClose_v2() {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.close_calls;
  if (!s.driver_open) return Err(cf::CU_FILE_DRIVER_NOT_INITIALIZED);
  s.driver_open = false;
  --s.use_count;
  return Err(0);
}

long cuFileUseCount() {
  return Locked([](FakeState& s) { return s.use_count; });
}

cf::CUfileError_t cuFileGetVersion(int* version) {
  *version = 1150;
  return Err(0);
}

#ifndef OKV_FAKE_NO_PARAM_API
cf::CUfileError_t cuFileSetParameterBool(cf::CUFileBoolConfigParameter_t param, bool value) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.param_result != 0) return Err(s.param_result);
  if (s.driver_open) return Err(cf::CU_FILE_DRIVER_ALREADY_OPEN);
  if (param < 0 || param > 2) return Err(cf::CU_FILE_INVALID_VALUE);
  s.params[param] = value;
  return Err(0);
}

cf::CUfileError_t cuFileGetParameterBool(cf::CUFileBoolConfigParameter_t param, bool* value) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (param < 0 || param > 2) return Err(cf::CU_FILE_INVALID_VALUE);
  *value = s.params[param];
  return Err(0);
}
#endif

cf::CUfileError_t cuFileHandleRegister(cf::CUfileHandle_t* fh, cf::CUfileDescr_t* descr) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.register_result != 0) return Err(s.register_result);
  if (descr == nullptr || descr->type != cf::CU_FILE_HANDLE_TYPE_OPAQUE_FD ||
      descr->fs_ops != nullptr || descr->handle.fd < 0) {
    return Err(cf::CU_FILE_INVALID_VALUE);
  }
  *fh = new FakeHandle{descr->handle.fd};
  ++s.live_handles;
  return Err(0);
}

void cuFileHandleDeregister(cf::CUfileHandle_t fh) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  delete static_cast<FakeHandle*>(fh);
  --s.live_handles;
}

cf::CUfileError_t cuFileBufRegister(const void* base, size_t length, int flags) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (base == nullptr || length == 0) return Err(cf::CU_FILE_INVALID_VALUE);
  ++s.live_buffers;
  return Err(0);
}

cf::CUfileError_t cuFileBufDeregister(const void* base) {
  FakeState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.live_buffers == 0) return Err(cf::CU_FILE_MEMORY_NOT_REGISTERED);
  --s.live_buffers;
  return Err(0);
}

#ifndef OKV_FAKE_NO_READ
ssize_t cuFileRead(cf::CUfileHandle_t fh, void* base, size_t size, off_t file_offset,
                   off_t buf_offset) {
  const ssize_t forced = Locked([](FakeState& s) { return s.io_result; });
  if (forced != 0) {
    if (forced == -1) errno = EIO;
    return forced;
  }
  return pread(static_cast<FakeHandle*>(fh)->fd, static_cast<char*>(base) + buf_offset, size,
               file_offset);
}
#endif

ssize_t cuFileWrite(cf::CUfileHandle_t fh, const void* base, size_t size, off_t file_offset,
                    off_t buf_offset) {
  const ssize_t forced = Locked([](FakeState& s) { return s.io_result; });
  if (forced != 0) {
    if (forced == -1) errno = EIO;
    return forced;
  }
  return pwrite(static_cast<FakeHandle*>(fh)->fd, static_cast<const char*>(base) + buf_offset, size,
                file_offset);
}

cf::CUfileError_t cuFileStreamRegister(CUstream, unsigned) { return Err(0); }
cf::CUfileError_t cuFileStreamDeregister(CUstream) { return Err(0); }
cf::CUfileError_t cuFileReadAsync(cf::CUfileHandle_t, void*, size_t*, off_t*, off_t*, ssize_t*,
                                  CUstream) {
  return Err(cf::CU_FILE_ASYNC_NOT_SUPPORTED);
}
cf::CUfileError_t cuFileWriteAsync(cf::CUfileHandle_t, void*, size_t*, off_t*, off_t*, ssize_t*,
                                   CUstream) {
  return Err(cf::CU_FILE_ASYNC_NOT_SUPPORTED);
}

}  // extern "C"
