#include "common/thread_name.h"

#include <pthread.h>

#include <algorithm>

namespace orbitkv {

std::string ThreadName(std::string_view role, int index) {
  const std::string suffix = index >= 0 ? std::to_string(index) : std::string();
  const size_t keep = kMaxThreadName - std::min(suffix.size(), kMaxThreadName);
  std::string name(role.substr(0, std::min(role.size(), keep)));
  name += suffix;
  return name.substr(0, kMaxThreadName);
}

void SetThreadName(std::string_view name) {
  const std::string cut(name.substr(0, std::min(name.size(), kMaxThreadName)));
  // Best effort: a thread without its name still works (only ERANGE is
  // possible, and the cut rules it out).
  (void)pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace orbitkv
