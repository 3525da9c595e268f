// Printable: untrusted bytes echoed into an error message: printable ASCII as
// is, everything else (and quotes, backslashes) as \xNN, at most 64 bytes,
// then "... (N bytes)".
#pragma once

#include <string>
#include <string_view>

namespace orbitkv {

std::string Printable(std::string_view s);

}  // namespace orbitkv
