// One run per output folder: rank 0 holds an exclusive flock(2) on <output.dir>/nlptrain.lock for
// the whole run and writes its host, pid and start time into the file. A second run on the same
// folder is refused before it writes anything there, with a message naming the holder's host and pid,
// on every rank (the caller's error path aborts the communicator). The kernel releases the lock when
// the holder's process ends, however it ends (kill -9 included), so a dead run's lock is no obstacle;
// the stale text left in the file is informational only. flock works on local file systems and on
// NFS (Linux maps it to a POSIX lock there); file systems without locking make acquire() fail with
// the system's reason.
#pragma once
#include <string>
#include <vector>

#include "comm/comm.h"

namespace nlp {

class RunLock {
 public:
  // Collective: rank 0 creates `dir` if needed and takes the lock; every rank learns the outcome and
  // throws the same Error when the folder is in use (or the lock cannot be taken).
  static RunLock acquire(Comm& comm, const std::string& dir);
  RunLock(RunLock&& o) noexcept
      : fd_(o.fd_), dir_(std::move(o.dir_)), created_(std::move(o.created_)), lock_created_(o.lock_created_) {
    o.fd_ = -1;
  }
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  ~RunLock();  // releases the lock (rank 0)

  // An error ended the run: a folder that holds nothing but the lock file this run created is left
  // as it was found (rank 0; every other rank: nothing): the lock file is removed, and the folder
  // with the parents acquire() created, when it created them. A folder the run wrote into, or one
  // that held the lock file already, is left as it is. Releases the lock.
  void leave_as_found() noexcept;

  static constexpr const char* kFileName = "nlptrain.lock";

 private:
  RunLock(int fd, std::string dir, std::vector<std::string> created, bool lock_created)
      : fd_(fd), dir_(std::move(dir)), created_(std::move(created)), lock_created_(lock_created) {}
  int fd_ = -1;
  std::string dir_;
  std::vector<std::string> created_;  // folders acquire() created, deepest first (rank 0)
  bool lock_created_ = false;         // the lock file did not exist before (rank 0)
};

}  // namespace nlp
