#include "train/signals.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "io/atomic_file.h"

namespace nlp {
namespace {

std::atomic<int> g_signal{0};  // lock-free: safe to store from a signal handler
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<int> g_rank{0};
std::atomic<bool> g_abandoned{false};  // the launcher's SIGTERM came: stdout is read no more
std::atomic<bool> g_ignore{false};  // the process is ending on an error: signals change nothing
std::mutex g_step_mutex;  // orders a signal's arrival against stop_check()
int64_t g_next_step = 0;  // the step after which a signal now stops the run; 0 = start-up
// What a report says of the step in progress (guarded by g_step_mutex).
std::chrono::steady_clock::time_point g_step_began{};  // the last stop_check(): the step's start
double g_step_s = 0;   // the last step's time (0 = none yet)
double g_ckpt_s = -1;  // the last checkpoint's write time (-1 = none yet)
std::string g_ckpt_path;  // the newest checkpoint ("" = none) and its step
int64_t g_ckpt_step = 0;
std::function<void(const std::string&)> g_log;  // rank 0's log.txt
int g_sigkill_timeout = 1;  // Open MPI's odls_base_sigkill_timeout, read at install_stop_handlers()

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

const char* name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "signal";
}

// The command name of a process ("" when unknown).
std::string comm_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string s;
  std::getline(in, s);
  return s;
}

