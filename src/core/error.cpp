#include "twell/error.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !(v >= 0) || !std::isfinite(v)) throw bad();
  std::string unit(end);
  unit.erase(0, unit.find_first_not_of(' '));
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() == 2 && unit[1] == 'B') unit.pop_back();
  double scale = 1;
  if (unit == "K") scale = 1e3;
  else if (unit == "M") scale = 1e6;
  else if (unit == "G") scale = 1e9;
  else if (unit == "T") scale = 1e12;
  else if (!unit.empty() && unit != "B" && unit != "BYTE" && unit != "BYTES") throw bad();
  const double bytes = std::round(v * scale);
  if (!(bytes < 1.8e19)) throw bad();
  return static_cast<size_t>(bytes);
}

}  // namespace twell

namespace twell::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  throw Error(str(message, " (", base ? base + 1 : file, ":", line, ")"));
}

}  // namespace twell::detail
