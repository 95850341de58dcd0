// UTF-8 one code point at a time, for the tokenizer and the chat templates. A byte that does not start
// valid UTF-8 (a stray continuation byte, an overlong or truncated sequence, a surrogate) counts as
// one code point of its own, kInvalid, so that any byte string can be walked (and put back byte for byte).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace twell::utf8 {

constexpr uint32_t kInvalid = 0xFFFFFFFF;

// One code point of a string: its value, where it starts and how many bytes it takes.
struct CodePoint {
  uint32_t cp;
  size_t pos;
  size_t len;
};

// The bytes of the UTF-8 sequence a byte starts: 1 (ASCII), 2, 3 or 4; 0 where it starts none (a
// continuation byte, or 0xF8 and above).
inline size_t sequence_length(unsigned char c) {
  return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
}

inline CodePoint decode(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(pos);
  const size_t len = sequence_length(c);
  if (len == 1) return {c, pos, 1};
  if (len == 0) return {kInvalid, pos, 1};
  constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};  // the shortest form's smallest code point
  uint32_t cp = c & (0x7Fu >> len);
  if (pos + len > s.size()) return {kInvalid, pos, 1};
  for (size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return {kInvalid, pos, 1};
    cp = (cp << 6) | (byte(pos + i) & 0x3F);
  }
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalid, pos, 1};
  return {cp, pos, len};
}

inline std::vector<CodePoint> code_points(std::string_view s) {
  std::vector<CodePoint> cps;
  for (size_t pos = 0; pos < s.size();) {
    cps.push_back(decode(s, pos));
    pos += cps.back().len;
  }
  return cps;
}

inline void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace twell::utf8
