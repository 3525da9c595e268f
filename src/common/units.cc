#include "orbitkv/units.h"

#include <cctype>
#include <cstdio>

namespace orbitkv {
namespace {

struct Unit {
  std::string_view name;
  uint64_t scale;
};
constexpr Unit kUnits[] = {
    {"", 1},
    {"b", 1},
    {"kb", 1000ULL},
    {"mb", 1000ULL * 1000},
    {"gb", 1000ULL * 1000 * 1000},
    {"tb", 1000ULL * 1000 * 1000 * 1000},
    {"kib", kKiB},
    {"mib", kMiB},
    {"gib", kGiB},
    {"tib", kGiB * 1024},
};

Status Bad(std::string_view text, std::string_view why) {
  return Status::InvalidArgument("invalid byte size '" + std::string(text) +
                                 "': " + std::string(why) + " (examples: 4096, 64kib, 8gb)");
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t i = 0;
  unsigned __int128 whole = 0;
  size_t int_digits = 0;
  constexpr unsigned __int128 kMax = UINT64_MAX;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    whole = whole * 10 + (text[i] - '0');
    if (whole > kMax) return Bad(text, "too large");
    ++i;
    ++int_digits;
  }
  unsigned __int128 frac = 0, frac_div = 1;
  size_t frac_digits = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (frac_digits < 19) {
        frac = frac * 10 + (text[i] - '0');
        frac_div *= 10;
      } else if (text[i] != '0') {
        return Bad(text, "too many fractional digits");
      }
      ++i;
      ++frac_digits;
    }
    if (frac_digits == 0) return Bad(text, "expected digits after '.'");
  }
  if (int_digits == 0) {
    if (text.empty()) return Bad(text, "empty");
    return Bad(text, "must start with a digit");
  }
  std::string unit;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (!std::isalpha(static_cast<unsigned char>(c))) {
      if (c == ' ' || c == '\t') return Bad(text, "no spaces allowed");
      return Bad(text, std::string("unexpected character '") + c + "'");
    }
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  for (const Unit& u : kUnits) {
    if (u.name != unit) continue;
    unsigned __int128 bytes = whole * u.scale;
    if (bytes > kMax) return Bad(text, "too large");
    if (frac != 0) {
      unsigned __int128 num = frac * u.scale;
      if (num % frac_div != 0) return Bad(text, "fraction does not name whole bytes");
      bytes += num / frac_div;
      if (bytes > kMax) return Bad(text, "too large");
    }
    return static_cast<uint64_t>(bytes);
  }
  return Bad(text, "unknown unit '" + unit + "'");
}

std::string FormatByteSize(uint64_t bytes) {
  char buf[48];
  if (bytes % kKiB == 0 && bytes % 1000 != 0 && bytes > 0) {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes) / kKiB;
    int u = 0;
    while (v >= 1024 && u < 3) {
      v /= 1024;
      ++u;
    }
    std::snprintf(buf, sizeof buf, "%.4g %s", v, units[u]);
    return buf;
  }
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.4g %s", v, units[u]);
  return buf;
}

}  // namespace orbitkv
