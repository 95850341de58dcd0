#include "twell/error.h"

#include <cstring>

namespace twell::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  throw Error(str(message, " (", base ? base + 1 : file, ":", line, ")"));
}

}  // namespace twell::detail
