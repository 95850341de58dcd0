// Strict JSON parsing and message helpers shared by the checkpoint and config readers.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "twell/error.h"  // printable, for the messages of these files

namespace twell::io::detail {

// Parses [begin, end) as JSON, rejecting what nlohmann would silently accept: duplicate keys in
// an object (nlohmann keeps the last) and nesting deeper than `max_depth`. Errors are one line:
// "<source>: <what> is not valid JSON: <reason>".
nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& source,
                                 const char* what, int max_depth = 16);

// The whole file as a string; throws "<path>: cannot read: <reason>", and for what is not a regular
// file (a directory, a FIFO that would block, a device such as /dev/zero that never ends) or holds
// more than 1 GiB (no config or index is that large).
std::string read_text_file(const std::string& path);

// "" where `path` is not a symbolic link to nothing, else "<path> is a symbolic link to <target>, which
// does not exist": for the messages of files that seem missing but were meant to be there.
std::string dangling_link(const std::string& path);

// Whether `path` names an existing directory (following links).
bool is_directory(const std::string& path);

// The directory part of `path`: "." for a bare name, "/" for a file at the root.
std::string parent_dir(const std::string& path);

}  // namespace twell::io::detail
