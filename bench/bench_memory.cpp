// How fast one core writes a working set and reads it back, by the set's size: the traffic of a pipeline's
// records, which a schedule writes in the forward pass and reads in the backward pass (docs/performance.md,
// "GPipe's memory"). Where the set outgrows what the caches keep for one core, the rate falls to memory's.
// Run: build/bench/bench_memory [--mib 2,9,18,37,74,148,512] [--gib-per-size 4]
// Prints each size's rate (bytes written + bytes read, per second) and its ratio to the first size's, measured in
// the same run. Pin it (taskset -c 1) to time one core; the machine's other core may share the last-level cache.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"

namespace {

// One pass: write every element (a value the compiler cannot turn into memset), then read them all back.
uint32_t write_then_read(uint32_t* a, size_t n, uint32_t round) {
  for (size_t i = 0; i < n; ++i) a[i] = uint32_t(i) ^ round;
  uint32_t sum = 0;  // integer sums vectorise without reassociating floats
  for (size_t i = 0; i < n; ++i) sum += a[i];
  return sum;
}

[[noreturn]] void usage(const std::string& why) {
  mt::bench::usage_exit("bench_memory", why, "bench_memory [--mib LIST] [--gib-per-size G]");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {2, 9, 18, 37, 74, 148, 512};
  double gib_per_size = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + a);
    if (a == "--mib") {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string tok;
      int v = 0;
      while (std::getline(ss, tok, ',')) {
        if (!mt::bench::arg_int(tok.c_str(), 1, 65536, &v)) usage("--mib: MiB from 1 to 65536, not " + tok);
        sizes.push_back(v);
      }
    } else if (a == "--gib-per-size") {
      if (!mt::bench::arg_number(argv[++i], 0.01, 1024, &gib_per_size)) usage("--gib-per-size: 0.01 to 1024");
    } else {
      usage("unknown argument " + a);
    }
  }
  std::printf("write then read back, one thread; %.2g GiB moved per size\n", gib_per_size);
  std::printf("%8s %10s %10s\n", "MiB", "GB/s", "vs first");
  double first = 0;
  uint32_t keep = 0;
  for (int mib : sizes) {
    const size_t n = (size_t(mib) << 20) / sizeof(uint32_t);
    std::vector<uint32_t> a(n, 1);  // touched once, so no page is first faulted inside the timed passes
    keep += write_then_read(a.data(), n, 0);
    const size_t passes = std::max<size_t>(1, size_t(gib_per_size * double(1 << 30) / (2.0 * double(n) * 4)));
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 1; r <= passes; ++r) keep += write_then_read(a.data(), n, uint32_t(r));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rate = 2.0 * double(n) * 4 * double(passes) / s / 1e9;
    if (first == 0) first = rate;
    std::printf("%8d %10.1f %9.2fx\n", mib, rate, rate / first);
  }
  volatile uint32_t sink = keep;  // the sums are used, so the reads are not optimised away
  (void)sink;
  return 0;
}
