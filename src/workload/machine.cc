#include "workload/machine.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

namespace orbitkv::demo {

std::string DefaultStateDir() {
  if (const char* d = std::getenv("ORBITKV_DEMO_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/orbitkv-demo";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/orbitkv-demo";
  return "/var/tmp/orbitkv-demo-" + std::to_string(::getuid());
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::IOError("create directory " + path, ec.value());
  return Status::OK();
}

uint64_t TotalRamBytes() {
  struct sysinfo si {};
  if (::sysinfo(&si) != 0) return 0;
  return uint64_t{si.totalram} * si.mem_unit;
}

Result<uint64_t> FreeBytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0) return Status::IOError("statvfs " + path, errno);
  return uint64_t{s.f_bavail} * s.f_frsize;
}

std::string SelfDir() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return p.parent_path().string();
}

}  // namespace orbitkv::demo
