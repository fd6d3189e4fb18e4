// Fatal checks for internal invariants: CHECK(cond, fmt, args...) prints the failed condition, file:line and the
// MPI rank, then aborts. Bad user input is not an invariant: it throws InputError (errors.h) and exits with 2.
#pragma once
#include <fmt/format.h>
#include <string>

namespace mt {
[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);
int world_rank_or_zero();  // the MPI world rank when MPI is initialised, else 0 (for messages only)
// Called once, with the failure's line, by the first failed check of the process, before it aborts (the flight
// recorder's dump: comm/flight_recorder.cpp). nullptr: none.
using CheckFailureHook = void (*)(const std::string& failure);
void set_check_failure_hook(CheckFailureHook hook);
}  // namespace mt

#define MT_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond)) ::mt::check_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// CHECK is the short name for .cpp files. Headers use MT_CHECK, so they also compile inside unit tests, where
// Catch2's own CHECK (included first) keeps its meaning.
#ifndef CHECK
#define CHECK(cond, ...) MT_CHECK(cond, __VA_ARGS__)
#endif

#define MPI_CHECK(call)                                                                    \
  do {                                                                                     \
    int mt_mpi_rc_ = (call);                                                               \
    if (mt_mpi_rc_ != 0) ::mt::check_failed(#call, __FILE__, __LINE__, ::fmt::format("MPI error {}", mt_mpi_rc_)); \
  } while (0)
