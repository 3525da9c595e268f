// CuFileLibrary against a fake libcufile (fake_cufile.cc): symbol resolution,
// the native-only driver policy of automatic selection, error mapping and
// registration lifetimes. Needs no GPU and no GDS, so it runs in CI.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/cufile_loader.h"
#include "testing/temp_dir.h"

namespace orbitkv::gpu {
namespace {

namespace cf = cufile;

// Steering functions exported by the fake library.
struct FakeControl {
  void (*reset)();
  void (*set_open_result)(int);
  void (*set_register_result)(int);
  void (*set_param_result)(int);
  void (*set_io_result)(long);
  void (*set_use_count)(long);
  int (*open_calls)();
  int (*close_calls)();
  int (*live_handles)();
  int (*live_buffers)();
  int (*param_at_open)(int);
};

template <typename Fn>
Fn Sym(void* handle, const char* name) {
  void* p = dlsym(handle, name);
  EXPECT_NE(p, nullptr) << name;
  return reinterpret_cast<Fn>(p);
}

FakeControl OpenControl(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // same instance CuFileLibrary loads
  EXPECT_NE(h, nullptr) << dlerror();
  FakeControl c{};
  c.reset = Sym<void (*)()>(h, "okv_fake_reset");
  c.set_open_result = Sym<void (*)(int)>(h, "okv_fake_set_open_result");
  c.set_register_result = Sym<void (*)(int)>(h, "okv_fake_set_register_result");
  c.set_param_result = Sym<void (*)(int)>(h, "okv_fake_set_param_result");
  c.set_io_result = Sym<void (*)(long)>(h, "okv_fake_set_io_result");
  c.set_use_count = Sym<void (*)(long)>(h, "okv_fake_set_use_count");
  c.open_calls = Sym<int (*)()>(h, "okv_fake_open_calls");
  c.close_calls = Sym<int (*)()>(h, "okv_fake_close_calls");
  c.live_handles = Sym<int (*)()>(h, "okv_fake_live_handles");
  c.live_buffers = Sym<int (*)()>(h, "okv_fake_live_buffers");
  c.param_at_open = Sym<int (*)(int)>(h, "okv_fake_param_at_open");
  return c;
}

// A fake library beside this test's executable.
std::string FakePath(const char* file_name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(".");
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/" + file_name;
}

const std::string& Fake() {
  static const std::string path = FakePath(OKV_FAKE_CUFILE_NAME);
  return path;
}

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

class CuFileLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The outer environment (a GPU-host run with compat mode on) must not
    // leak into these policy checks.
    unsetenv(kCuFileLibraryEnv);
    unsetenv(kCuFileAllowCompatEnv);
    unsetenv(kCuFileForceCompatEnv);
    fake_ = OpenControl(Fake());
    fake_.reset();
  }
  void TearDown() override {
    unsetenv(kCuFileLibraryEnv);
    unsetenv(kCuFileAllowCompatEnv);
    unsetenv(kCuFileForceCompatEnv);
  }

  std::unique_ptr<CuFileLibrary> LoadFake() {
    auto lib = CuFileLibrary::LoadFrom(Fake());
    EXPECT_TRUE(lib.ok()) << lib.status().ToString();
    return lib.ok() ? std::move(lib).value() : nullptr;
  }

  FakeControl fake_{};
};

TEST_F(CuFileLoaderTest, MissingLibraryIsUnavailableAndNamesThePath) {
  setenv(kCuFileLibraryEnv, "/nonexistent/orbitkv/libcufile.so.0", 1);
  auto lib = CuFileLibrary::Load();
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(lib.status().message(), "/nonexistent/orbitkv/libcufile.so.0"))
      << lib.status().ToString();
  EXPECT_TRUE(Contains(lib.status().message(), kCuFileLibraryEnv)) << lib.status().ToString();
}

TEST_F(CuFileLoaderTest, EnvironmentOverrideSelectsTheLibrary) {
  setenv(kCuFileLibraryEnv, Fake().c_str(), 1);
  auto lib = CuFileLibrary::Load();
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_EQ((*lib)->path(), Fake());
  EXPECT_EQ((*lib)->version(), 1150);
  EXPECT_EQ((*lib)->VersionString(), "1.15");
  EXPECT_TRUE((*lib)->has_parameter_api());
}

TEST_F(CuFileLoaderTest, MissingRequiredSymbolIsNamed) {
  auto lib = CuFileLibrary::LoadFrom(FakePath(OKV_FAKE_CUFILE_NO_READ_NAME));
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(lib.status().message(), "lacks required symbol cuFileRead "))
      << lib.status().ToString();
}

