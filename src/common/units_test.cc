#include "orbitkv/units.h"

#include <gtest/gtest.h>

#include <string>

namespace orbitkv {
namespace {

uint64_t Parse(std::string_view text) {
  Result<uint64_t> r = ParseByteSize(text);
  EXPECT_TRUE(r.ok()) << "'" << text << "': " << r.status().ToString();
  return r.value_or(0);
}

// The error for `text`, checked to be InvalidArgument and to quote the input.
std::string Error(std::string_view text) {
  Result<uint64_t> r = ParseByteSize(text);
  EXPECT_FALSE(r.ok()) << "'" << text << "' parsed as " << r.value_or(0);
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  std::string msg(r.status().message());
  EXPECT_NE(msg.find("'" + std::string(text) + "'"), std::string::npos) << msg;
  return msg;
}

TEST(ParseByteSizeTest, DecimalUnits) {
  EXPECT_EQ(Parse("8gb"), 8'000'000'000u);
  EXPECT_EQ(Parse("100gb"), 100'000'000'000u);
  EXPECT_EQ(Parse("512gb"), 512'000'000'000u);
  EXPECT_EQ(Parse("1gb"), 1'000'000'000u);
  EXPECT_EQ(Parse("3kb"), 3'000u);
  EXPECT_EQ(Parse("7mb"), 7'000'000u);
  EXPECT_EQ(Parse("2tb"), 2'000'000'000'000u);
  EXPECT_EQ(Parse("10b"), 10u);
}

TEST(ParseByteSizeTest, BinaryUnits) {
  EXPECT_EQ(Parse("64kib"), 65536u);
  EXPECT_EQ(Parse("2mib"), 2 * kMiB);
  EXPECT_EQ(Parse("4gib"), 4 * kGiB);
  EXPECT_EQ(Parse("1tib"), 1024 * kGiB);
}

TEST(ParseByteSizeTest, PlainBytesAndCase) {
  EXPECT_EQ(Parse("4096"), 4096u);
  EXPECT_EQ(Parse("0"), 0u);
  EXPECT_EQ(Parse("8GB"), 8'000'000'000u);
  EXPECT_EQ(Parse("8Gb"), 8'000'000'000u);
  EXPECT_EQ(Parse("64KiB"), 65536u);
  EXPECT_EQ(Parse("18446744073709551615"), UINT64_MAX);
}

TEST(ParseByteSizeTest, FractionsNamingWholeBytes) {
  EXPECT_EQ(Parse("1.5kb"), 1500u);
  EXPECT_EQ(Parse("0.5kib"), 512u);
  EXPECT_EQ(Parse("2.25gb"), 2'250'000'000u);
  EXPECT_EQ(Parse("1.000b"), 1u);
  EXPECT_NE(Error("1.0001b").find("whole bytes"), std::string::npos);
  EXPECT_NE(Error("0.3kib").find("whole bytes"), std::string::npos);  // 307.2 bytes
  EXPECT_NE(Error("1.").find("digits after"), std::string::npos);
}

TEST(ParseByteSizeTest, MalformedInputsAreRejectedWithReasons) {
  EXPECT_NE(Error("8 gb").find("space"), std::string::npos);
  EXPECT_NE(Error(" 8gb").find("digit"), std::string::npos);
  EXPECT_NE(Error("8gb ").find("space"), std::string::npos);
  EXPECT_NE(Error("-1gb").find("digit"), std::string::npos);
  EXPECT_NE(Error("+1gb").find("digit"), std::string::npos);
  EXPECT_NE(Error("1.5.gb").find("'.'"), std::string::npos);
  EXPECT_NE(Error("").find("empty"), std::string::npos);
  EXPECT_NE(Error("gb").find("digit"), std::string::npos);
  EXPECT_NE(Error("12xb").find("unknown unit 'xb'"), std::string::npos);
  EXPECT_NE(Error("8gb2").find("'2'"), std::string::npos);
  EXPECT_NE(Error(".5kb").find("digit"), std::string::npos);
  // Every message shows valid forms.
  EXPECT_NE(Error("12xb").find("examples"), std::string::npos);
}

TEST(ParseByteSizeTest, Overflow) {
  EXPECT_NE(Error("18446744073709551616").find("too large"), std::string::npos);
  EXPECT_NE(Error("20000000000tb").find("too large"), std::string::npos);
  EXPECT_NE(Error("99999999999999999999999999999999").find("too large"), std::string::npos);
  EXPECT_NE(Error("18446744073709551615.5kb").find("too large"), std::string::npos);
  EXPECT_NE(Error("16777216tib").find("too large"), std::string::npos);  // 2^24 * 2^40
  EXPECT_EQ(Parse("16777215tib"), uint64_t{16777215} * 1024 * kGiB);
}

TEST(FormatByteSizeTest, Examples) {
  EXPECT_EQ(FormatByteSize(0), "0 B");
  EXPECT_EQ(FormatByteSize(999), "999 B");
  EXPECT_EQ(FormatByteSize(1500), "1.5 KB");
  EXPECT_EQ(FormatByteSize(512'000'000'000), "512 GB");
  EXPECT_EQ(FormatByteSize(65536), "64 KiB");
  EXPECT_EQ(FormatByteSize(8 * kGiB), "8 GiB");
  EXPECT_EQ(FormatByteSize(4096), "4 KiB");
}

TEST(AlignTest, UpAndDown) {
  EXPECT_EQ(AlignUp(0, 4096), 0u);
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_EQ(AlignDown(4097, 4096), 4096u);
  EXPECT_EQ(AlignDown(4095, 4096), 0u);
  EXPECT_EQ(AlignUp(100, 3), 102u);
}

}  // namespace
}  // namespace orbitkv
