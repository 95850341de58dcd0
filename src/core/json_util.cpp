// Strict JSON parsing and message helpers (json_util.h).
#include "json_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "twell/error.h"

namespace twell::io::detail {

nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& source,
                                 const char* what, int max_depth) {
  std::vector<std::set<std::string>> keys_per_open_object;
  auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      // `depth` counts the enclosing containers, so the new one is at depth + 1.
      if (depth + 1 > max_depth)
        throw Error(str(source, ": ", what, " nests deeper than ", max_depth, " levels"));
      if (event == E::object_start) keys_per_open_object.emplace_back();
    } else if (event == E::object_end) {
      keys_per_open_object.pop_back();
    } else if (event == E::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys_per_open_object.back().insert(key).second)
        throw Error(str(source, ": ", what, " has the key '", printable(key), "' twice"));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(begin, end, check);
  } catch (const nlohmann::json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix.
    std::string reason = e.what();
    if (!reason.empty() && reason[0] == '[') {
      size_t close = reason.find("] ");
      if (close != std::string::npos) reason = reason.substr(close + 2);
    }
    throw Error(str(source, ": ", what, " is not valid JSON: ", printable(reason, 300)));
  }
}

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

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string read_text_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))  // it would open, and read as empty
    throw Error(str(path, ": a directory, not a file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot read: ", std::strerror(errno)));
  // Chunk by chunk, not `os << in.rdbuf()`: that swallows a read error (into the ostream's state).
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) text.append(buf, static_cast<size_t>(in.gcount()));
  if (in.bad()) throw Error(str(path, ": read failed: ", std::strerror(errno)));
  return text;
}

}  // namespace twell::io::detail