TEST_F(CuFileLoaderTest, AutoDisallowsCompatibilityBeforeDriverOpen) {
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->native_only());
  EXPECT_FALSE(info->compat_from_environment);
  EXPECT_EQ(fake_.param_at_open(cf::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE), 0);
  EXPECT_EQ(fake_.param_at_open(cf::CUFILE_PARAM_FORCE_COMPAT_MODE), 0);
  EXPECT_TRUE(lib->driver_open());
  EXPECT_EQ(lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(lib->CloseDriver().ok());
  EXPECT_EQ(fake_.close_calls(), 1);
}

TEST_F(CuFileLoaderTest, AutoHonoursCompatibilityEnvironment) {
  setenv(kCuFileAllowCompatEnv, "true", 1);
  setenv(kCuFileForceCompatEnv, "TRUE", 1);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->compat_from_environment);
  EXPECT_TRUE(info->compat_allowed);
  EXPECT_TRUE(info->compat_forced);
  EXPECT_FALSE(info->native_only());
  EXPECT_TRUE(Contains(info->ToString(), "not native")) << info->ToString();
  EXPECT_EQ(fake_.param_at_open(cf::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE), 1);
  EXPECT_EQ(fake_.param_at_open(cf::CUFILE_PARAM_FORCE_COMPAT_MODE), 1);
}

TEST_F(CuFileLoaderTest, AutoWithExplicitNativeEnvironmentIsNativeOnly) {
  setenv(kCuFileAllowCompatEnv, "false", 1);
  setenv(kCuFileForceCompatEnv, "0", 1);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->native_only());
  EXPECT_EQ(fake_.param_at_open(cf::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE), 0);
}

TEST_F(CuFileLoaderTest, UnparsableEnvironmentIsInvalidArgument) {
  setenv(kCuFileForceCompatEnv, "maybe", 1);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kExplicit);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(info.status().message(), kCuFileForceCompatEnv));
  EXPECT_EQ(fake_.open_calls(), 0);
}

TEST_F(CuFileLoaderTest, AutoWithoutParameterApiCannotEnforcePolicy) {
  auto lib = CuFileLibrary::LoadFrom(FakePath(OKV_FAKE_CUFILE_NO_PARAM_NAME));
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_FALSE((*lib)->has_parameter_api());
  auto info = (*lib)->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(info.status().message(), "cannot enforce the native-only policy"))
      << info.status().ToString();
  // The explicit backend does not need the parameter API.
  auto explicit_info = (*lib)->OpenDriver(CuFileInitPolicy::kExplicit);
  ASSERT_TRUE(explicit_info.ok()) << explicit_info.status().ToString();
  EXPECT_TRUE(explicit_info->compat_allowed);  // unknown: cuFile's default
}

TEST_F(CuFileLoaderTest, AutoRefusesADriverAlreadyOpenInTheProcess) {
  fake_.set_use_count(1);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(info.status().message(), "already open")) << info.status().ToString();
  EXPECT_EQ(fake_.open_calls(), 0);
}

TEST_F(CuFileLoaderTest, AutoFailsWhenAParameterCannotBeSet) {
  fake_.set_param_result(cf::CU_FILE_DRIVER_ALREADY_OPEN);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(info.status().message(), "5026")) << info.status().ToString();
  EXPECT_EQ(fake_.open_calls(), 0);
}

TEST_F(CuFileLoaderTest, DriverOpenFailureCarriesTheCuFileCode) {
  fake_.set_open_result(cf::CU_FILE_DRIVER_NOT_INITIALIZED);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto info = lib->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(
      info.status().message().rfind("cuFileDriverOpen: 5001 CU_FILE_DRIVER_NOT_INITIALIZED", 0), 0u)
      << info.status().ToString();
  EXPECT_FALSE(lib->driver_open());
}

TEST_F(CuFileLoaderTest, FileRegistrationRefusalIsUnavailableWithCodeAndFd) {
  orbitkv::testing::TempDir dir;
  const int fd = open(dir.File("f").c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  fake_.set_register_result(cf::CU_FILE_HANDLE_NOT_REGISTERED);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  auto reg = lib->RegisterFile(fd);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(reg.status().message(), "cuFileHandleRegister: 5027"))
      << reg.status().ToString();
  EXPECT_TRUE(Contains(reg.status().message(), "fd " + std::to_string(fd)));
  close(fd);
}

