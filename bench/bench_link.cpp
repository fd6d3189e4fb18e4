// The network model against a real link (docs/multinode.md, "The network model against the network"): over
// MPI_COMM_WORLD, through the Communicator the trainer uses for groups that span hosts (the MPI transport, polled
// waits), times
//   ping      a 4-byte message from the first rank to the last and back: the link's latency (half the round trip)
//   message   a --msg-bytes message from the first rank to the last (half of a ping-pong round trip)
//   all_reduce  --bytes of fp32, summed over every rank
//   exchange 1  rank 0 and rank size/2 (the first rank of the second host) swap --bytes messages, both directions
//               at once: one flow per direction of the link, as a 2-rank all-reduce across hosts sends
//   exchange P  every rank r < size/2 swaps --bytes with r + size/2, all at once: size/2 flows per direction share
//               the host's link (the prediction divides the bandwidth among them, comm_options.h shared_link), as
//               the dp groups of tp 2 x dp 2 do
//   all_reduce P  the same pairs all-reduce --bytes at once, each pair its own communicator: tp 2 x dp 2's dp groups
// and prints each beside comm.emulate's alpha-beta prediction (comm/comm_options.h, predict_us) for the link
// --latency-us / --bandwidth-gbps, the inter-node link of the planner and the emulation. Median of --iters
// repetitions after one warm-up; rank 0 prints.
//   scripts/cluster.sh run -n 4 --per-host 2 -- build/bench/bench_link --bytes 3000000 --msg-bytes 65536
//     --latency-us 100 --bandwidth-gbps 0.025 [--iters 5]   (one command line)
// Output, one line per operation: name, bytes, ranks, measured ms, predicted ms, measured / predicted.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.h"
#include "comm/comm_options.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"

