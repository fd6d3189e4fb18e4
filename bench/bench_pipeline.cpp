// Pipeline bubbles and activation memory per schedule, measured against theory in the same run.
// Run: mpiexec -n 2 build/bench/bench_pipeline [--steps 12] [--layers 8] (p = the number of ranks)
//
// A GPT (L blocks of C = 256, vocabulary 64 so the head is ~1% of a stage) is cut into p stages; each rank times
// its own passes (forward F, one-pass backward B, and the zero-bubble split: input pass Bi, weight pass W), then
// runs every schedule for m = 4 and 8 micro-batches through the trainer's executor. Per step, the pipeline
// phase lasts as long as its slowest rank (span); a rank's bubble is span minus its own compute, and the bubble
// fraction is that over span, averaged over ranks. Theory, with the measured pass times:
//   gpipe, 1f1b   (p-1) / (m + p-1)
//   interleaved   (p-1)/v / (m + (p-1)/v)                           (v = 2 chunks per rank)
//   zb1           (p-1)(F + Bi - W) / (m(F + Bi + W) + (p-1)(F + Bi - W))   (ZB-H1; a third of 1F1B's when F = Bi = W)
// The baseline is the same work without a pipeline: the sum of the ranks' compute, against the span (speed-up).
// On a small shared machine the ranks' compute times for identical work differ from step to step by up to 20% of
// the span (the two ranks' communication threads, memory traffic, other processes); the formulas assume equal
// stages, and an imbalance of x adds up to about x to the measured bubble. So each configuration runs --steps
// steps and reports the one whose ranks' compute times were closest (its imbalance is printed).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "comm/make_communicator.h"
#include "comm/mpi_init.h"
#include "core/threads.h"
#include "model/pipeline_chunks.h"
#include "parallel/mesh.h"
#include "train/pipeline_runner.h"

using namespace mt;