TEST_F(CuFileLoaderTest, RegistrationsAreReleasedAndIoRoundTrips) {
  orbitkv::testing::TempDir dir;
  const int fd = open(dir.File("f").c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  auto lib = LoadFake();
  ASSERT_NE(lib, nullptr);
  ASSERT_TRUE(lib->OpenDriver(CuFileInitPolicy::kExplicit).ok());
  {
    auto reg = lib->RegisterFile(fd);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    EXPECT_EQ(fake_.live_handles(), 1);
    FileRegistration moved = std::move(reg).value();
    EXPECT_EQ(moved.fd(), fd);
    EXPECT_EQ(fake_.live_handles(), 1);

    // The fake's "device" memory is host memory.
    std::vector<char> out(8192), in(8192, 0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7);
    ASSERT_TRUE(lib->RegisterBuffer(out.data(), out.size()).ok());
    EXPECT_EQ(fake_.live_buffers(), 1);
    auto wrote = lib->Write(moved, out.data(), 4096, 4096, 4096);
    ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
    EXPECT_EQ(*wrote, 4096u);
    auto got = lib->Read(moved, in.data(), 4096, 4096);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, 4096u);
    EXPECT_EQ(std::memcmp(in.data(), out.data() + 4096, 4096), 0);

    // A short read is a count, not an error: the caller decides.
    auto past_end = lib->Read(moved, in.data(), 4096, 6144);
    ASSERT_TRUE(past_end.ok());
    EXPECT_EQ(*past_end, 2048u);

    fake_.set_io_result(-static_cast<long>(cf::CU_FILE_IO_ERROR));
    auto failed = lib->Read(moved, in.data(), 4096, 0);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().code(), StatusCode::kIOError);
    EXPECT_TRUE(Contains(failed.status().message(), "5044")) << failed.status().ToString();
    EXPECT_TRUE(Contains(failed.status().message(), "[0, +4096)")) << failed.status().ToString();
    fake_.set_io_result(-1);
    auto errno_failed = lib->Write(moved, out.data(), 4096, 0);
    ASSERT_FALSE(errno_failed.ok());
    EXPECT_EQ(errno_failed.status().err_no(), EIO);
    fake_.set_io_result(0);

    ASSERT_TRUE(lib->DeregisterBuffer(out.data()).ok());
    EXPECT_EQ(fake_.live_buffers(), 0);
    EXPECT_EQ(lib->DeregisterBuffer(out.data()).code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(fake_.live_handles(), 0);
  close(fd);
}

TEST(CuFileErrorStatusTest, MapsCodesAndNamesTheCall) {
  EXPECT_TRUE(CuFileErrorStatus("x", {cf::CU_FILE_SUCCESS, CUDA_SUCCESS}).ok());
  Status cuda = CuFileErrorStatus("cuFileBufRegister",
                                  {cf::CU_FILE_CUDA_DRIVER_ERROR, CUDA_ERROR_OUT_OF_MEMORY}, "p");
  EXPECT_EQ(cuda.code(), StatusCode::kInternal);
  EXPECT_TRUE(Contains(cuda.message(), "cuFileBufRegister: 5011 CU_FILE_CUDA_DRIVER_ERROR"));
  EXPECT_TRUE(Contains(cuda.message(), "CUresult 2")) << cuda.ToString();
  EXPECT_TRUE(Contains(cuda.message(), "[p]")) << cuda.ToString();
  EXPECT_EQ(CuFileErrorStatus("c", {cf::CU_FILE_MEMORY_ALREADY_REGISTERED, CUDA_SUCCESS}).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(CuFileErrorStatus("c", {cf::CU_FILE_DIO_NOT_SET, CUDA_SUCCESS}).code(),
            StatusCode::kInvalidArgument);
  Status unknown = CuFileErrorStatus("c", {static_cast<cf::CUfileOpError>(5999), CUDA_SUCCESS});
  EXPECT_EQ(unknown.code(), StatusCode::kInternal);
  EXPECT_TRUE(Contains(unknown.message(), "5999 CU_FILE_UNKNOWN_ERROR"));
}

TEST(CuFileErrorStatusTest, ParsesEnvironmentBooleans) {
  for (const char* t : {"true", "TRUE", "1", "yes", "On"}) EXPECT_TRUE(*ParseEnvBool("X", t)) << t;
  for (const char* f : {"false", "False", "0", "no", "OFF"}) {
    EXPECT_FALSE(*ParseEnvBool("X", f)) << f;
  }
  EXPECT_EQ(ParseEnvBool("X", "2").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace orbitkv::gpu
