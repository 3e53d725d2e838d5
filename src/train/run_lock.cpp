// The output-folder lock (see run_lock.h).
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/error.h"

namespace nlp {
namespace {

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  if (::lseek(fd, 0, SEEK_SET) < 0) return text;
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  return text;
}

// "host=H\npid=P\nstarted=T\n" -> value of `key`, or "".
std::string field(const std::string& text, const std::string& key) {
  const std::string pre = key + "=";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    if (text.compare(pos, pre.size(), pre) == 0) return text.substr(pos + pre.size(), end - pos - pre.size());
    pos = end + 1;
  }
  return "";
}

// Rank 0: takes the lock; returns the fd, or -1 with the refusal in *why. *created: the folders it
// created (deepest first); *lock_created: the lock file did not exist.
int take(const std::string& dir, std::string* why, std::vector<std::string>* created, bool* lock_created) {
  std::error_code ec;
  for (std::filesystem::path p = std::filesystem::absolute(dir, ec).lexically_normal(); !ec && !p.empty();
       p = p.parent_path()) {
    if (p.filename().empty()) p = p.parent_path();  // "a/b/" -> "a/b"
    if (std::filesystem::exists(p, ec) || ec) break;
    created->push_back(p.string());
    if (p == p.parent_path()) break;
  }
  ec.clear();
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *why = cat("output.dir: cannot create directory '", dir, "': ", ec.message());
    return -1;
  }
  const std::string path = dir + "/" + RunLock::kFileName;
  *lock_created = !std::filesystem::exists(path, ec);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    *why = err == EACCES || err == EROFS || err == EPERM
               ? cat("output.dir = '", dir, "' is not writable: cannot create the lock file '", path,
                     "': ", std::strerror(err))
               : cat("output.dir: cannot open the lock file '", path, "': ", std::strerror(err));
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      *why = cat("output.dir: cannot lock '", path, "': ", std::strerror(err));
      ::close(fd);
      return -1;
    }
    // The holder writes its host and pid right after taking the lock: give it a moment.
    std::string text = read_all(fd);
    for (int i = 0; i < 20 && field(text, "pid").empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      text = read_all(fd);
    }
    ::close(fd);
    const std::string host = field(text, "host"), pid = field(text, "pid"), started = field(text, "started");
    *why = cat("output.dir '", dir, "' is in use by another nlptrain run (host ",
               host.empty() ? "unknown" : host, ", pid ", pid.empty() ? "unknown" : pid,
               started.empty() ? "" : cat(", started ", started), "; it holds the lock on '", path,
               "'): wait for that run to end, or choose another output.dir");
    return -1;
  }
  const std::string text = cat("host=", hostname(), "\npid=", static_cast<long long>(::getpid()),
                               "\nstarted=", utc_now(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    *why = cat("output.dir: cannot write the lock file '", path, "': ", std::strerror(errno));
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

RunLock RunLock::acquire(Comm& comm, const std::string& dir) {
  std::string why;
  int fd = -1;
  std::vector<std::string> created;
  bool lock_created = false;
  if (comm.rank() == 0) fd = take(dir, &why, &created, &lock_created);
  uint64_t n = why.size();
  comm.broadcast_host(&n, sizeof n, 0);
  why.resize(n);
  if (n > 0) comm.broadcast_host(why.data(), n, 0);
  if (!why.empty()) throw Error(why);
  return RunLock(fd, dir, std::move(created), lock_created);
}

void RunLock::leave_as_found() noexcept {
  if (fd_ < 0) return;
  std::error_code ec;
  bool only_lock = lock_created_;
  for (auto it = std::filesystem::directory_iterator(dir_, ec); only_lock && !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    only_lock = it->path().filename() == kFileName;
  if (ec) only_lock = false;
  if (only_lock) ::unlink((dir_ + "/" + kFileName).c_str());
  ::close(fd_);
  fd_ = -1;
  if (!only_lock) return;
  for (const std::string& d : created_)  // deepest first; each only when empty
    if (::rmdir(d.c_str()) != 0) break;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace nlp
