// all_reduce through the Communicator (its communication thread, handles, events) against raw MPI_Allreduce on
// the same buffers, fp32 sum, 1 KiB .. 64 MiB.
// Run: mpiexec -n 2 build/bench/bench_allreduce [--max-mib 64] [--transport shm|poll|block]
// (shm: the shared-memory transport; poll, block: the MPI transport with that comm.wait)
// Prints, per size, algorithm bandwidth (bytes / time) for both and their ratio (communicator / raw).
#include <mpi.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"

using namespace mt;

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  int max_mib = 64;
  std::string mode = "shm";
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto usage = [](const std::string& why) {
    bench::usage_exit("bench_allreduce", why,
                      "mpiexec -n P bench_allreduce [--max-mib 64] [--transport shm|poll|block]");
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    bool ok = true;
    if (a == "--max-mib") ok = bench::arg_int(argv[i + 1], 1, 1024, &max_mib);
    else if (a == "--transport") mode = argv[i + 1];
    else usage("unknown option " + a);
    if (!ok) usage("bad value for " + a + ": " + argv[i + 1]);
  }
  if (mode != "shm" && mode != "poll" && mode != "block") usage("--transport must be shm, poll or block");
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  {
    CommOptions opts;
    opts.transport = mode == "shm" ? CommOptions::Transport::Shm : CommOptions::Transport::Mpi;
    opts.blocking_waits = mode == "block";
    auto comm = make_communicator(MPI_COMM_WORLD, "world", opts);
    if (rank == 0)
      std::printf("all_reduce fp32 sum, %d ranks, communicator: %s\n%10s %12s %12s %8s\n", size,
                  mode == "shm" ? "shared memory" : ("mpi, comm.wait=" + mode).c_str(), "bytes", "raw GB/s",
                  "comm GB/s", "ratio");
    for (int64_t bytes = 1024; bytes <= int64_t(max_mib) * 1024 * 1024; bytes *= 4) {
      const int64_t n = bytes / 4;
      Tensor t = Tensor::empty({n}, DType::F32);
      std::fill_n(t.data_as<float>(), n, 1.0f);
      // ~0.25 s per measurement, at least 5 iterations.
      const int iters = static_cast<int>(std::clamp<int64_t>(int64_t{256} * 1024 * 1024 / bytes, 5, 2000));
      auto time_raw = [&] {
        MPI_Barrier(raw);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw);
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, raw);
        return dt / iters;
      };
      auto time_comm = [&] {
        MPI_Barrier(raw);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) comm->all_reduce(t, ReduceOp::Sum);
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, raw);
        return dt / iters;
      };
      time_raw();
      time_comm();
      // Alternate and keep the best of 5 of each, so drift on a shared machine hits both alike.
      double best_raw = 1e30, best_comm = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        best_raw = std::min(best_raw, time_raw());
        best_comm = std::min(best_comm, time_comm());
      }
      if (rank == 0)
        std::printf("%10lld %12.3f %12.3f %8.3f\n", static_cast<long long>(bytes), bytes / best_raw * 1e-9,
                    bytes / best_comm * 1e-9, best_raw / best_comm);
    }
    // CPU cost of waiting for a late peer: every rank but 0 sleeps 1 s before joining the all-reduce; rank 0
    // reports the CPU time its process used meanwhile, through the communicator and through raw MPI.
    Tensor t = Tensor::empty({1024}, DType::F32);
    auto cpu_s = [] {
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return ts.tv_sec + ts.tv_nsec * 1e-9;
    };
    for (int use_comm = 0; use_comm < 2 && size > 1; ++use_comm) {
      MPI_Barrier(raw);
      const double c0 = cpu_s(), w0 = MPI_Wtime();
      if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
      if (use_comm)
        comm->all_reduce(t, ReduceOp::Sum);
      else
        MPI_Allreduce(MPI_IN_PLACE, t.data(), 1024, MPI_FLOAT, MPI_SUM, raw);
      if (rank == 0)
        std::printf("late peer (1 s): %s used %.2f s of CPU in %.2f s\n", use_comm ? "communicator" : "raw MPI  ",
                    cpu_s() - c0, MPI_Wtime() - w0);
    }
  }
  MPI_Comm_free(&raw);
  MPI_Finalize();
  return 0;
}