namespace {

struct PassTimes {
  double F = 0, B = 0, Bi = 0, W = 0;  // ms per micro-batch on this rank's stage
};

// Times this rank's stage alone (no communication): forward, one-pass backward, input pass + weight pass.
PassTimes time_passes(const GPTConfig& cfg, const std::vector<int>& layers, int stage, int B, int T) {
  GPT g(stage_config(cfg, layers, stage), DType::F32);
  g.init(1, 0.02);
  Arena arena, scratch;
  Activations a = g.alloc_activations(arena, B, T, true);
  for (int64_t i = 0; i < a.tokens.numel(); ++i) a.tokens.data_as<int32_t>()[i] = a.targets.data_as<int32_t>()[i] = i % 64;
  zero_(a.input());
  const bool last = g.config().last_stage();
  Tensor dout = last ? Tensor() : Tensor::zeros(a.output().shape(), DType::F32);
  Tensor din = g.config().first_stage() ? Tensor() : Tensor::zeros(a.input().shape(), DType::F32);
  const Tensor none;
  PassTimes t;
  t.F = 1e3 * bench::time_best([&] { g.forward(a, last ? 1e-3 : 0.0, none); }, 0.3);
  t.B = 1e3 * bench::time_best([&] { scratch.reset(); g.backward(a, scratch, {}, BackwardPart::All, dout, din); }, 0.3);
  t.Bi = 1e3 * bench::time_best(
                   [&] { scratch.reset(); g.backward(a, scratch, {}, BackwardPart::InputOnly, dout, din); }, 0.3);
  t.W = 1e3 * bench::time_best([&] { g.backward_weights(a); }, 0.3);
  return t;
}

double theory(const std::string& schedule, int p, int m, int v, const PassTimes& t) {
  if (schedule == "interleaved") return (p - 1.0) / v / (m + (p - 1.0) / v);
  if (schedule == "zb1") {
    const double bubble = (p - 1) * std::max(0.0, t.F + t.Bi - t.W);
    return bubble / (m * (t.F + t.Bi + t.W) + bubble);
  }
  return (p - 1.0) / (m + p - 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  init_mpi(&argc, &argv);
  int steps = 12, layers_total = 8;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--layers")) layers_total = std::atoi(argv[i + 1]);
  }
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  set_compute_threads(1);
  {
    DeviceMesh mesh(1, 1, p, "tp-dp-pp", p, rank);
    CommOptions opts;
    opts.blocking_waits = true;  // one compute thread per rank: communication threads must not spin
    MeshComms comms = make_mesh_comms(mesh, MPI_COMM_WORLD, [&](MPI_Comm c, const std::string& name) {
      return make_communicator(c, name, opts);
    });
    GPTConfig cfg;
    cfg.n_layer = layers_total;
    cfg.n_head = 4;
    cfg.d_model = 256;
    cfg.seq_len = 64;
    cfg.vocab_size = 64;
    const int B = 4, T = cfg.seq_len;
    const std::vector<int> even(p, layers_total / p);
    const PassTimes mine = time_passes(cfg, even, rank, B, T);
    // Theory uses the mean over stages of each pass time.
    double sums[4] = {mine.F, mine.B, mine.Bi, mine.W}, means[4];
    MPI_Allreduce(sums, means, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    PassTimes avg{means[0] / p, means[1] / p, means[2] / p, means[3] / p};
    if (rank == 0) {
      std::printf("pipeline of %d ranks, GPT L=%d C=%d T=%d V=%d, micro-batch %d, 1 compute thread per rank\n", p,
                  layers_total, cfg.d_model, T, cfg.vocab_size, B);
      std::printf("pass times per micro-batch (mean over stages): F %.2f ms, B %.2f ms, split B: input %.2f ms + "
                  "weight %.2f ms\n\n", avg.F, avg.B, avg.Bi, avg.W);
      std::printf("%-12s %3s %9s %9s %7s %6s %9s %9s %9s  %s\n", "schedule", "m", "bubble", "theory", "diff", "ok",
                  "imbalance", "span ms", "speed-up", "peak activations per stage (records)");
    }
    Profiler prof(false);
    for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb1"}) {
      const int v = std::string(schedule) == "interleaved" ? 2 : 1;
      const std::vector<int> layers(p * v, layers_total / (p * v));
      for (int m : {4, 8}) {
        PipelineChunks model(cfg, layers, p, rank, DType::F32);
        model.init(1, 0.02);
        PipelineRunner runner(model, comms.pp.get(), schedule, m, B, T, prof);
        Tensor loss = Tensor::zeros({1}, DType::F32);
        std::mt19937 rng(rank);
        const FillFn fill = [&](int, int32_t* tok, int32_t* tgt) {
          for (int i = 0; i < B * T; ++i) tok[i] = tgt[i] = int32_t(rng() % 64);
        };
        std::vector<double> fractions, spans, speedups, imbalance;
        for (int s = 0; s < steps + 2; ++s) {
          zero_(model.grads());
          MPI_Barrier(MPI_COMM_WORLD);  // every rank starts the step together
          const RunStats st = runner.train(fill, 1e-3, loss, {}, false);
          double span = 0, busy_sum = 0, busy_max = 0, busy_min = 0;
          MPI_Allreduce(&st.span_ms, &span, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          MPI_Allreduce(&st.busy_ms, &busy_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
          MPI_Allreduce(&st.busy_ms, &busy_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
          MPI_Allreduce(&st.busy_ms, &busy_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
          if (s < 2) continue;  // warm-up: records and buffers allocated
          fractions.push_back((p * span - busy_sum) / (p * span));
          spans.push_back(span);
          speedups.push_back(busy_sum / span);
          imbalance.push_back((busy_max - busy_min) / span);
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
          // The step whose stages ran closest to equal speed (the formulas' assumption; see the header).
          const size_t best = std::min_element(imbalance.begin(), imbalance.end()) - imbalance.begin();
          const double measured = fractions[best], th = theory(schedule, p, m, v, avg);
          std::string mem;
          for (int r = 0; r < p; ++r) mem += (r ? ", " : "") + std::to_string(acts[r]).substr(0, 5) + " MiB (" +
                                             std::to_string(recs[r]) + ")";
          std::printf("%-12s %3d %9.3f %9.3f %+7.3f %6s %9.3f %9.1f %8.2fx  %s\n", schedule, m, measured, th,
                      measured - th, std::abs(measured - th) <= 0.05 ? "yes" : "NO", imbalance[best], spans[best],
                      speedups[best], mem.c_str());
        }
      }
    }
  }
  MPI_Finalize();
  return 0;
}
