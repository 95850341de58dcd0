// AtomicFile: writes a file so that readers see either the old contents or the complete new
// contents, never a torn file. Bytes go to `<target>.tmp.<pid>` beside the target; commit() fsyncs
// it, renames it over the target and fsyncs the directory. The target is `path`, or, where `path`
// is a symbolic link of our own, the file it names (the link stays; another user's link is
// refused: following it would let them choose what we overwrite). A replaced file keeps its
// permissions. A path that is not a regular file (a device such as /dev/null, a FIFO, a pipe
// behind /dev/stdout) is refused. Destroying an uncommitted AtomicFile (an exception on the way)
// removes the temporary and leaves the target untouched. Used by every writer in src/core
// (safetensors, config.json) and by the benchmarks' --json.
#pragma once

#include <cstddef>
#include <string>

namespace twell::io::detail {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates the temporary file; throws twell::Error
  ~AtomicFile();                          // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);  // all bytes or throws
  void sync();                                // the bytes on disk (fsync), no more writes; or throws
  void commit();                              // sync where not done + rename + directory fsync, or throws

  const std::string& temp_path() const { return temp_path_; }

 private:
  std::string path_;  // the target
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  int slot_ = -1;  // where a signal handler finds the temporary (remove_temporaries_on_signals)
};

// fsyncs the directory `dir`, so that entries made or renamed in it last through a crash; best effort
// (nothing to undo where it fails).
void sync_directory(const std::string& dir);

// Writes `text` to `path` atomically.
void write_file_atomically(const std::string& path, const std::string& text);

// For a program (the CLI), not a library's host: SIGINT, SIGTERM and SIGHUP remove every AtomicFile's
// uncommitted temporary before the signal ends the process as it would have (a Ctrl-C during
// `bench model --save` left gigabytes of temporary beside the model, never removed). Signals whose
// handler the program set already are left to it. Call once, early.
void remove_temporaries_on_signals();

}  // namespace twell::io::detail
