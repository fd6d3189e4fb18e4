// Pipeline bubbles, speed-up and activation memory per schedule, measured against theory and against a
// one-rank baseline in the same run.
// Run: mpiexec -n 2 build/bench/bench_pipeline [--steps 12] [--layers 8] [--d-model 128] [--micro-batch 2]
//        [--seq 64] [--micro-batches 4,8] [--backend shm|mpi-poll|mpi-block] [--pin 1|0]
//        [--thread-priority auto|realtime|normal] [--recompute none|light|selective|full]
//        (p = the number of ranks)
// --pin 1 (the default, as the trainer's train.pin_threads): each rank's compute thread on a core of its own when
// the ranks fit the cores; 0: the OS places them.
//
// A GPT (L blocks of C channels, 4 heads, sequence T, vocabulary 64 so the head is ~1% of a stage; defaults L 8,
// C 128, T 64, micro-batch 2) is cut into p stages of L/p blocks; every rank computes with one thread. Each rank
// times its own passes (forward F, one-pass backward B, and the zero-bubble split: input pass Bi, weight pass W),
// then the baseline and the schedules run, --steps counted steps each after 2 warm-up steps:
//   baseline     rank 0 alone runs the whole model (all L blocks) for the same m micro-batches, forward and
//                backward of each as a pipeline step does (the executor with one stage, no communication), while
//                the other ranks sleep in a barrier (MPI_Ibarrier polled with 0.5 ms sleeps, so they leave the
//                cores alone); --steps steps before the pipeline runs and --steps after, the median of all is the
//                baseline time (the medians before and after are printed too: they differ when the machine's
//                speed drifted). The table is printed at the end. A diagnostic beside it: the same run in GPipe's
//                order (every forward, then every backward), whose m live records cost memory traffic that the
//                baseline's one record does not; gpipe's speed-up against it is printed after the table.
//   schedules    gpipe, 1f1b, interleaved (v = 2 chunks per rank) and zb1 for each m through the trainer's
//                executor, every step started by a barrier on all ranks.
// Per step, the pipeline phase lasts as long as its slowest rank (span); a rank's bubble is span minus its own
// compute, and the bubble fraction is that over span, averaged over ranks. Theory, with the measured pass times:
//   gpipe, 1f1b   (p-1) / (m + p-1)
//   interleaved   (p-1)/v / (m + (p-1)/v)
//   zb1           (p-1)(F + Bi - W) / (m(F + Bi + W) + (p-1)(F + Bi - W))   (ZB-H1; a third of 1F1B's when F = Bi = W)
// Printed per schedule and m: the median over steps of the bubble fraction (the figure) and its min, the formula's
// value, the difference and whether it is within 0.05 (the bar); the span (median and min over steps); the
// speed-up = baseline time (median) / span (median) with its bar, >= 1.6x for p = 2 (none printed for other p),
// and the ideal speed-up p(1 - formula), which is m p / (m + p-1) for gpipe and 1f1b (1.78x for p 2, m 8;
// 1.60x for m 4, where the bar equals the ideal); the median imbalance between the ranks' compute times over the
// span (a diagnostic: the formulas assume equal stages, and an imbalance of x adds up to about x to the bubble);
// work, the median over steps of the ranks' summed compute over the baseline (1.00: the stages' passes, run
// side by side, cost what the whole model costs alone; above 1 they slow each other down, e.g. through shared
// caches and memory bandwidth, and speed-up ~ p (1 - bubble) / work); and the peak activation memory per stage.
// --backend sets the pipeline communicator's transport: shm (shared memory, threads sleep on futexes; the
// default), mpi-poll (MPI, nonblocking calls polled with back-off), mpi-block (MPI, blocking calls that spin).
// --thread-priority as the trainer's comm.thread_priority: auto (the default) gives the shared-memory transport's
// threads real-time priority where the OS permits it, realtime requires it, normal never.
// --recompute as the trainer's train.recompute, for the baseline and every schedule alike: what the records' size
// does to the cost of GPipe's m live records (docs/performance.md, "Smaller records do not remove it").
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_timing.h"
#include "comm/make_communicator.h"
#include "comm/realtime_threads.h"
#include "comm/mpi_init.h"
#include "core/threads.h"
#include "model/pipeline_chunks.h"
#include "parallel/mesh.h"
#include "train/pipeline_runner.h"

