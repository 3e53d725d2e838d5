// The fatal-signal report (core/crash_report.h): each case crashes a forked child with the report
// installed and reads what it printed on stderr. The addresses it names are checked against the
// functions that crashed, so a report that names the wrong frame fails.
#include "core/crash_report.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <regex>
#include <string>

namespace {

struct Death {
  int signal = 0;  // the signal the child died of (0: it exited)
  std::string err;
};

// Runs f in a child (no core file) and returns how it died and its stderr.
template <class F>
Death crash_in_child(F f) {
  int p[2];
  if (::pipe(p) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::dup2(p[1], STDERR_FILENO);
    struct rlimit none {0, 0};
    ::setrlimit(RLIMIT_CORE, &none);
    f();
    ::_exit(0);
  }
  ::close(p[1]);
  Death d;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) d.err.append(buf, size_t(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) d.signal = WTERMSIG(status);
  return d;
}

// The address printed after `label` ("... label 0x1234..."), 0 when absent.
uintptr_t address_after(const std::string& text, const std::string& label) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(label + " 0x([0-9a-f]+)"))) return 0;
  return static_cast<uintptr_t>(std::stoull(m[1].str(), nullptr, 16));
}

bool within(uintptr_t addr, const void* fn, uintptr_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(fn);
  return addr >= start && addr < start + bytes;
}

using Fn = int (*)();
Fn volatile g_null_fn = nullptr;
int volatile* volatile g_bad_ptr = reinterpret_cast<int*>(uintptr_t(0x10));

// A call through a null function pointer (not a tail call: its result is used).
__attribute__((noinline)) int call_through_null() { return g_null_fn() + 1; }
// A read of an unmapped address.
__attribute__((noinline)) int read_bad_address() { return *g_bad_ptr + 1; }

#define SKIP_WITHOUT_REPORT()                                                                        \
  if (!nlp::crash_report_available())                                                                \
  GTEST_SKIP() << "sanitizer build: AddressSanitizer/ThreadSanitizer own the fatal signals and "     \
                  "report them; nlptrain's report is not installed"

TEST(CrashReport, NullCallNamesTheCaller) {
  SKIP_WITHOUT_REPORT();
  const Death d = crash_in_child([] {
    nlp::install_crash_report();
    nlp::set_crash_report_rank(7);
    (void)call_through_null();
  });
  EXPECT_EQ(d.signal, SIGSEGV) << d.err;
  EXPECT_NE(d.err.find("nlptrain: rank 7 (host "), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("fatal signal SIGSEGV (address not mapped) at address 0x0\n"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("a call through a null or stale function pointer"), std::string::npos) << d.err;
  // The return address of the call instruction, inside call_through_null, and its module.
  const uintptr_t from = address_after(d.err, "the call came from");
  EXPECT_TRUE(within(from, reinterpret_cast<const void*>(&call_through_null), 256))
      << "return address 0x" << std::hex << from << " not in call_through_null at "
      << reinterpret_cast<const void*>(&call_through_null) << "\n" << d.err;
  EXPECT_TRUE(std::regex_search(d.err, std::regex("the call came from 0x[0-9a-f]+: test_crash_report\\+0x")))
      << d.err;
}

TEST(CrashReport, BadReadNamesTheFaultingInstruction) {
  SKIP_WITHOUT_REPORT();
  const Death d = crash_in_child([] {
    nlp::install_crash_report();
    nlp::set_crash_report_rank(0);
    (void)read_bad_address();
  });
  EXPECT_EQ(d.signal, SIGSEGV) << d.err;
  EXPECT_NE(d.err.find("fatal signal SIGSEGV (address not mapped) at address 0x10\n"), std::string::npos) << d.err;
  const uintptr_t pc = address_after(d.err, "instruction pointer");
  EXPECT_TRUE(within(pc, reinterpret_cast<const void*>(&read_bad_address), 256))
      << "pc 0x" << std::hex << pc << " not in read_bad_address\n" << d.err;
  EXPECT_EQ(d.err.find("function pointer"), std::string::npos) << "a data fault is not a bad call\n" << d.err;
}

TEST(CrashReport, AbortPrintsTheFramesAndDiesOfSigabrt) {
  SKIP_WITHOUT_REPORT();
  const Death d = crash_in_child([] {
    nlp::install_crash_report();
    nlp::set_crash_report_rank(3);
    std::abort();
  });
  EXPECT_EQ(d.signal, SIGABRT) << d.err;
  EXPECT_NE(d.err.find("nlptrain: rank 3 (host "), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("fatal signal SIGABRT (sent by pid "), std::string::npos) << d.err;
  // Frames through the test body: at least the handler, abort and this test's lambda.
  const std::regex frame("nlptrain: rank 3:   #[0-9]+ +0x[0-9a-f]+: ");
  const auto frames = std::distance(std::sregex_iterator(d.err.begin(), d.err.end(), frame), std::sregex_iterator());
  EXPECT_GE(frames, 3) << d.err;
  EXPECT_TRUE(std::regex_search(d.err, std::regex("#[0-9]+ +0x[0-9a-f]+: test_crash_report\\+0x"))) << d.err;
}

TEST(CrashReport, ASignalSentByAnotherProcessStillKills) {
  SKIP_WITHOUT_REPORT();
  // A SIGBUS from kill() does not recur when the handler returns: the report must re-raise it.
  const Death d = crash_in_child([] {
    nlp::install_crash_report();
    nlp::set_crash_report_rank(1);
    ::kill(::getpid(), SIGBUS);
    for (int i = 0; i < 100; ++i) ::usleep(10000);  // not reached when the signal kills
  });
  EXPECT_EQ(d.signal, SIGBUS) << d.err;
  EXPECT_NE(d.err.find("fatal signal SIGBUS (sent by pid "), std::string::npos) << d.err;
}

TEST(CrashReport, BeforeMpiInitTheRankIsTheLaunchers) {
  SKIP_WITHOUT_REPORT();
  constexpr const char* kRankVars[] = {"PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"};
  for (const char* var : kRankVars) {
    const Death d = crash_in_child([var, &kRankVars] {
      for (const char* v : kRankVars) ::unsetenv(v);
      ::setenv(var, "12", 1);
      nlp::install_crash_report();
      (void)read_bad_address();
    });
    EXPECT_EQ(d.signal, SIGSEGV) << var;
    EXPECT_NE(d.err.find("nlptrain: rank 12 (host "), std::string::npos) << var << "\n" << d.err;
  }
  const Death none = crash_in_child([&kRankVars] {
    for (const char* v : kRankVars) ::unsetenv(v);
    nlp::install_crash_report();
    (void)read_bad_address();
  });
  EXPECT_NE(none.err.find("nlptrain: rank ? (host "), std::string::npos) << none.err;
}

TEST(CrashReport, WithoutTheReportTheSameCrashSaysNothing) {
  // The control: the lines above come from the report, not from the runtime.
  SKIP_WITHOUT_REPORT();
  const Death d = crash_in_child([] { (void)call_through_null(); });
  EXPECT_EQ(d.signal, SIGSEGV);
  EXPECT_EQ(d.err.find("nlptrain: rank"), std::string::npos) << d.err;
}

}  // namespace
