// What the flight recorder (run.flight_recorder) costs: the same all-reduces through a plain communicator and
// through one wrapped by the recorder (with_flight_recorder), interleaved in rounds, on this transport; the recorder's
// own bookkeeping per operation without any communication; and the time of one dump of full rings.
// Run: mpiexec -n 2 build/bench/bench_flight_recorder [--ops 20000] [--rounds 5] [--floats 1] [--capacity 2000]
//
// The two numbers. The recorder adds no bytes to any message. Per operation it copies one record (~100 bytes) into
// its ring and takes a mutex twice (at issue, on the issuing thread; at completion, on the communication thread),
// against a collective that costs at least one round trip between processes (microseconds on shared memory). So its
// cost should be a few percent of the smallest collective and nothing next to a large one. Prints the median us per
// all-reduce of each arm and their ratio, the bookkeeping in ns per operation, and the dump in ms.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_args.h"
#include "comm/comm_options.h"
#include "comm/flight_recorder.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"

using namespace mt;

namespace {

const char* kUsage = "bench_flight_recorder [--ops 20000] [--rounds 5] [--floats 1] [--capacity 2000]";

double us_per_op(Communicator& c, const Tensor& t, int ops) {
  c.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) c.all_reduce(t, ReduceOp::Sum);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / ops;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  int ops = 20000, rounds = 5, floats = 1, capacity = 2000;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) bench::usage_exit("bench_flight_recorder", "missing value for " + a, kUsage);
    bool ok = true;
    if (a == "--ops") ok = bench::arg_int(argv[i + 1], 1, 10000000, &ops);
    else if (a == "--rounds") ok = bench::arg_int(argv[i + 1], 1, 1000, &rounds);
    else if (a == "--floats") ok = bench::arg_int(argv[i + 1], 1, 1 << 26, &floats);
    else if (a == "--capacity") ok = bench::arg_int(argv[i + 1], 1, 1 << 24, &capacity);
    else bench::usage_exit("bench_flight_recorder", "unknown option " + a, kUsage);
    if (!ok) bench::usage_exit("bench_flight_recorder", "bad value for " + a + ": " + argv[i + 1], kUsage);
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = (std::filesystem::temp_directory_path() / "bench_flight_recorder").string();
  FlightRecorder& rec = FlightRecorder::get();
  CommOptions opts;
  std::unique_ptr<Communicator> plain = make_communicator(MPI_COMM_WORLD, "plain", opts);
  rec.configure(capacity, dir, rank, world);
  std::unique_ptr<Communicator> recorded =
      with_flight_recorder(make_communicator(MPI_COMM_WORLD, "recorded", opts), MPI_COMM_WORLD);
  Tensor t = Tensor::zeros({floats}, DType::F32);
  std::vector<double> a, b;
  for (int r = 0; r < rounds; ++r) {  // interleaved: drift on the machine hits both arms alike
    a.push_back(us_per_op(*plain, t, ops));
    b.push_back(us_per_op(*recorded, t, ops));
  }
  // The bookkeeping alone: a group of its own, issue and completion of operations that never travel.
  const int g = rec.add_group("bookkeeping", {rank}, 0);
  const auto k0 = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) {
    const uint64_t seq = rec.issue(g, CommKind::AllReduce, floats, DType::F32, 0, -1, -1);
    rec.completed(g, seq, 0, 1);
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - k0).count() / ops;
  const auto d0 = std::chrono::steady_clock::now();
  rec.dump("bench");
  const double dump_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
  if (rank == 0) {
    std::printf("bench_flight_recorder: %d ranks, all_reduce of %d fp32, %d ops x %d interleaved rounds, ring of %d\n",
                world, floats, ops, rounds, capacity);
    std::printf("  plain     %8.2f us/op (median of rounds)\n", median(a));
    std::printf("  recorded  %8.2f us/op  ratio recorded/plain %.3f\n", median(b), median(b) / median(a));
    std::printf("  bookkeeping alone: %.0f ns per operation; one dump of two full rings: %.1f ms\n", ns, dump_ms);
  }
  recorded.reset();
  plain.reset();
  std::filesystem::remove_all(dir);
  MPI_Finalize();
  return 0;
}