using namespace mt;

namespace {

constexpr int kVocab = 64, kHeads = 4, kWarmup = 2;

struct PassTimes {
  double F = 0, B = 0, Bi = 0, W = 0;  // ms per micro-batch on this rank's stage
};

// Times this rank's stage alone (no communication): forward, one-pass backward, input pass + weight pass.
PassTimes time_passes(const GPTConfig& cfg, const std::vector<int>& layers, int stage, int B, int T) {
  GPT g(cfg, ModelPart{stage_blocks(layers, stage), {}}, DType::F32);
  g.init(1, 0.02);
  Arena arena, scratch;
  Activations a = g.alloc_activations(arena, B, T, true);
  for (int64_t i = 0; i < a.tokens.numel(); ++i)
    a.tokens.data_as<int32_t>()[i] = a.targets.data_as<int32_t>()[i] = i % kVocab;
  zero_(a.input());
  const bool last = g.last_stage();
  Tensor dout = last ? Tensor() : Tensor::zeros(a.output().shape(), DType::F32);
  Tensor din = g.first_stage() ? Tensor() : Tensor::zeros(a.input().shape(), DType::F32);
  const Tensor none;
  PassTimes t;
  t.F = 1e3 * bench::time_best([&] { g.forward(a, last ? 1e-3 : 0.0, none); }, 0.3);
  t.B = 1e3 * bench::time_best([&] { scratch.reset(); g.backward(a, scratch, {}, BackwardPart::All, dout, din); }, 0.3);
  t.Bi = 1e3 * bench::time_best(
                   [&] { scratch.reset(); g.backward(a, scratch, {}, BackwardPart::InputOnly, dout, din); }, 0.3);
  t.W = 1e3 * bench::time_best([&] { g.backward_weights(a); }, 0.3);
  return t;
}

double theory(PipelineSchedule schedule, int p, int m, int v, const PassTimes& t) {
  if (schedule == PipelineSchedule::Interleaved) return (p - 1.0) / v / (m + (p - 1.0) / v);
  if (schedule == PipelineSchedule::ZB1) {
    const double bubble = (p - 1) * std::max(0.0, t.F + t.Bi - t.W);
    return bubble / (m * (t.F + t.Bi + t.W) + bubble);
  }
  return (p - 1.0) / (m + p - 1.0);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// A barrier whose waiters sleep (MPICH's MPI_Barrier spins), so a rank timing alone keeps its core to itself.
void sleeping_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    usleep(500);
  }
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", c + 1));
    }
  return "unknown";
}

