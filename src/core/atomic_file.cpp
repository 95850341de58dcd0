// Atomic file replacement: temp file in the target directory + fsync + rename (atomic_file.h).
#include "atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "json_util.h"
#include "twell/error.h"

namespace twell::io::detail {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

constexpr mode_t kNewFile = ~mode_t{0};  // target_of's mode for a file that does not exist yet

// The file a write to `path` must replace (atomic_file.h), and in *mode the permissions it has.
// Renaming over a link would replace the link, not the file; renaming over /dev/null or a FIFO
// would replace it with a plain file.
std::string target_of(const std::string& path, mode_t* mode) {
  *mode = kNewFile;
  struct stat link;
  if (::lstat(path.c_str(), &link) != 0) return path;  // a new file
  struct stat st = link;
  std::string target = path;
  if (S_ISLNK(link.st_mode)) {
    if (::stat(path.c_str(), &st) != 0)
      throw Error(str(path, ": a symbolic link to nothing that exists (", errno_text(), "); name a file to write"));
    if (!S_ISREG(st.st_mode))
      throw Error(str(path, ": a link to what is not a regular file (a directory, device, FIFO, socket or pipe)"));
    if (link.st_uid != ::geteuid())
      throw Error(str(path, ": a symbolic link owned by another user; write to the file it names instead"));
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (!resolved) throw Error(str(path, ": cannot resolve the symbolic link: ", errno_text()));
    target = resolved;
    std::free(resolved);
  }
  if (!S_ISREG(st.st_mode))
    throw Error(str(path, ": not a regular file (a directory, device, FIFO, socket or pipe); name a file to write"));
  *mode = st.st_mode & 07777;
  return target;
}

// The temporaries being written, for remove_temporaries_on_signals: a slot each, its path copied in,
// read by a signal handler (so no locks and no allocation there; a slot's state is atomic).
struct TempSlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 holds a temporary's path
  char path[4096] = {};
};
TempSlot temp_slots[16];

int claim_slot(const std::string& temp) {
  if (temp.size() >= sizeof(TempSlot::path)) return -1;
  for (int i = 0; i < 16; ++i) {
    int free = 0;
    if (!temp_slots[i].state.compare_exchange_strong(free, 1)) continue;
    std::memcpy(temp_slots[i].path, temp.c_str(), temp.size() + 1);
    temp_slots[i].state.store(2);
    return i;
  }
  return -1;  // more writers at once than slots: that one's temporary is not removed on a signal
}

void release_slot(int slot) {
  if (slot >= 0) temp_slots[slot].state.store(0);
}

extern "C" void remove_temporaries_and_reraise(int sig) {
  for (TempSlot& t : temp_slots)
    if (t.state.load() == 2) ::unlink(t.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void remove_temporaries_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction now = {};
    if (::sigaction(sig, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) continue;  // ignored, or the program's
    struct sigaction act = {};
    act.sa_handler = remove_temporaries_and_reraise;
    sigemptyset(&act.sa_mask);
    ::sigaction(sig, &act, nullptr);
  }
}

AtomicFile::AtomicFile(std::string path) {
  mode_t mode = kNewFile;  // a new file is created with 0644 less the umask
  path_ = target_of(path, &mode);
  // The temporary's name is this writer's alone: the pid, a per-process count and a random number,
  // so that two writers of one path (threads, or processes that share a pid across containers) never
  // write into each other's temporary. O_EXCL | O_NOFOLLOW: never through a link planted at its
  // name; a name taken (by a crashed writer's leftover, say) is never removed, another is drawn.
  static std::atomic<uint64_t> count{0};
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temp_path_ =
        str(path_, ".tmp.", ::getpid(), ".", count.fetch_add(1), ".", std::hex, std::random_device{}() & 0xffff);
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0 && (errno == ENOENT || errno == ENOTDIR)) {
    // Said so only where the directory is really missing (/proc, say, answers ENOENT for a new file).
    const int why = errno;
    struct stat st;
    if (::stat(parent_dir(path_).c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw Error(str(path_, ": cannot write it: its directory does not exist"));
    errno = why;
  }
  if (fd_ < 0)
    throw Error(str(path_, ": cannot create temporary file '", temp_path_, "': ", errno_text()));
  slot_ = claim_slot(temp_path_);
  if (mode != kNewFile && ::fchmod(fd_, mode) != 0) {  // a replaced file keeps its permissions
    const std::string why = errno_text();
    ::close(fd_);  // no destructor runs for a constructor that throws
    ::unlink(temp_path_.c_str());
    release_slot(slot_);
    throw Error(str(path_, ": cannot set the permissions of '", temp_path_, "': ", why));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
  release_slot(slot_);
}

void AtomicFile::write(const void* data, size_t size) {
  TWELL_CHECK(fd_ >= 0 && !committed_, path_, ": write after sync or commit");
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    // Linux writes at most ~2 GiB per call; loop over partial writes and EINTR.
    ssize_t n = ::write(fd_, p, size < (size_t{1} << 30) ? size : (size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(str(path_, ": write to '", temp_path_, "' failed: ", errno_text()));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::sync() {
  TWELL_CHECK(fd_ >= 0 && !committed_, path_, ": sync after sync or commit");
  if (::fsync(fd_) != 0)
    throw Error(str(path_, ": fsync of '", temp_path_, "' failed: ", errno_text()));
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw Error(str(path_, ": close of '", temp_path_, "' failed: ", errno_text()));
}

void AtomicFile::commit() {
  TWELL_CHECK(!committed_, path_, ": commit called twice");
  if (fd_ >= 0) sync();
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    throw Error(str(path_, ": cannot rename '", temp_path_, "' over it: ", errno_text()));
  committed_ = true;
  release_slot(std::exchange(slot_, -1));  // no temporary left to remove
  // Make the rename itself durable. A failure here cannot be undone and the data is in place,
  // so it is not an error.
  sync_directory(parent_dir(path_));
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace twell::io::detail
