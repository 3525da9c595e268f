// Format: small helpers the drivers' reports and flags share: decimal byte
// counts, thousands separators, percentages, quantiles, list splitting. Pure
// functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace orbitkv::demo {

// "1.23 GB", "456 MB", "12 B" (decimal units).
std::string Bytes(double bytes);
// "1,234,567".
std::string Count(uint64_t value);
// 100 * part / whole; 0 when whole is 0.
double Percent(uint64_t part, uint64_t whole);
// The q-quantile (0 < q <= 1) by the nearest-rank method; 0 for no samples.
double Quantile(std::vector<double> samples, double q);
// "a,,b" -> {"a", "b"}: the non-empty items between separators.
std::vector<std::string> SplitList(std::string_view text, char separator = ',');

}  // namespace orbitkv::demo
