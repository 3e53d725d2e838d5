// Shared helpers of the libFuzzer harnesses (tests/fuzz/README.md).
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace nlp_fuzz {

// A per-process scratch file name (in $TMPDIR, else /dev/shm when present, else /tmp), so that
// parallel fuzzing jobs (-jobs=N) do not share files.
inline std::string scratch_path(const std::string& stem) {
  const char* env = std::getenv("TMPDIR");
  std::string dir = env && *env ? env : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  return dir + "/nlptrain-fuzz-" + std::to_string(getpid()) + "-" + stem;
}

inline void write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// INI text without its comment lines (to_ini()'s header names the file it was read from).
inline std::string without_comments(const std::string& ini) {
  std::string out, line;
  size_t i = 0;
  while (i < ini.size()) {
    size_t e = ini.find('\n', i);
    if (e == std::string::npos) e = ini.size();
    line = ini.substr(i, e - i);
    if (line.empty() || line[0] != '#') out += line + "\n";
    i = e + 1;
  }
  return out;
}

// A property the harness checks failed: report it and abort, which libFuzzer records as a crash
// (with the input saved as crash-<sha1>).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace nlp_fuzz