[[noreturn]] void usage(const std::string& why) {
  bench::usage_exit("bench_pipeline", why, "mpiexec -n P bench_pipeline [--steps 12] [--layers 8] [--d-model 128] "
                    "[--micro-batch 2] [--seq 64] [--micro-batches 4,8] [--backend shm|mpi-poll|mpi-block] [--pin 1|0] "
                    "[--thread-priority auto|realtime|normal] [--recompute none|light|selective|full]");
}

}  // namespace

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  int steps = 12, layers_total = 8, d_model = 128, B = 2, T = 64;
  std::string ms_arg = "4,8", backend = "shm", priority = "auto", recompute = "none";
  bool pin = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    const char* v = argv[++i];
    bool ok = true;
    int pin_arg = 1;
    if (a == "--steps") ok = bench::arg_int(v, 1, 1 << 20, &steps);
    else if (a == "--layers") ok = bench::arg_int(v, 1, 1 << 10, &layers_total);
    else if (a == "--d-model") ok = bench::arg_int(v, kHeads, 1 << 14, &d_model);
    else if (a == "--micro-batch") ok = bench::arg_int(v, 1, 1 << 12, &B);
    else if (a == "--seq") ok = bench::arg_int(v, 1, 1 << 14, &T);
    else if (a == "--micro-batches") ms_arg = v;
    else if (a == "--backend") backend = v;
    else if (a == "--pin") ok = bench::arg_int(v, 0, 1, &pin_arg);
    else if (a == "--thread-priority") priority = v;
    else if (a == "--recompute") recompute = v;
    else usage("unknown option " + a);
    if (!ok) usage("bad value for " + a + ": " + v);
    if (a == "--pin") pin = pin_arg != 0;
  }
  std::vector<int> ms;
  {
    std::stringstream ss(ms_arg);
    for (std::string tok; std::getline(ss, tok, ',');) {
      int m = 0;
      if (!bench::arg_int(tok.c_str(), 1, 1 << 12, &m)) usage("bad --micro-batches entry: " + tok);
      ms.push_back(m);
    }
  }
  if (ms.empty() || d_model % kHeads) usage("--micro-batches needs at least one m, --d-model a multiple of 4");
  if (p < 2) usage("needs at least 2 ranks (a pipeline of p = the number of ranks stages)");
  if (layers_total % (2 * p)) usage("--layers must be a multiple of 2p (interleaved runs 2 chunks per rank)");
  CommOptions opts;
  if (backend == "shm") {
    opts.transport = CommOptions::Transport::Shm;
  } else if (backend == "mpi-poll" || backend == "mpi-block") {
    opts.transport = CommOptions::Transport::Mpi;
    opts.blocking_waits = backend == "mpi-block";
  } else {
    usage("--backend must be shm, mpi-poll or mpi-block");
  }
  Recompute rc = Recompute::None;
  if (!parse_name(recompute, rc)) usage("--recompute must be none, light, selective or full");
  if (priority != "auto" && priority != "realtime" && priority != "normal")
    usage("--thread-priority must be auto, realtime or normal");
  std::string why;
  opts.realtime_threads = priority != "normal" && realtime_threads_permitted(&why);
  if (priority == "realtime" && !opts.realtime_threads) usage("real-time threads refused: " + why);
  if (rank == 0)
    std::printf("communication threads: %s\n", opts.realtime_threads ? "real-time" : "normal priority");
  set_compute_threads(1);
  {
    DeviceMesh mesh(1, 1, p, "tp-dp-pp", p, rank);
    // As the trainer does (train.pin_threads): this rank's threads on a core of its own when the ranks fill the cores.
    const NodeRanks node = node_ranks();
    const std::vector<int> cores = pin && node.local_size == omp_get_num_procs() ? rank_cores(node.local_rank, 1)
                                                                                  : std::vector<int>();
    bind_calling_thread(cores);
    MeshComms comms = make_mesh_comms(mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
      return make_communicator(c, name, opts);
    });
    if (!cores.empty()) pin_compute_threads(cores);
    GPTConfig cfg;
    cfg.n_layer = layers_total;
    cfg.n_head = kHeads;
    cfg.d_model = d_model;
    cfg.seq_len = T;
    cfg.vocab_size = kVocab;
    cfg.recompute = rc;
    const std::vector<int> even(p, layers_total / p);
    const PassTimes mine = time_passes(cfg, even, rank, B, T);
    // Theory uses the mean over stages of each pass time.
    double sums[4] = {mine.F, mine.B, mine.Bi, mine.W}, means[4];
    MPI_Allreduce(sums, means, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    PassTimes avg{means[0] / p, means[1] / p, means[2] / p, means[3] / p};

    Profiler prof(false);
    auto make_fill = [&](std::mt19937& rng) {
      return FillFn([&rng, B, T](int, int32_t* tok, int32_t* tgt) {
        for (int i = 0; i < B * T; ++i) tok[i] = tgt[i] = int32_t(rng() % kVocab);
      });
    };

    // Baseline: the whole model on rank 0 alone, one thread, the same m micro-batches per step; --steps steps
    // before the pipeline runs and --steps after (a drift of the machine's speed in between shows as a difference
    // of the two medians), the figure is the median of all.
    // The same in GPipe's order (every forward, then every backward, so all m records are live at once) is a
    // diagnostic: what keeping m micro-batches' activations costs on one rank, without any pipeline.
    std::vector<std::vector<double>> base_before(ms.size()), base_after(ms.size()), gpipe_before(ms.size()),
        gpipe_after(ms.size());
    std::unique_ptr<PipelineChunks> whole;  // rank 0's
    if (rank == 0)
      whole = std::make_unique<PipelineChunks>(cfg, TensorSharding{}, std::vector<int>{layers_total}, 1, 0, DType::F32);
    auto run_baseline = [&](std::vector<std::vector<double>>& times, PipelineSchedule order) {
      sleeping_barrier();
      if (rank == 0) {
        for (size_t j = 0; j < ms.size(); ++j) {
          whole->init(1, 0.02);
          PipelineRunner runner(*whole, nullptr, order, ms[j], B, T, prof);
          Tensor loss = Tensor::zeros({1}, DType::F32);
          std::mt19937 rng(0);
          const FillFn fill = make_fill(rng);
          for (int s = 0; s < steps + kWarmup; ++s) {
            zero_(whole->grads());
            const RunStats st = runner.train(fill, 1e-3, loss, {}, false);
            if (s >= kWarmup) times[j].push_back(st.span_ms);
          }
        }
      }
      sleeping_barrier();
    };
    run_baseline(base_before, PipelineSchedule::OneFOneB);
    run_baseline(gpipe_before, PipelineSchedule::GPipe);

    struct Row {
      PipelineSchedule schedule;
      int m, j;
      double bubble, bubble_min, formula, span, span_min, imbalance, work_ms;
      std::string mem;
    };
    std::vector<Row> rows;
    for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
                                      PipelineSchedule::Interleaved, PipelineSchedule::ZB1}) {
      const int v = schedule == PipelineSchedule::Interleaved ? 2 : 1;
      const std::vector<int> layers(p * v, layers_total / (p * v));
      for (size_t j = 0; j < ms.size(); ++j) {
        const int m = ms[j];
        PipelineChunks model(cfg, TensorSharding{}, layers, p, rank, DType::F32);
        model.init(1, 0.02);
        PipelineRunner runner(model, comms.pp.get(), schedule, m, B, T, prof);
        Tensor loss = Tensor::zeros({1}, DType::F32);
        std::mt19937 rng(rank);
        const FillFn fill = make_fill(rng);
        std::vector<double> fractions, spans, imbalance, work;
        for (int s = 0; s < steps + kWarmup; ++s) {
          zero_(model.grads());
          MPI_Barrier(MPI_COMM_WORLD);  // every rank starts the step together
          const RunStats st = runner.train(fill, 1e-3, loss, {}, false);
          double span = 0, busy_sum = 0, busy_max = 0, busy_min = 0;
          MPI_Allreduce(&st.span_ms, &span, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          MPI_Allreduce(&st.busy_ms, &busy_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
          MPI_Allreduce(&st.busy_ms, &busy_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          MPI_Allreduce(&st.busy_ms, &busy_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
          if (s < kWarmup) continue;  // warm-up: records and buffers allocated
          fractions.push_back((p * span - busy_sum) / (p * span));
          spans.push_back(span);
          imbalance.push_back((busy_max - busy_min) / span);
          work.push_back(busy_sum);
        }
        double act = 0;
        int records = 0;
        for (int c = 0; c < model.size(); ++c) {
          act += runner.records(c) * runner.record_bytes(c) / 1048576.0;
          records += runner.records(c);
        }
        std::vector<double> acts(p);
        std::vector<int> recs(p);
        MPI_Gather(&act, 1, MPI_DOUBLE, acts.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        MPI_Gather(&records, 1, MPI_INT, recs.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (rank == 0) {
          std::string mem;
          for (int r = 0; r < p; ++r) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%s%.2f MiB (%d)", r ? ", " : "", acts[r], recs[r]);
            mem += buf;
          }
          rows.push_back({schedule, m, int(j), median(fractions), minimum(fractions), theory(schedule, p, m, v, avg),
                          median(spans), minimum(spans), median(imbalance), median(work), mem});
        }
      }
    }
    run_baseline(gpipe_after, PipelineSchedule::GPipe);
    run_baseline(base_after, PipelineSchedule::OneFOneB);

    if (rank == 0) {
      std::vector<double> base_med(ms.size()), gpipe_med(ms.size());
      std::printf("CPU: %s\n", cpu_model().c_str());
      std::printf("pipeline of %d ranks (--backend %s), GPT L=%d C=%d T=%d V=%d, micro-batch %d, recompute %s, 1 "
                  "compute thread per rank; %d steps per configuration after %d warm-up steps\n",
                  p, backend.c_str(), layers_total, cfg.d_model, T, cfg.vocab_size, B, recompute.c_str(), steps,
                  kWarmup);
      std::printf("pass times per micro-batch (mean over stages): F %.2f ms, B %.2f ms, split B: input %.2f ms + "
                  "weight %.2f ms; sum of the stages' F + B: %.2f ms\n", avg.F, avg.B, avg.Bi, avg.W,
                  p * (avg.F + avg.B));
      for (size_t j = 0; j < ms.size(); ++j) {
        std::vector<double> all = base_before[j];
        all.insert(all.end(), base_after[j].begin(), base_after[j].end());
        base_med[j] = median(all);
        std::printf("baseline m=%d (rank 0 alone, whole model, 1 thread): %.1f ms (median; before %.1f, after %.1f, "
                    "min %.1f), %.2f ms per micro-batch\n", ms[j], base_med[j], median(base_before[j]),
                    median(base_after[j]), minimum(all), base_med[j] / ms[j]);
        std::vector<double> g = gpipe_before[j];
        g.insert(g.end(), gpipe_after[j].begin(), gpipe_after[j].end());
        gpipe_med[j] = median(g);
        std::printf("  the same in GPipe's order (every forward, then every backward: all %d micro-batches' "
                    "activations live at once): %.1f ms, %.2fx the baseline\n", ms[j], gpipe_med[j],
                    gpipe_med[j] / base_med[j]);
      }
      std::printf("bars: |bubble - formula| <= 0.05; speed-up = baseline / span %s\n\n",
                  p == 2 ? ">= 1.6x" : "(no bar for this p; the bar is set for p = 2)");
      std::printf("%-12s %3s %7s %6s %7s %7s %4s %8s %8s %8s %8s %6s %4s %6s %5s  %s\n", "schedule", "m", "bubble",
                  "min", "formula", "diff", "ok", "span ms", "min", "base ms", "speed-up", "ideal", "ok", "imbal", "work",
                  "peak activations per stage (records)");
      for (const Row& r : rows) {
        const double base = base_med[r.j], speedup = base / r.span, ideal = p * (1.0 - r.formula);
        std::printf("%-12s %3d %7.3f %6.3f %7.3f %+7.3f %4s %8.1f %8.1f %8.1f %7.2fx %5.2fx %4s %6.3f %5.2f  %s\n",
                    name_of(r.schedule), r.m, r.bubble, r.bubble_min, r.formula, r.bubble - r.formula,
                    std::abs(r.bubble - r.formula) <= 0.05 ? "yes" : "NO", r.span, r.span_min, base, speedup, ideal,
                    p == 2 ? (speedup >= 1.6 ? "yes" : "NO") : "-", r.imbalance, r.work_ms / base, r.mem.c_str());
      }
      for (const Row& r : rows)
        if (r.schedule == PipelineSchedule::GPipe)
          std::printf("gpipe m=%d against the one-rank run in GPipe's order: %.2fx (its memory's cost is in both)\n",
                      r.m, gpipe_med[r.j] / r.span);
    }
  }
  MPI_Finalize();
  return 0;
}
