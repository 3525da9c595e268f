// Command-line flags of orbitkv-cache-manager (CLI11). ParseFlags fills
// ManagerOptions and the engine socket's limits (protocol::ServerOptions,
// where their defaults are declared); a bad value yields one error line that
// names the flag. --help prints every flag with its default.
#pragma once

#include <string>

#include "orbitkv/options.h"
#include "orbitkv/status.h"
#include "protocol/server.h"

namespace orbitkv {

struct ParsedFlags {
  ManagerOptions options;
  // Socket limits; `path` is left empty (options.socket_path names it).
  protocol::ServerOptions server;
  bool exit_now = false;  // --help or --version was printed
};

// `out` receives --help text. Never throws.
Result<ParsedFlags> ParseFlags(int argc, const char* const* argv, std::string* out);

}  // namespace orbitkv
