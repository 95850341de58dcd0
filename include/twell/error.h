// twell::Error and the checks that throw it. The library never exits; callers catch.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace twell {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable: str("expected ", 3, " got ", 4).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// A byte count for people, in decimal units: "512 bytes", "3.1 MB", "17.2 GB".
std::string bytes_str(size_t bytes);
// The inverse, for options: "40GB", "40 GB", "1.5T", "512M", "1000" (bytes), decimal units (K, KB, M,
// MB, G, GB, T, TB; B, bytes or none: bytes; any case). Throws an Error quoting the text where it is none.
size_t parse_bytes(const std::string& text);

// `s` with control and non-ASCII bytes escaped (\n, \x01, ...) and cut to `max_len` characters, so
// that names from untrusted files (tensor names, metadata, tokens) keep messages and tables on one line.
std::string printable(const std::string& s, size_t max_len = 200);

// Whether `s` ends with `suffix`.
bool ends_with(const std::string& s, const std::string& suffix);

// A value that is not finite, for messages: "NaN", "+Inf" or "-Inf".
const char* non_finite_name(double v);

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace twell

// Throws twell::Error("<message> (file:line)") unless `cond` holds.
#define TWELL_CHECK(cond, ...)                                                 \
  do {                                                                         \
    if (!(cond)) ::twell::detail::throw_error(__FILE__, __LINE__, ::twell::str(__VA_ARGS__)); \
  } while (0)

#define TWELL_FAIL(...) ::twell::detail::throw_error(__FILE__, __LINE__, ::twell::str(__VA_ARGS__))

// Throws twell::Error("<message>") unless `cond` holds: for what a user gave (arguments, files),
// where the message says everything and a source location would only add noise.
#define TWELL_REQUIRE(cond, ...)                                 \
  do {                                                           \
    if (!(cond)) throw ::twell::Error(::twell::str(__VA_ARGS__)); \
  } while (0)
