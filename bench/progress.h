// Progress of a counted loop on a benchmark's progress stream: redrawn in place ("\r") when the
// stream is a terminal, at most ten times a second (a loop of thousands of steps a second does not
// wait on the terminal); into a file or pipe, one line at each tenth of the way, so that logs stay
// readable.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>

namespace twell::bench {

inline bool is_terminal(const std::ostream& s) {
  if (&s == &std::cerr || &s == &std::clog) return isatty(STDERR_FILENO);
  if (&s == &std::cout) return isatty(STDOUT_FILENO);
  return false;
}

class StepProgress {
 public:
  StepProgress(std::ostream& out, std::string label, int64_t total)
      : StepProgress(out, std::move(label), total, is_terminal(out)) {}
  // `live`: redraw in place whatever `out` is (tests).
  StepProgress(std::ostream& out, std::string label, int64_t total, bool live)
      : out_(out), label_(std::move(label)), total_(total), live_(live) {}

  // Step `done` of total (1-based) has finished: "<label><done>/<total>".
  void step(int64_t done) { show(done, label_ + std::to_string(done) + "/" + std::to_string(total_)); }
  // The same, with a line of the caller's own.
  void show(int64_t done, const std::string& line) {
    if (live_) {
      const auto now = std::chrono::steady_clock::now();
      if (done != total_ && now - drawn_ < std::chrono::milliseconds(100)) {
        skipped_ = line;  // drawn by finish() if no later one is
        return;
      }
      drawn_ = now;
      skipped_.clear();
      open_ = true;
      out_ << "\r" << line << "\x1b[K" << std::flush;  // erase what a longer line left after it
    } else if (done == total_ || (10 * done) / total_ != (10 * (done - 1)) / total_) {
      out_ << line << "\n" << std::flush;
    }
  }
  // Ends the redrawn line (a terminal's): call once after the last step, before other output.
  void finish() {
    if (!live_) return;
    if (!skipped_.empty()) out_ << "\r" << skipped_ << "\x1b[K";
    out_ << "\n" << std::flush;
    open_ = false;
    skipped_.clear();
  }
  // A run that stops early (an error on its way up) leaves no half-drawn line for the next output to
  // join.
  ~StepProgress() {
    if (open_) out_ << "\n" << std::flush;
  }
  StepProgress(const StepProgress&) = delete;
  StepProgress& operator=(const StepProgress&) = delete;

 private:
  std::ostream& out_;
  std::string label_;
  int64_t total_;
  bool live_;
  std::chrono::steady_clock::time_point drawn_{};  // the last redraw (live)
  std::string skipped_;                            // a line not drawn since (live)
  bool open_ = false;                              // a line drawn and not yet ended (live)
};

}  // namespace twell::bench
