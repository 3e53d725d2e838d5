#include "train/signals.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "io/atomic_file.h"

namespace nlp {
namespace {

std::atomic<int> g_signal{0};  // lock-free: safe to store from a signal handler
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<int> g_rank{0};
std::atomic<bool> g_ignore{false};  // the process is ending on an error: signals change nothing
std::mutex g_step_mutex;  // orders a signal's arrival against stop_check()
int64_t g_next_step = 0;  // the step after which a signal now stops the run; 0 = start-up

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

// The launcher (Open MPI's mpirun or orted, PRRTE) when it sent the signal, else "".
std::string launcher_of(const siginfo_t& si) {
  if (si.si_pid <= 0 || si.si_pid != ::getppid()) return "";
  const std::string c = comm_of(si.si_pid);
  if (c != "mpirun" && c != "orterun" && c != "mpiexec" && c != "orted" && c != "prterun" && c != "prted") return "";
  return c;
}

// Who sent it, when it was the launcher: a SIGTERM from it explains itself (the user did not send it).
std::string from_launcher(int sig, const siginfo_t& si) {
  const std::string c = launcher_of(si);
  if (c.empty()) return "";
  std::string s = " from " + c + " (pid " + std::to_string(si.si_pid);
  if (sig == SIGTERM)
    s += "; mpirun ends a job so on Ctrl-C, on SIGTERM or when a rank fails: SIGKILL follows "
         "odls_base_sigkill_timeout seconds later (1 by default), mpirun exits with code 1 and may cut the ranks' "
         "output short (log.txt has it all); kill -USR1 <mpirun pid> stops with a checkpoint and exit code 75";
  return s + ")";
}

void first_signal(int sig, const siginfo_t& si) {
  int64_t next = 0;
  {
    std::lock_guard<std::mutex> lock(g_step_mutex);
    int none = 0;
    g_signal.compare_exchange_strong(none, sig, std::memory_order_relaxed);
    next = g_next_step;
  }
  const std::string what = std::string(name(sig)) + " received" + from_launcher(sig, si);
  if (next <= 0) {
    // Start-up: nothing is computed yet and nothing but whole files (atomic writes) is on disk.
    remove_pending_temporaries();
    if (g_rank.load() == 0)
      say(what + " during start-up: stopping before the first step, no checkpoint written (exit code 75)");
    ::_exit(kExitRequeue);
  }
  if (g_rank.load() == 0)
    say(what + ": the run stops after step " + std::to_string(next) + " with a checkpoint (exit code 75); a "
               "second SIGINT or SIGTERM stops it at once without one");
}

[[noreturn]] void second_signal(int sig) {
  remove_pending_temporaries();
  say(std::string(name(sig)) + " received again: exiting now without a checkpoint (exit code " +
      std::to_string(128 + sig) + "); the newest complete checkpoint is the one to resume from");
  ::_exit(128 + sig);
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void install_stop_handlers() {
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

int stop_signal() { return g_signal.load(std::memory_order_relaxed); }

int stop_check(int64_t next_step) {
  std::lock_guard<std::mutex> lock(g_step_mutex);
  const int sig = g_signal.load(std::memory_order_relaxed);
  if (sig == 0) g_next_step = next_step;
  return sig;
}

}  // namespace nlp
