// Each subcommand of the `twell` CLI lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <climits>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <system_error>

namespace twell::cli {

// Flushes standard output; "" where everything printed reached its file, else why not ("writing the
// standard output failed: No space left on device"): a full disk or a closed pipe is an error, not
// a lost table.
inline std::string stdout_failure() {
  errno = 0;  // what these flushes set, not what an earlier call left
  std::cout.flush();
  const bool flushed = std::fflush(stdout) == 0;
  const int cause = errno;
  if (flushed && !std::ferror(stdout) && std::cout) return {};
  return std::string("writing the standard output failed: ") +
         (cause ? std::strerror(cause) : "an earlier write did (a full disk, or a reader that closed the pipe?)");
}

// What a number option says of an empty value (CLI11 would read it as 0): main() checks every
// number option for it before the option's own validators.
inline const char* const kEmptyNumber = "got an empty value; give a number";

// Where a number's digits start: past one '+' before a digit or a point ("+0.5", as strtod reads it), which
// std::from_chars does not take.
inline const char* after_plus(const std::string& value) {
  const bool plus = value.size() > 1 && value[0] == '+' &&
                    (std::isdigit(static_cast<unsigned char>(value[1])) || value[1] == '.');
  return value.data() + (plus ? 1 : 0);
}

// An integer option in [min, max], with a plain message ("--iters: must be at least 1, got 0", "--batch:
// must be in [1, 65535], got 0"). Decimal digits only: CLI11 would read 0x10 as 16, and 1e3 as nothing.
inline CLI::Validator int_in(long long min, long long max) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        long long v = 0;
        const char* end = value.data() + value.size();
        const auto [stop, ec] = std::from_chars(after_plus(value), end, v);
        if (ec == std::errc::result_out_of_range) return "must be an integer that fits in 64 bits, got " + value;
        if (value.empty() || ec != std::errc() || stop != end) return "must be an integer, got " + value;
        if (v >= min && v <= max) return {};
        return max == LLONG_MAX ? "must be at least " + std::to_string(min) + ", got " + value
                                : "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + value;
      },
      max == LLONG_MAX ? ">=" + std::to_string(min) : "[" + std::to_string(min) + ", " + std::to_string(max) + "]");
}
inline CLI::Validator at_least(long long min) { return int_in(min, LLONG_MAX); }

// A real option in [lo, hi], or (lo, hi] where lo_open; finite; `range` says it in the message
// ("--top-p: must be in (0, 1], got 1.5"). NaN fails every comparison, so it is refused too. Decimal
// forms only, as int_in: strtod (and so CLI11) would read 0x10 as 16, and 1e-400 as 0 (a temperature
// of 1e-400 ran greedy with no word of it).
inline CLI::Validator real_in(double lo, bool lo_open, double hi, const std::string& range) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        double v = 0;
        const char* end = value.data() + value.size();
        const auto [stop, ec] = std::from_chars(after_plus(value), end, v, std::chars_format::general);
        if (ec == std::errc::result_out_of_range) return "must be a number a double holds, got " + value;
        if (value.empty() || ec != std::errc() || stop != end) return "must be a number, got " + value;
        const bool ok = (lo_open ? v > lo : v >= lo) && v <= hi && std::isfinite(v);
        return ok ? std::string() : "must be " + range + ", got " + value;
      },
      range);
}

// `check` on the items of a list option that are numbers; one that is not is left to the conversion's own
// message, which names the words a list swallowed ("--density: cannot read '0.005 out.json' as its values").
inline CLI::Validator numeric_items(CLI::Validator check) {
  const std::string description = check.get_description();
  return CLI::Validator(
      [check](std::string& value) mutable -> std::string {
        char* stop = nullptr;
        std::strtod(value.c_str(), &stop);
        if (value.empty() || stop != value.c_str() + value.size()) return {};
        return check(value);
      },
      description);
}

// A 64-bit seed: decimal digits only, at most 2^64 - 1 (a sign or an overflow would otherwise wrap).
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const bool digits = !value.empty() && value.size() <= 20 &&
                            value.find_first_not_of("0123456789") == std::string::npos;
        if (digits && (value.size() < 20 || value <= "18446744073709551615")) return {};
        return "must be an integer from 0 to 18446744073709551615, got " + value;
      },
      "UINT64");
}

// An output file's name: not empty, and not "-" (the records are not written to stdout).
inline CLI::Validator file_name() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        if (value.empty()) return "expected a file name, got an empty one";
        return value == "-" ? "expected a file name, got '-' (stdout is not supported)" : std::string();
      },
      "FILE");
}

// An input file that exists and is not a directory, said plainly ("file: no such file: x.txt").
inline CLI::Validator existing_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (path.empty()) return "expected a file name, got an empty one";
        if (CLI::ExistingFile(path).empty()) return {};
        return CLI::ExistingDirectory(path).empty() ? "expected a file, got the directory " + path
                                                    : "no such file: " + path;
      },
      "FILE");
}

// `command_line` is the full invocation, recorded in benchmark results.
void register_bench(CLI::App& app, const std::string& command_line);
void register_inspect(CLI::App& app);
void register_run(CLI::App& app);
void register_eval(CLI::App& app);

}  // namespace twell::cli
