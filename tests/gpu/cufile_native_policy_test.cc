// The native-only driver policy of automatic backend selection against the
// real libcufile, in a process of its own (a driver opened earlier in the
// process would rightly make the policy refuse). With the compatibility
// variables cleared, OpenDriver(kAutoNativeOnly) must either open a driver
// with compatibility disabled, or report Unavailable with the cuFile code that
// refused it (5001 where nvidia-fs is not loaded, as on the H200 test host).
// Skips without a GPU or libcufile.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "gpu/cuda_device.h"
#include "gpu/cufile_loader.h"

namespace orbitkv::gpu {
namespace {

TEST(CuFileNativePolicyTest, AutoOpensNativeOnlyOrSaysWhyNot) {
  auto count = DeviceCount();
  if (!count.ok() || *count == 0) GTEST_SKIP() << "no CUDA device";
  unsetenv(kCuFileAllowCompatEnv);
  unsetenv(kCuFileForceCompatEnv);
  auto lib = CuFileLibrary::Load();
  if (!lib.ok()) GTEST_SKIP() << lib.status().ToString();
  std::printf("cuFile %s from %s, parameter API: %s\n", (*lib)->VersionString().c_str(),
              (*lib)->path().c_str(), (*lib)->has_parameter_api() ? "yes" : "no");
  if ((*lib)->version() >= 1140) {
    EXPECT_TRUE((*lib)->has_parameter_api()) << "cuFile 1.14+ should export cuFileSetParameterBool";
  }

  auto info = (*lib)->OpenDriver(CuFileInitPolicy::kAutoNativeOnly);
  if (info.ok()) {
    std::printf("native-only driver open: %s\n", info->ToString().c_str());
    EXPECT_TRUE(info->native_only());
    EXPECT_FALSE(info->compat_from_environment);
    EXPECT_TRUE((*lib)->CloseDriver().ok());
    return;
  }
  const Status& st = info.status();
  std::printf("auto selection would fall back to io_uring: %s\n", st.ToString().c_str());
  RecordProperty("fallback_reason", st.ToString());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_EQ(st.message().find("already open"), std::string_view::npos) << st.ToString();
  if ((*lib)->has_parameter_api()) {
    // The policy could be enforced, so the refusal must come from the driver.
    EXPECT_EQ(st.message().rfind("cuFileDriverOpen: ", 0), 0u) << st.ToString();
  }
  EXPECT_FALSE((*lib)->driver_open());
}

}  // namespace
}  // namespace orbitkv::gpu
