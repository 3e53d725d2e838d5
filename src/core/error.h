// Errors: one exception type for every user-facing failure (bad input, bad config, I/O).
// The message names the file, key or value at fault; app/main.cpp prints it and aborts all ranks.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace nlp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Build a message from pieces: throw Error(cat("file '", path, "': ", what));
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return std::string(os.view());
}

}  // namespace nlp

// Internal invariant (a bug in nlptrain, not a user error).
#define NLP_ASSERT(cond)                                                                    \
  do {                                                                                      \
    if (!(cond))                                                                            \
      throw ::nlp::Error(::nlp::cat("internal error: ", #cond, " failed at ", __FILE__, ":", \
                                    __LINE__));                                             \
  } while (0)
