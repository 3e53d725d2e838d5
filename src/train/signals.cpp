#include "train/signals.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace nlp {
namespace {

std::atomic<int> g_signal{0};  // lock-free: safe to store from a signal handler
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
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
  block_stop_signals();
  // Every other thread blocks them; this one takes them.
  std::thread([] {
    const sigset_t set = stop_set();
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) g_signal.store(sig, std::memory_order_relaxed);
    }
  }).detach();
}

int stop_signal() { return g_signal.load(std::memory_order_relaxed); }

}  // namespace nlp
