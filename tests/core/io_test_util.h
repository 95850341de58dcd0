// Helpers for the checkpoint/config I/O tests: a per-test scratch directory and error matchers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <cstdint>
#include <string>

#include "twell/error.h"

namespace twell::test {

// A fresh directory per test under testing::TempDir(), removed afterwards.
class ScratchDirTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = testing::TempDir() + "/twell_" + info->test_suite_name() + "_" + info->name() + "_" +
           std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Names of the files in the scratch directory.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    return names;
  }

  std::string dir_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// Rewrites the header of safetensors file `path`, every `"dtype":"<from>"` becoming `"dtype":"<to>"`
// (a dtype twell cannot write, such as F8_E4M3 or BOOL, in place of one of the same element size);
// the data section is kept as it is.
inline void retype(const std::string& path, const std::string& from, const std::string& to) {
  const std::string bytes = read_file(path);
  ASSERT_GE(bytes.size(), 8u) << path;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  ASSERT_LE(8 + n, bytes.size()) << path;
  std::string header = bytes.substr(8, n);
  const std::string old_text = "\"dtype\":\"" + from + "\"", new_text = "\"dtype\":\"" + to + "\"";
  size_t count = 0;
  for (size_t at = header.find(old_text); at != std::string::npos; at = header.find(old_text, at + new_text.size())) {
    header.replace(at, old_text.size(), new_text);
    ++count;
  }
  ASSERT_GT(count, 0u) << path << " has no " << old_text;
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  write_file(path, out + header + bytes.substr(8 + n));
}

// Runs `fn`, expects a twell::Error whose message is one line and contains every fragment.
inline void expect_error(const std::function<void()>& fn,
                         std::initializer_list<std::string> fragments) {
  try {
    fn();
  } catch (const twell::Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message spans lines: " << message;
    for (const std::string& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' missing from: " << message;
    return;
  }
  ADD_FAILURE() << "expected a twell::Error";
}

}  // namespace twell::test