using namespace mt;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  int64_t bytes = 4 << 20, msg_bytes = 1 << 16;
  int iters = 5;
  LinkModel link;
  double bandwidth_gbps = 0;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    double x = 0;
    bool ok = true;
    if (k == "--bytes") {
      ok = bench::arg_number(v, 4, 1 << 30, &x);
      bytes = int64_t(x);
    } else if (k == "--msg-bytes") {
      ok = bench::arg_number(v, 1, 1 << 30, &x);
      msg_bytes = int64_t(x);
    } else if (k == "--iters") {
      ok = bench::arg_int(v, 1, 100000, &iters);
    } else if (k == "--latency-us") {
      ok = bench::arg_number(v, 0, 1e9, &link.alpha_us);
    } else if (k == "--bandwidth-gbps") {
      ok = bench::arg_number(v, 0, 1e6, &bandwidth_gbps);
    } else {
      ok = false;
    }
    if (!ok)
      bench::usage_exit("bench_link", "bad argument " + k + " " + (v ? v : "(no value)"),
                        "mpiexec -n P bench_link [--bytes 4194304] [--msg-bytes 65536] [--iters 5] [--latency-us A] "
                        "[--bandwidth-gbps B]");
  }
  if (bandwidth_gbps > 0) link.beta_us_per_byte = 1e-3 / bandwidth_gbps;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    std::fprintf(stderr, "bench_link: needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  {
    CommOptions opts;
    opts.transport = CommOptions::Transport::Mpi;  // what comm.backend=auto takes for a group across hosts
    auto comm = make_communicator(MPI_COMM_WORLD, "world", opts);
    const int last = size - 1;
    // Median over iters of f()'s wall time, the slowest rank's each time (one warm-up first). Every wait goes
    // through the communicator (polled, yielding the core): ranks idle in a blocking MPI call would spin on the
    // cores the measured ranks' communication threads need, and add milliseconds to a message.
    Tensor slowest = Tensor::empty({1}, DType::F32);
    auto timed = [&](auto f) {
      std::vector<double> ms;
      for (int i = 0; i <= iters; ++i) {
        comm->barrier();
        const double t0 = MPI_Wtime();
        f();
        slowest.data_as<float>()[0] = static_cast<float>((MPI_Wtime() - t0) * 1e3);
        comm->all_reduce(slowest, ReduceOp::Max);
        if (i > 0) ms.push_back(slowest.data_as<float>()[0]);
      }
      return median(ms);
    };
    auto ping_pong = [&](int64_t n) {
      Tensor buf = Tensor::empty({std::max<int64_t>(1, n / 4)}, DType::F32);
      std::fill_n(buf.data_as<float>(), buf.numel(), 1.0f);
      return timed([&] {
               if (rank == 0) comm->send(buf, last, 1), comm->recv(buf, last, 2);
               if (rank == last) comm->recv(buf, 0, 1), comm->send(buf, 0, 2);
             }) / 2;
    };
    const double ping_ms = ping_pong(4);
    const double msg_ms = ping_pong(msg_bytes);
    Tensor grad = Tensor::empty({bytes / 4}, DType::F32);
    std::fill_n(grad.data_as<float>(), grad.numel(), 1.0f);
    const double ar_ms = timed([&] { comm->all_reduce(grad, ReduceOp::Sum); });
    // Swaps with the rank half a world away, by every rank below `pairs` and its peer; the others only time.
    const int half = size / 2;
    Tensor out = Tensor::empty({bytes / 4}, DType::F32), in = Tensor::empty({bytes / 4}, DType::F32);
    std::fill_n(out.data_as<float>(), out.numel(), 1.0f);
    auto exchange = [&](int pairs) {
      return timed([&] {
        const int peer = rank < half ? rank + half : rank - half;
        if (half > 0 && (rank % half) < pairs) {
          WorkPtr s = comm->send_async(out, peer, 3);
          WorkPtr r = comm->recv_async(in, peer, 3);
          s->wait();
          r->wait();
        }
      });
    };
    const double one_ms = exchange(1), all_ms = exchange(half);
    MPI_Comm pair_comm;
    MPI_Comm_split(MPI_COMM_WORLD, rank % std::max(1, half), rank, &pair_comm);
    double pairs_ar_ms = 0;
    {
      auto pair = make_communicator(pair_comm, "pair", opts);
      pairs_ar_ms = timed([&] { pair->all_reduce(grad, ReduceOp::Sum); });
    }
    MPI_Comm_free(&pair_comm);
    if (rank == 0) {
      std::printf("link model: alpha %.1f us, %.4f GB/s; %d ranks\n", link.alpha_us, bandwidth_gbps, size);
      std::printf("%-10s %12s %5s %12s %12s %8s\n", "op", "bytes", "ranks", "measured_ms", "predicted_ms", "ratio");
      auto row = [&](const char* name, int64_t n, int p, double measured, double predicted) {
        std::printf("%-10s %12lld %5d %12.3f %12.3f %8.3f\n", name, static_cast<long long>(n), p, measured, predicted,
                    predicted > 0 ? measured / predicted : 0.0);
      };
      row("ping", 4, 2, ping_ms, predict_us(CommKind::Send, 4, 2, link) * 1e-3);
      row("message", msg_bytes, 2, msg_ms, predict_us(CommKind::Send, msg_bytes, 2, link) * 1e-3);
      row("all_reduce", bytes, size, ar_ms, predict_us(CommKind::AllReduce, bytes, size, link) * 1e-3);
      row("exchange 1", bytes, 2, one_ms, predict_us(CommKind::Send, bytes, 2, link) * 1e-3);
      row(("exchange " + std::to_string(half)).c_str(), bytes, size, all_ms,
          predict_us(CommKind::Send, bytes, 2, shared_link(link, half)) * 1e-3);
      row(("all_reduce " + std::to_string(half)).c_str(), bytes, size, pairs_ar_ms,
          predict_us(CommKind::AllReduce, bytes, 2, shared_link(link, half)) * 1e-3);
    }
  }
  return finalize_mpi(0);
}