void say(const std::string& text) {
  const std::string line = "nlptrain: " + text + "\n";
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

// Rank 0: on stderr and, once the trainer has set it, in log.txt.
void report(const std::string& text) {
  if (g_rank.load() != 0) return;
  say(text);
  std::lock_guard<std::mutex> lock(g_step_mutex);  // held: the trainer clears g_log before its Log ends
  if (g_log) g_log("signal: " + text);
}

std::string seconds(double s) {
  char buf[32];
  if (s < 0.1) std::snprintf(buf, sizeof buf, "%.0f ms", 1e3 * s);
  else std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

// An integer value of key in an Open MPI mca-params.conf file (`key = value` lines), else -1.
int param_in_file(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  int found = -1;
  while (std::getline(in, line)) {
    const size_t k = line.find_first_not_of(" \t");
    if (k == std::string::npos || line[k] == '#' || line.compare(k, key.size(), key) != 0) continue;
    size_t eq = line.find_first_not_of(" \t", k + key.size());
    if (eq == std::string::npos || line[eq] != '=') continue;
    char* end = nullptr;
    const long v = std::strtol(line.c_str() + eq + 1, &end, 10);
    if (end != line.c_str() + eq + 1 && v >= 0) found = static_cast<int>(v);
  }
  return found;
}

// The launcher (Open MPI's mpirun or orted, PRRTE) when it sent the signal, else "".
std::string launcher_of(const siginfo_t& si) {
  if (si.si_pid <= 0 || si.si_pid != ::getppid()) return "";
  const std::string c = comm_of(si.si_pid);
  if (c != "mpirun" && c != "orterun" && c != "mpiexec" && c != "orted" && c != "prterun" && c != "prted") return "";
  return c;
}

// Under SLURM (srun, or mpirun inside a job): its KillWait, the time between its SIGTERM and its
// SIGKILL, is not in the ranks' environment.
bool under_slurm() { return std::getenv("SLURM_JOB_ID") != nullptr || std::getenv("SLURM_STEP_ID") != nullptr; }

// The report of the first signal during the steps: what will happen to step `next`, the step in
// progress, given who sent the signal. Called with g_step_mutex held.
std::string first_report(int sig, const siginfo_t& si, int64_t next) {
  const std::string n = std::to_string(next);
  const std::string c = launcher_of(si);
  const std::string second = "; a second SIGINT or SIGTERM stops it at once without one";
  const std::string who = std::string(name(sig)) + " received";
  if (sig == SIGTERM && !c.empty()) {
    // Open MPI's launcher ends the job (Ctrl-C or SIGTERM to mpirun, or a failed rank): SIGKILL
    // follows in odls_base_sigkill_timeout seconds, and mpirun exits with 1 whatever the ranks return.
    const int d = g_sigkill_timeout;
    std::string s = who + " from " + c + " (pid " + std::to_string(si.si_pid) + "), which ends the job: it kills " +
                    "the ranks " + std::to_string(d) + " s from now (odls_base_sigkill_timeout) and exits with code 1; ";
    const double ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_step_began).count();
    const double left = std::max(0.0, g_step_s - ran) + std::max(0.0, g_ckpt_s);
    const std::string times = "a step takes " + seconds(g_step_s) +
                              (g_ckpt_s >= 0 ? ", a checkpoint " + seconds(g_ckpt_s) : std::string(", no checkpoint timed yet"));
    if (g_step_s <= 0) {
      s += "the time of a step is not known yet (step " + n + " is the first here): the run stops after step " + n +
           " with a checkpoint (exit code 75) only if that step and the checkpoint's write end before the kill";
    } else if (left < d) {
      s += "step " + n + " should end and its checkpoint be written in " + seconds(left) + " (" + times +
           "): the run stops after step " + n + " with a checkpoint (exit code 75) if they end before the kill";
    } else {
      s += "step " + n + " needs about " + seconds(left) + " more (" + times +
           "), longer than that: the ranks will most likely be killed before it ends, without a checkpoint of it; " +
           (g_ckpt_path.empty() ? std::string("no checkpoint of this run is written yet")
                                : "the newest checkpoint is '" + g_ckpt_path + "' (step " + std::to_string(g_ckpt_step) + ")");
    }
    return s + second + ". tools/nlprun (or kill -USR1 <mpirun pid>) stops a run with a checkpoint and no kill";
  }
  if (sig != SIGUSR1 && under_slurm())
    return who + ": the run stops after step " + n +
           ", with a checkpoint if the step ends before the launcher kills the ranks (exit code 75)" + second;
  return who + ": the run stops after step " + n + " with a checkpoint (exit code 75)" + second;
}

void first_signal(int sig, const siginfo_t& si) {
  int64_t next = 0;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(g_step_mutex);
    int none = 0;
    g_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
    next = g_next_step;
    if (next > 0) text = first_report(sig, si, next);
  }
  if (sig == SIGTERM && !launcher_of(si).empty()) {
    // mpirun ending the job may read the ranks' output no more (measured: a log line every step
    // stopped coming out at the Ctrl-C): a rank writing a line would wait on the full pipe until the
    // SIGKILL instead of ending its step and writing its checkpoint. From now on such lines are
    // dropped (log.txt has them all).
    g_abandoned.store(true);
    for (int fd : {1, 2}) {
      const int fl = ::fcntl(fd, F_GETFL);
      if (fl >= 0) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
  }
  if (next <= 0) {
    // Start-up: nothing is computed yet and nothing but whole files (atomic writes) is on disk.
    remove_pending_temporaries();
    const std::string c = launcher_of(si);
    report(std::string(name(sig)) + " received" + (c.empty() ? "" : " from " + c + " (pid " + std::to_string(si.si_pid) + ")") +
           " during start-up: stopping before the first step, no checkpoint written (exit code 75)");
    ::_exit(kExitRequeue);
  }
  report(text);
}

[[noreturn]] void second_signal(int sig) {
  remove_pending_temporaries();
  const std::string text = std::string(name(sig)) + " received again: exiting now without a checkpoint (exit code " +
                           std::to_string(128 + sig) + "); the newest complete checkpoint is the one to resume from";
  if (g_rank.load() == 0) report(text);
  else say(text);
  ::_exit(128 + sig);
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int ompi_sigkill_timeout() {
  // mpirun exports the value given in its environment or on its command line; otherwise one of its
  // parameter files may set it (the user's, then the installation's), else Open MPI's default.
  if (const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout")) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= 0) return static_cast<int>(n);
  }
  const std::string key = "odls_base_sigkill_timeout";
  if (const char* home = std::getenv("HOME")) {
    const int v = param_in_file(std::string(home) + "/.openmpi/mca-params.conf", key);
    if (v >= 0) return v;
  }
  for (const char* f : {"/etc/openmpi/openmpi-mca-params.conf", "/usr/local/etc/openmpi-mca-params.conf"}) {
    const int v = param_in_file(f, key);
    if (v >= 0) return v;
  }
  return 1;
}

void install_stop_handlers() {
  g_sigkill_timeout = ompi_sigkill_timeout();
  // The handler serves any thread started before block_stop_signals() (a library may start one
  // when it loads); none of nlptrain's computing threads runs it.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  block_stop_signals();
  // Every other thread blocks them; this one takes them.
  std::thread([] {
    const sigset_t set = stop_set();
    int taken = 0;
    for (;;) {
      siginfo_t si{};
      const int sig = sigwaitinfo(&set, &si);
      if (sig <= 0 || g_ignore.load()) continue;
      // A second SIGINT or SIGTERM (another Ctrl-C, kill) ends the process now. Not a repeated
      // SIGUSR1 (the jobscripts re-send it every NLP_RESIGNAL_S seconds until the ranks have
      // stopped), nor a SIGTERM from Open MPI's launcher (sent to the rank's process group, possibly
      // more than once before its SIGKILL): those repeat the first.
      const bool repeat = sig == SIGUSR1 || (sig == SIGTERM && !launcher_of(si).empty());
      if (taken++ == 0 && g_signal.load(std::memory_order_relaxed) == 0) first_signal(sig, si);
      else if (!repeat) second_signal(sig);
    }
  }).detach();
}

void set_stop_rank(int rank) { g_rank.store(rank); }

void ignore_stop_signals() { g_ignore.store(true); }

bool stop_output_abandoned() { return g_abandoned.load(std::memory_order_relaxed); }

int stop_signal() { return g_signal.load(std::memory_order_relaxed); }

int stop_check(int64_t next_step) {
  std::lock_guard<std::mutex> lock(g_step_mutex);
  const int sig = g_signal.load(std::memory_order_relaxed);
  if (sig == 0) {
    g_next_step = next_step;
    g_step_began = std::chrono::steady_clock::now();
  }
  return sig;
}

void stop_note_step(double seconds) {
  std::lock_guard<std::mutex> lock(g_step_mutex);
  g_step_s = seconds;
}

void stop_note_checkpoint(const std::string& path, int64_t step, double seconds) {
  std::lock_guard<std::mutex> lock(g_step_mutex);
  g_ckpt_path = path;
  g_ckpt_step = step;
  g_ckpt_s = seconds;
}

void set_stop_log(std::function<void(const std::string&)> fn) {
  std::lock_guard<std::mutex> lock(g_step_mutex);
  g_log = std::move(fn);
}

bool stop_file_exists(const std::string& output_dir) {
  struct stat st {};
  return ::stat((output_dir + "/" + kStopFileName).c_str(), &st) == 0;
}

void remove_stop_file(const std::string& output_dir) {
  ::unlink((output_dir + "/" + kStopFileName).c_str());
}

}  // namespace nlp
