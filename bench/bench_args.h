// The C++ benchmarks' command-line numbers. atoi/atof turn "8x" or "--steps" into 0 or 8 and the bench runs
// something nobody asked for; here the whole argument must be a number within [lo, hi], or the caller prints its
// usage and exits 2.
#pragma once
#include <cerrno>
#include <cstdlib>

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

}  // namespace mt::bench
