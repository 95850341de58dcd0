#include "twell/error.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace twell {

std::string bytes_str(size_t bytes) {
  if (bytes < 1000) return str(bytes, bytes == 1 ? " byte" : " bytes");
  const char* units[] = {"KB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes) / 1000;
  int u = 0;
  while (v >= 999.5 && u < 5) v /= 1000, ++u;  // 999.5 would print as 1000
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f %s", v < 99.95 ? 1 : 0, v, units[u]);
  return buf;
}

size_t parse_bytes(const std::string& text) {
  const auto bad = [&] {
    return Error(str("'", text, "' is not a size: a number of bytes, or one with a unit (K, M, G or T, with or ",
                     "without B: 512M, 40GB)"));
  };
  // A decimal number (digits, at most one point; no sign, exponent or hex), then the unit.
  const size_t digits_end = text.find_first_not_of("0123456789.");
  const std::string number = text.substr(0, digits_end);
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1) throw bad();
  const double v = std::strtod(number.c_str(), nullptr);
  std::string unit = digits_end == std::string::npos ? std::string() : text.substr(digits_end);
  const auto space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; };
  while (!unit.empty() && space(unit.front())) unit.erase(unit.begin());
  while (!unit.empty() && space(unit.back())) unit.pop_back();
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() == 2 && unit[1] == 'B') unit.pop_back();
  double scale = 1;
  if (unit == "K") scale = 1e3;
  else if (unit == "M") scale = 1e6;
  else if (unit == "G") scale = 1e9;
  else if (unit == "T") scale = 1e12;
  else if (!unit.empty() && unit != "B" && unit != "BYTE" && unit != "BYTES") throw bad();
  const double bytes = std::round(v * scale);
  TWELL_REQUIRE(bytes < 9.2e18, "'", text, "' is too large a size (at most 9.2 EB)");
  return static_cast<size_t>(bytes);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const char* non_finite_name(double v) { return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

std::string printable(const std::string& s, size_t max_len) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_len) return out + "...";
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace twell

namespace twell::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  throw Error(str(message, " (", base ? base + 1 : file, ":", line, ")"));
}

}  // namespace twell::detail
