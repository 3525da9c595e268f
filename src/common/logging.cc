#include "orbitkv/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace orbitkv {

Status InitLogging(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return Status::InvalidArgument("unknown log level '" + std::string(level) + "'");
  }
  auto logger = spdlog::stderr_color_mt("orbitkv");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%t] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return Status::OK();
}

}  // namespace orbitkv
