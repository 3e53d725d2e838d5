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

#include "comm/comm.h"

namespace nlp {

class RunLock {
 public:
  // Collective: rank 0 creates `dir` if needed and takes the lock; every rank learns the outcome and
  // throws the same Error when the folder is in use (or the lock cannot be taken).
  static RunLock acquire(Comm& comm, const std::string& dir);
  RunLock(RunLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  ~RunLock();  // releases the lock (rank 0)

  static constexpr const char* kFileName = "nlptrain.lock";

 private:
  explicit RunLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace nlp
