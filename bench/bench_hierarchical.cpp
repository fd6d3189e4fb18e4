// Hierarchical all-reduce (comm.hierarchical) against the flat ring all-reduce on an emulated two-tier network:
// k ranks per node on fast intra-node links, m nodes joined by slow links. The flat ring crosses the slow link on
// every one of its 2(km-1) steps; the hierarchical one only on the 2(m-1) steps of its middle phase, with 1/k of
// the data. Prints, per link setting and message size, the median time of each (fp32, Avg), the measured ratio
// flat / hierarchical, the alpha-beta prediction of that ratio and their relative difference.
// Run: OMP_NUM_THREADS=1 mpiexec -n 4 build/bench/bench_hierarchical [--reps 7] [--ranks-per-node 2]
//        [--links intra_latency_us,intra_gbps,inter_latency_us,inter_gbps [--sizes 256K,1M,4M]]
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_args.h"
#include "comm/hierarchical_communicator.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"

using namespace mt;

namespace {

struct Setting {
  std::string name;
  double intra_latency_us, intra_gbps, inter_latency_us, inter_gbps;
  std::vector<int64_t> sizes;  // bytes
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "256K", "4M", "1000" -> bytes (a multiple of 4: fp32 elements); -1 for anything else.
int64_t parse_bytes(std::string s) {
  double scale = 1, v = 0;
  if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) scale = 1024;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) scale = 1024 * 1024;
  if (scale > 1) s.pop_back();
  if (!bench::arg_number(s.c_str(), 1, 1 << 30, &v)) return -1;
  return std::max<int64_t>(4, static_cast<int64_t>(v * scale) / 4 * 4);
}
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find(',', b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

std::string human(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  int reps = 7, rpn = 2;
  std::string links, sizes = "256K,1M,4M";
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto usage = [](const std::string& why) {
    bench::usage_exit("bench_hierarchical", why, "mpiexec -n 4 bench_hierarchical [--reps 7] [--ranks-per-node 2] "
                      "[--links intra_latency_us,intra_gbps,inter_latency_us,inter_gbps [--sizes 256K,1M,4M]]");
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    bool ok = true;
    if (a == "--reps") ok = bench::arg_int(argv[i + 1], 1, 100000, &reps);
    else if (a == "--ranks-per-node") ok = bench::arg_int(argv[i + 1], 1, 1 << 16, &rpn);
    else if (a == "--links") links = argv[i + 1];
    else if (a == "--sizes") sizes = argv[i + 1];
    else usage("unknown option " + a);
    if (!ok) usage("bad value for " + a + ": " + argv[i + 1]);
  }
  MPI_Comm raw;  // for the timing barriers and the max over ranks, apart from the communicators measured
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);

  std::vector<int> world(size);
  for (int i = 0; i < size; ++i) world[i] = i;
  const HierarchicalLayout layout = hierarchical_layout(emulated_nodes(world, rpn), rank);
  if (!layout.error.empty()) {
    if (rank == 0) std::fprintf(stderr, "%d ranks with %d per node: %s\n", size, rpn, layout.error.c_str());
    MPI_Finalize();
    return 2;
  }
  const int k = layout.ranks_per_node, m = layout.nodes;

  // The emulation can only slow real transfers down, never speed them up: each operation lasts
  // max(real MPI time, prediction). On a shared 2-core machine a real 4-rank collective already takes milliseconds
  // (the "none" rows), so both links are emulated slower than that: a cluster scaled down in speed, with the
  // intra/inter ratios of real ones (8x the bandwidth inside a node; or 10x lower latency). Otherwise the real
  // time of the intra-node phases, not the model, sets the hierarchical all-reduce's time.
  std::vector<Setting> settings = {
      // Bandwidth-bound: 0.1 GB/s inside a node, 8x less between nodes.
      {"bw: intra 1ms 0.1GB/s, inter 5ms 0.0125GB/s", 1000, 0.1, 5000, 0.0125, {256 << 10, 1 << 20, 4 << 20}},
      // Latency-bound: a 20 ms handshake between nodes, 2 ms inside one.
      {"lat: intra 2ms 10GB/s, inter 20ms 1GB/s", 2000, 10, 20000, 1, {4 << 10, 64 << 10}},
      // No emulation: the real cost of the collectives and thread hand-offs on this machine.
      {"none (real MPI, shared memory)", 0, 0, 0, 0, {4 << 10, 1 << 20}},
  };
  // --links intra_us,intra_gbps,inter_us,inter_gbps [--sizes 256K,1M,...]: one setting of one's own instead.
  const std::vector<std::string> l = split_commas(links);
  if (!links.empty()) {
    double v[4];
    for (size_t i = 0; i < 4; ++i)
      if (l.size() != 4 || !bench::arg_number(l[i].c_str(), 0, 1e9, &v[i]))
        usage("--links takes four numbers: intra_latency_us,intra_gbps,inter_latency_us,inter_gbps");
    Setting s{"intra " + l[0] + "us " + l[1] + "GB/s, inter " + l[2] + "us " + l[3] + "GB/s", v[0], v[1], v[2], v[3],
              {}};
    for (const std::string& b : split_commas(sizes)) {
      s.sizes.push_back(parse_bytes(b));
      if (s.sizes.back() < 0) usage("bad --sizes entry: " + b);
    }
    settings = {s};
  }
  if (rank == 0) {
    std::printf("all_reduce fp32 avg, %d ranks = %d nodes x %d ranks (emulated, ranks_per_node %d), median of %d\n",
                size, m, k, rpn, reps);
    std::printf("%-44s %8s %8s %8s %9s %9s %9s %9s %9s %8s\n", "links", "size", "flat ms", "hier ms", "measured",
                "(max)", "pred flat", "pred hier", "predicted", "rel diff");
  }
  double worst = 0;
  for (const Setting& s : settings) {
    CommOptions o;
    o.timeout_s = 120;
    o.ranks_per_node = rpn;
    o.latency_us = s.intra_latency_us;
    o.bandwidth_gbps = s.intra_gbps;
    o.inter_latency_us = s.inter_latency_us;
    o.inter_bandwidth_gbps = s.inter_gbps;
    auto flat = make_communicator(MPI_COMM_WORLD, "flat", o);
    auto hier = make_hierarchical_communicator(MPI_COMM_WORLD, "hier", o);
    for (int64_t bytes : s.sizes) {
      const int64_t n = bytes / 4;
      Tensor t = Tensor::empty({n}, DType::F32);
      std::fill_n(t.data_as<float>(), n, static_cast<float>(rank + 1));
      // Each rank times its own all_reduce call after an MPI_Barrier. With more ranks than cores the barrier's
      // exits spread over milliseconds; a rank that arrives early then waits inside the operation for the last
      // one. The emulated flat ring hides that wait (each rank's emulated delay runs from its own start), the
      // three-phase operation exposes it (its short first phase ends only when the late rank joins). So the
      // figure compared with the model is the time of the rank that arrived last (the minimum over ranks): the
      // operation's duration once every rank has joined. The maximum (arrival spread included) is printed too.
      struct Sample {
        double joined, spread;
      };
      auto time_one = [&](Communicator& c) {
        MPI_Barrier(raw);
        const double t0 = trace_clock_us();
        c.all_reduce(t, ReduceOp::Avg);
        const double dt = (trace_clock_us() - t0) * 1e-3;
        Sample s;
        MPI_Allreduce(&dt, &s.joined, 1, MPI_DOUBLE, MPI_MIN, raw);
        MPI_Allreduce(&dt, &s.spread, 1, MPI_DOUBLE, MPI_MAX, raw);
        return s;
      };
      time_one(*flat);
      time_one(*hier);
      // Alternate, so drift on a shared machine hits both alike.
      std::vector<double> tf, th, tf_max, th_max;
      for (int r = 0; r < reps; ++r) {
        const Sample f = time_one(*flat), h = time_one(*hier);
        tf.push_back(f.joined);
        th.push_back(h.joined);
        tf_max.push_back(f.spread);
        th_max.push_back(h.spread);
      }
      const double mf = median(tf), mh = median(th), spread_ratio = median(tf_max) / median(th_max);
      const double pf = predict_us(CommKind::AllReduce, bytes, size, link_model(o, m > 1)) * 1e-3;
      const double ph = predict_hierarchical_us(bytes, k, m, o) * 1e-3;
      const double measured = mf / mh;
      if (ph <= 0) {  // no emulation: nothing to predict
        if (rank == 0)
          std::printf("%-44s %8s %8.3f %8.3f %9.2f %9.2f %9s %9s %9s %8s\n", s.name.c_str(), human(bytes).c_str(), mf, mh,
                      measured, spread_ratio, "-", "-", "-", "-");
        continue;
      }
      const double predicted = pf / ph, rel = measured / predicted - 1;
      worst = std::max(worst, std::fabs(rel));
      if (rank == 0)
        std::printf("%-44s %8s %8.2f %8.2f %9.2f %9.2f %9.2f %9.2f %9.2f %+7.1f%%\n", s.name.c_str(), human(bytes).c_str(), mf,
                    mh, measured, spread_ratio, pf, ph, predicted, 100 * rel);
    }
  }
  if (rank == 0) std::printf("largest |relative difference| %.1f%% (the issue asks for <= 15%%)\n", 100 * worst);
  MPI_Comm_free(&raw);
  MPI_Finalize();
  return 0;
}
