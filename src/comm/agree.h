// An error found by some ranks during start-up, agreed on by every rank at a point they all reach
// (a collective), so that it is printed once and every rank can end through MPI_Finalize with an
// exit code instead of MPI_Abort (whose banner mpirun prints after the message).
#pragma once
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "comm/comm.h"
#include "core/error.h"

namespace nlp {

// Thrown on every rank by agree_on_error once the message has been printed; app/main.cpp ends the
// rank with exit code 1 through MPI_Finalize and prints nothing more.
class ReportedError : public Error {
 public:
  explicit ReportedError(const std::string& msg) : Error(msg) {}
};

// Collective: every rank passes its error ("" = none). When any rank has one, the lowest such rank
// prints it to stderr ("nlptrain: error: ..." when every rank failed, else with "[rank R of N]"), and
// every rank throws ReportedError. Returns when no rank has one.
void agree_on_error(Comm& comm, const std::string& error);

// Collective: runs f() on this rank; an exception it throws becomes this rank's error for
// agree_on_error (a ReportedError, agreed inside f, passes through: every rank has it). Returns f()'s
// value. For start-up work whose own collectives every rank reaches or none (checks that throw the
// same on every rank, or only before or after their collectives).
template <class F>
auto agreed(Comm& comm, F&& f) {
  using R = decltype(f());
  std::string error;
  if constexpr (std::is_void_v<R>) {
    try {
      f();
    } catch (const ReportedError&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree_on_error(comm, error);
  } else {
    std::optional<R> r;
    try {
      r.emplace(f());
    } catch (const ReportedError&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree_on_error(comm, error);
    return R(std::move(*r));
  }
}

}  // namespace nlp
