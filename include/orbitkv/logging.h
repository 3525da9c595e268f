// Logging: spdlog underneath, one process-wide logger named "orbitkv". Call
// InitLogging once from main (tests may skip it). Log with the OKV_* macros;
// they are thread-safe and format with fmt.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "orbitkv/status.h"

namespace orbitkv {
// level: trace|debug|info|warn|error|off. Writes to stderr.
Status InitLogging(std::string_view level);
}  // namespace orbitkv

#define OKV_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define OKV_LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define OKV_LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define OKV_LOG_ERROR(...) spdlog::error(__VA_ARGS__)
