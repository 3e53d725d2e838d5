// Atomic file replacement (see atomic_file.h).
#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "core/error.h"

namespace nlp {
namespace fs = std::filesystem;
namespace {

void fsync_path(const std::string& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw Error(cat("cannot open '", p, "' to sync it: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on directories; that is not an error for us.
  if (rc != 0 && !(directory && (err == EINVAL || err == ENOTSUP)))
    throw Error(cat("cannot sync '", p, "': ", std::strerror(err)));
}

std::mutex g_pending_mutex;
std::set<std::string> g_pending;  // temporary files in flight

void pending_add(const std::string& p) {
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending.insert(p);
}

void pending_drop(const std::string& p) {
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending.erase(p);
}

std::string parent_dir(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

void atomic_begin(const std::string& path, std::string* tmp_path) {
  if (path.empty()) throw Error("atomic write: empty output path");
  fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec || !fs::is_directory(parent))
      throw Error(cat("cannot create directory '", parent.string(), "' for '", path, "': ",
                      ec ? ec.message() : std::string("not a directory")));
  }
  std::string tmp = cat(path, ".tmp.", static_cast<long long>(::getpid()));
  std::error_code ec;
  fs::remove(tmp, ec);  // a leftover from an earlier process with the same pid
  pending_add(tmp);
  if (tmp_path) *tmp_path = tmp;
}

void remove_pending_temporaries() {
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  for (const auto& p : g_pending) ::unlink(p.c_str());
  g_pending.clear();
}

void atomic_commit(const std::string& tmp_path, const std::string& path) {
  fsync_path(tmp_path, false);
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0)
    throw Error(cat("cannot rename '", tmp_path, "' to '", path, "': ", std::strerror(errno)));
  pending_drop(tmp_path);
  fsync_path(parent_dir(path), true);
}

void atomic_abort(const std::string& tmp_path) {
  std::error_code ec;
  fs::remove(tmp_path, ec);
  pending_drop(tmp_path);
}

void write_text_atomically(const std::string& path, const std::string& text) {
  std::string tmp;
  atomic_begin(path, &tmp);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) {
    atomic_abort(tmp);
    throw Error(cat("cannot write '", path, "': ", std::strerror(err ? err : EIO)));
  }
  try {
    atomic_commit(tmp, path);
  } catch (...) {
    atomic_abort(tmp);
    throw;
  }
}

}  // namespace nlp
