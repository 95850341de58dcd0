#include "twell/error.h"

#include <cstdio>
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

}  // namespace twell

namespace twell::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  throw Error(str(message, " (", base ? base + 1 : file, ":", line, ")"));
}

}  // namespace twell::detail
