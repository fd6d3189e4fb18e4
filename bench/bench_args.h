// The C++ benchmarks' command lines. atoi/atof turn "8x" or "--steps" into 0 or 8 and the bench runs something
// nobody asked for; here the whole argument must be a number within [lo, hi], or the bench ends through
// usage_exit: the problem and the usage line, exit status 2.
#pragma once
#include <mpi.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace mt::bench {

inline bool arg_number(const char* s, double lo, double hi, double* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (*end != '\0' || errno != 0 || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

inline bool arg_int(const char* s, int lo, int hi, int* out) {
  double v = 0;
  if (!arg_number(s, lo, hi, &v) || v != static_cast<double>(static_cast<int>(v))) return false;
  *out = static_cast<int>(v);
  return true;
}

// "NAME: WHY" and "usage: USAGE" on stderr (from rank 0 alone when MPI runs), MPI finalised when it was started,
// exit 2.
[[noreturn]] inline void usage_exit(const char* name, const std::string& why, const char* usage) {
  int mpi = 0, rank = 0;
  MPI_Initialized(&mpi);
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::fprintf(stderr, "%s: %s\nusage: %s\n", name, why.c_str(), usage);
  if (mpi) MPI_Finalize();
  std::exit(2);
}

}  // namespace mt::bench
