// Strict JSON parsing and message helpers (json_util.h).
#include "json_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <unordered_set>
#include <vector>

#include "twell/error.h"

namespace twell::io::detail {

namespace {

// The checks nlohmann's parser does not make, as a SAX pass: duplicate keys and the depth. (nlohmann's
// parse callback would do them too, but its DOM builder then rescans an object's members after each
// child object: a header of many tensors took time quadratic in their count.)
class StrictChecker : public nlohmann::json_sax<nlohmann::json> {
 public:
  StrictChecker(const std::string& source, const char* what, int max_depth)
      : source_(source), what_(what), max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open(true);
    return true;
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second)
      throw Error(str(source_, ": ", what_, " has the key '", printable(k), "' twice"));
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    open(false);
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    reason_ = e.what();
    return false;
  }
  const std::string& reason() const { return reason_; }

 private:
  void open(bool object) {
    if (++depth_ > max_depth_) throw Error(str(source_, ": ", what_, " nests deeper than ", max_depth_, " levels"));
    if (object) keys_.emplace_back();
  }
  const std::string& source_;
  const char* what_;
  int max_depth_, depth_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;  // of each open object
  std::string reason_;
};

}  // namespace

nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& source,
                                 const char* what, int max_depth) {
  StrictChecker checker(source, what, max_depth);
  std::string reason;
  // nlohmann's lexer takes a NUL byte for the input's end and would ignore what follows; JSON has no raw NUL.
  if (const void* nul = std::memchr(begin, '\0', static_cast<size_t>(end - begin)))
    throw Error(str(source, ": ", what, " is not valid JSON: a NUL byte at offset ",
                    static_cast<const char*>(nul) - begin));
  try {
    if (nlohmann::json::sax_parse(begin, end, &checker)) return nlohmann::json::parse(begin, end);
    reason = checker.reason();
  } catch (const nlohmann::json::exception& e) {
    reason = e.what();
  }
  // Drop nlohmann's "[json.exception.parse_error.101] " prefix.
  if (!reason.empty() && reason[0] == '[') {
    size_t close = reason.find("] ");
    if (close != std::string::npos) reason = reason.substr(close + 2);
  }
  throw Error(str(source, ": ", what, " is not valid JSON: ", printable(reason, 300)));
}

std::string dangling_link(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode) || ::stat(path.c_str(), &st) == 0) return "";
  std::string target(4096, '\0');
  const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
  target.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return str(path, " is a symbolic link to ", printable(target), ", which does not exist");
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
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))  // it would open, and read as empty
      throw Error(str(path, ": a directory, not a file"));
    if (!S_ISREG(st.st_mode))  // a FIFO would block, /dev/zero never end
      throw Error(str(path, ": not a regular file (a FIFO, socket or device)"));
    if (st.st_size > (off_t{1} << 30))
      throw Error(str(path, ": ", st.st_size, " bytes, more than the 1 GiB a JSON file of a model is taken to hold"));
  } else if (std::string link = dangling_link(path); !link.empty()) {
    throw Error(str("cannot read: ", link));
  }
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
