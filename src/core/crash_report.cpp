#include "core/crash_report.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define NLP_SANITIZER_OWNS_SIGNALS 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NLP_SANITIZER_OWNS_SIGNALS 1
#endif

namespace nlp {
#if !defined(NLP_SANITIZER_OWNS_SIGNALS)
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

char g_who[160];        // "nlptrain: rank R (host H, pid P)"
char g_short[48];       // "nlptrain: rank R"
volatile sig_atomic_t g_in_report = 0;
alignas(16) char g_alt_stack[64 * 1024];  // the main thread's report still runs after a stack overflow

void set_label(const char* rank) {
  char host[64] = "?";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  std::snprintf(g_who, sizeof g_who, "nlptrain: rank %s (host %s, pid %ld)", rank, host,
                static_cast<long>(::getpid()));
  std::snprintf(g_short, sizeof g_short, "nlptrain: rank %s", rank);
}

// Everything below runs inside the handler: no allocation; snprintf and dladdr are not on POSIX's
// async-signal-safe list but do not allocate for these formats, and the process is dying anyway.
void put(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
  }
  return "signal";
}

const char* code_name(int sig, int code) {
  switch (sig) {
    case SIGSEGV: return code == SEGV_MAPERR ? "address not mapped" : code == SEGV_ACCERR ? "invalid permissions" : "?";
    case SIGBUS: return code == BUS_ADRALN ? "misaligned address" : code == BUS_ADRERR ? "no such physical address"
                                            : code == BUS_OBJERR ? "object error (a truncated mmap'ed file?)" : "?";
    case SIGILL: return code == ILL_ILLOPC ? "illegal opcode (code built for another CPU?)" : "illegal instruction";
    case SIGFPE: return code == FPE_INTDIV ? "integer division by zero" : "arithmetic exception";
  }
  return "?";
}

// "0x7f..: libfoo.so+0x123 (symbol+0x45)" or "0x..: not in any loaded module"; true when in a module
bool describe(uintptr_t addr, char* out, size_t cap) {
  Dl_info info{};
  if (addr == 0 || dladdr(reinterpret_cast<void*>(addr), &info) == 0 || info.dli_fname == nullptr) {
    std::snprintf(out, cap, "0x%lx: not in any loaded module", static_cast<unsigned long>(addr));
    return false;
  }
  const char* slash = std::strrchr(info.dli_fname, '/');
  const char* module = slash ? slash + 1 : info.dli_fname;
  const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  if (info.dli_sname != nullptr)
    std::snprintf(out, cap, "0x%lx: %s+0x%lx (%s+0x%lx)", static_cast<unsigned long>(addr), module,
                  static_cast<unsigned long>(addr - base), info.dli_sname,
                  static_cast<unsigned long>(addr - reinterpret_cast<uintptr_t>(info.dli_saddr)));
  else
    std::snprintf(out, cap, "0x%lx: %s+0x%lx", static_cast<unsigned long>(addr), module,
                  static_cast<unsigned long>(addr - base));
  return true;
}

// The interrupted instruction pointer, and the return address of the call that jumped to it when
// that is the only frame left (x86-64: at the stack pointer right after a call; aarch64: x30).
void registers(void* uctx, uintptr_t* pc, uintptr_t* ret) {
  *pc = 0;
  *ret = 0;
  if (uctx == nullptr) return;
  const auto* uc = static_cast<const ucontext_t*>(uctx);
#if defined(__x86_64__)
  *pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const uintptr_t sp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  if (sp != 0 && sp % sizeof(uintptr_t) == 0) *ret = *reinterpret_cast<const uintptr_t*>(sp);
#elif defined(__aarch64__)
  *pc = static_cast<uintptr_t>(uc->uc_mcontext.pc);
  *ret = static_cast<uintptr_t>(uc->uc_mcontext.regs[30]);
#else
  (void)uc;
#endif
}

extern "C" void on_fatal_signal(int sig, siginfo_t* si, void* uctx) {
  if (g_in_report) {  // a fault inside the report: die at once
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_in_report = 1;
  char line[1024], a[400], b[400];
  if (si != nullptr && si->si_code <= 0)  // kill, raise, abort: si_addr means nothing
    std::snprintf(line, sizeof line, "\n%s: fatal signal %s (sent by pid %ld)\n", g_who, signal_name(sig),
                  static_cast<long>(si->si_pid));
  else
    std::snprintf(line, sizeof line, "\n%s: fatal signal %s (%s) at address 0x%lx\n", g_who, signal_name(sig),
                  code_name(sig, si ? si->si_code : 1),
                  static_cast<unsigned long>(si ? reinterpret_cast<uintptr_t>(si->si_addr) : 0));
  put(line);
  uintptr_t pc = 0, ret = 0;
  registers(uctx, &pc, &ret);
  if (uctx != nullptr) {
    const bool pc_in_module = describe(pc, a, sizeof a);
    // An instruction fetch that faulted (the fault address is the instruction pointer) outside any
    // module: a jump to a bad address. (Code JIT-compiled into anonymous memory, oneDNN's kernels,
    // is outside every module too, but faults there are data accesses.)
    const bool bad_jump = sig == SIGSEGV && si != nullptr && reinterpret_cast<uintptr_t>(si->si_addr) == pc;
    if (bad_jump && !pc_in_module && describe(ret, b, sizeof b)) {
      std::snprintf(line, sizeof line,
                    "%s: instruction pointer %s (a call through a null or stale function pointer); "
                    "the call came from %s\n",
                    g_short, a, b);
    } else {
      std::snprintf(line, sizeof line, "%s: instruction pointer %s\n", g_short, a);
    }
    put(line);
  }
  std::snprintf(line, sizeof line, "%s: backtrace (addr2line -e MODULE OFFSET names the lines):\n", g_short);
  put(line);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    describe(reinterpret_cast<uintptr_t>(frames[i]), a, sizeof a);
    std::snprintf(line, sizeof line, "%s:   #%-2d %s\n", g_short, i, a);
    put(line);
  }
  // Die of the same signal: with SA_RESETHAND the action is the default again, and the signal,
  // blocked while this handler runs, is delivered as it returns (a fault would also recur).
  ::raise(sig);
}

}  // namespace
#endif

bool crash_report_available() {
#if defined(NLP_SANITIZER_OWNS_SIGNALS)
  return false;
#else
  return true;
#endif
}

bool install_crash_report() {
#if defined(NLP_SANITIZER_OWNS_SIGNALS)
  return false;
#else
  // Before MPI_Init the rank is the launcher's: PMIx (srun --mpi=pmix, Open MPI 4+), Open MPI's
  // mpirun, SLURM, or an MPICH-style PMI.
  const char* rank = "?";
  for (const char* var : {"PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') {
      rank = v;
      break;
    }
  }
  set_label(rank);
  // backtrace() loads libgcc_s on its first call (malloc, dlopen): do that now, not in the handler.
  void* warm[2];
  (void)::backtrace(warm, 2);
  stack_t ss{};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = sizeof g_alt_stack;
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  for (int sig : kSignals) ::sigaction(sig, &sa, nullptr);
  return true;
#endif
}

void set_crash_report_rank(int rank) {
#if defined(NLP_SANITIZER_OWNS_SIGNALS)
  (void)rank;
#else
  char text[16];
  std::snprintf(text, sizeof text, "%d", rank);
  set_label(text);
#endif
}

}  // namespace nlp
