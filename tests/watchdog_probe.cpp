// Watchdog probe (tests/py/test_watchdog.py): every rank joins a barrier, then the last rank stops itself with
// SIGSTOP and the others all-reduce. Their wait() must outlive comm.timeout_s (argv[1], seconds), print the
// watchdog's line and abort the whole job. argv[2] names the transport and its way of waiting: shm (sleeps),
// poll or block (the MPI transport's comm.wait).
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/make_communicator.h"
#include "comm/mpi_init.h"

int main(int argc, char** argv) {
  mt::init_mpi(&argc, &argv);
  mt::CommOptions opts;
  opts.timeout_s = argc > 1 ? std::atof(argv[1]) : 5;
  const std::string wait = argc > 2 ? argv[2] : "shm";
  opts.transport = wait == "shm" ? mt::CommOptions::Transport::Shm : mt::CommOptions::Transport::Mpi;
  opts.blocking_waits = wait == "block";
  {
    auto c = mt::make_communicator(MPI_COMM_WORLD, "world", opts);
    mt::Tensor t = mt::Tensor::empty({1024}, mt::DType::F32);
    c->barrier();
    if (c->rank() == c->size() - 1) std::raise(SIGSTOP);
    c->all_reduce(t, mt::ReduceOp::Sum);
    std::printf("rank %d: all_reduce completed (the watchdog did not fire)\n", c->rank());
  }
  MPI_Finalize();
  return 0;
}
