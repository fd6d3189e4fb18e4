// bench_ops: where a training step's time goes. For configs A and B (bench_vs_pytorch.py's) it times every
// kernel the GPT calls, forward and backward together, as the op registry's cases (tests/op_cases.cpp, the ones the
// tests check) made at the shapes and dtypes of one step (one micro-batch), times the calls per step,
// and a whole step (zero grads, GPT forward + backward, Optimizer::step) through mt::GPT and mt::Optimizer, in fp32
// or in bf16 (activations and compute weights in bf16, gradients and fp32 masters as precision.compute=bf16 keeps
// them). The matmuls run on the libraries train.cpu_matmul=auto picks on this CPU (printed).
// It prints ms/step per op, its share of the measured step, and the share outside the GEMMs; for the GEMMs the
// GFLOP/s, for every other op the bytes it must move (each input read once, each output written once) and the
// implied GB/s, so the ops far from memory bandwidth stand out; and the GEMMs once more back to back, each layer's
// with operands of its own, against their sum alone.
//
//   build/bench/bench_ops [threads=2] [seconds_per_case=0.2] [configs=AB] [fp32|bf16]
//
// Each time is the best of ~10 ms batches (after a warm-up call) within seconds_per_case: the machine is
// shared, and the best batch is the least disturbed one. Run it on an otherwise idle machine.
// Environment: BENCH_COLD=1 evicts L2 before every timed call of an op (as in a real step, where each op's
// operands were written long before); BENCH_STEP_ONLY=1 times only the whole step (for perf record).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_timing.h"
#include "core/arena.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/cpu/matmul_backend.h"
#include "model/gpt.h"
#include "op_registry.h"
#include "optim/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using mt::DType;
using mt::Tensor;

double g_seconds = 0.2;

// BENCH_COLD=1: before each call, write a 32 MiB buffer so the operands start outside L2, as in a real step.
bool g_cold = false;
std::vector<float> g_flush;

double time_call(const std::function<void()>& f) {
  if (g_cold) {
    if (g_flush.empty()) g_flush.assign(size_t(8) << 20, 0.0f);
    double best = 1e30;
    for (int i = 0; i < 20; ++i) {
      for (float& x : g_flush) x += 1.0f;
      auto t0 = Clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  }
  return mt::bench::time_best(f, g_seconds);
}

struct Config {
  const char* name;
  int L, NH, C, T, V, B;
};

struct Row {
  std::string op;
  int calls;         // per step
  double ms;         // per step (all calls)
  bool gemm;
  double flops;      // per step, GEMMs (and attention's products)
  double bytes;      // per step, minimum traffic
};

void run_config(const Config& cfg, DType dt) {
  const int64_t L = cfg.L, NH = cfg.NH, C = cfg.C, T = cfg.T, B = cfg.B, N = B * T;
  const int64_t Vp = mt::padded_vocab(cfg.V), HS = C / NH;
  std::vector<Row> rows;
  const bool step_only = std::getenv("BENCH_STEP_ONLY") != nullptr;  // for profiling the step alone
  auto add = [&](std::string op, int calls, bool gemm, double flops_per_call, double bytes_per_call,
                 const std::function<void()>& f) {
    const double s = step_only ? 1.0 : time_call(f);
    rows.push_back({op, calls, 1e3 * s * calls, gemm, flops_per_call * calls, bytes_per_call * calls});
  };
  const double f4 = double(mt::dtype_size(dt));  // bytes per activation element

  // Every op as the op registry's case at this config's shapes (tests/op_cases.cpp: the cases the tests check),
  // forward and backward together, inputs made once: `calls` is how often one step runs it.
  const mt::test::OpRun run(dt, dt, mt::Device::CPU);
  auto add_case = [&](const std::string& op, int calls, bool gemm, double flops_per_call, double bytes_per_call,
                      const mt::test::OpCase& c, const mt::test::OpRun& r) {
    const auto call = c.prepare(r);
    add(op, calls, gemm, flops_per_call, bytes_per_call, [&] { call(); });
  };

  // ---- GEMMs (bias included), per layer and the LM head ----
  struct MM {
    const char* name;
    int64_t c, oc;
    int calls;
    bool out_in, bias;
  };
  const MM mms[] = {{"qkv", C, 3 * C, int(L), false, true},
                    {"attn_proj", C, C, int(L), false, true},
                    {"fc", C, 4 * C, int(L), false, true},
                    {"fc_proj", 4 * C, C, int(L), false, true},
                    {"lm_head", C, Vp, 1, true, false}};
  auto matmul_of = [&](const MM& m) { return mt::test::matmul_case(N, m.c, m.oc, m.out_in, m.bias); };
  for (const MM& m : mms)
    add_case(std::string("matmul ") + m.name, m.calls, true, 3 * 2.0 * N * m.c * m.oc, 0, matmul_of(m), run);
  // The same products back to back, layer by layer (the LM head last), each layer's with operands of its own: as in
  // a step, each starts with its operands outside the caches the previous product filled (docs/performance.md,
  // config A).
  double in_sequence_ms = 0;
  if (!step_only) {
    std::vector<std::function<void()>> sequence;
    for (int layer = 0; layer < L; ++layer)
      for (const MM& m : mms)
        if (m.calls == L) sequence.push_back(matmul_of(m).prepare(run));
    for (const MM& m : mms)
      if (m.calls != L) sequence.push_back(matmul_of(m).prepare(run));
    in_sequence_ms = 1e3 * time_call([&] {
      for (const auto& call : sequence) call();
    });
  }

  // ---- attention: causal useful FLOPs, QK^T and PV over the lower triangle, 2 * T(T+1)/2 * HS each per (b, h),
  //      twice that backward ----
  const double tri = double(T) * (T + 1) / 2, att_bytes = f4 * B * NH * tri;
  add_case("attention", int(L), false, 3 * 2.0 * 2 * tri * HS * B * NH,
           f4 * 4 * N * C + att_bytes + f4 * 7 * N * C + att_bytes, mt::test::attention_case(B, T, NH, HS), run);

  // ---- layernorm (2L + 1 per step; 2L of the forwards are fused with the residual add), residual adds, GELU ----
  add_case("layernorm", int(2 * L + 1), false, 0, f4 * 6 * N * C, mt::test::layernorm_case(N, C), run);
  add_case("accumulate (residual)", int(2 * L), false, 0, f4 * 3 * N * C, mt::test::accumulate_case(N, C, false),
           run);
  add_case("gelu", int(L), false, 0, f4 * 5 * N * 4 * C, mt::test::gelu_case(N, 4 * C), run);

  // ---- embedding, loss ----
  add_case("embedding", 1, false, 0, f4 * 5 * N * C + f4 * 3 * T * C,
           mt::test::embedding_case(B, T, C, Vp, cfg.V, false), run);
  add_case("softmax_xent", 1, false, 0, f4 * 2 * N * Vp, mt::test::xent_case(N, Vp, cfg.V), run);

  // ---- the whole model and optimizer (their buffers give the parameter count) ----
  mt::GPTConfig gc;
  gc.n_layer = cfg.L, gc.n_head = cfg.NH, gc.d_model = cfg.C, gc.seq_len = cfg.T, gc.vocab_size = cfg.V;
  mt::GPT model(gc, dt);
  model.init(1234, 0.02);
  mt::OptimizerSettings os;
  const bool mixed = dt != DType::F32;  // the optimizer keeps fp32 masters and rounds them into the bf16 weights
  mt::Optimizer opt(mt::param_segments(model.table()), model.table().total_numel(), DType::F32, mt::Device::CPU, os,
                    nullptr, nullptr, nullptr, mixed);
  const int64_t P = model.params().numel();
  if (mixed) {
    Tensor masters = Tensor::empty({P}, DType::F32);
    mt::copy_convert(masters, model.params());
    opt.load_masters(masters);
  }
  {
    // Gradients, moments and masters are fp32 in both modes.
    const mt::test::OpRun run32(DType::F32, DType::F32, mt::Device::CPU);
    add("zero_ grads", 1, false, 0, 4.0 * P, [&] { mt::zero_(model.grads()); });
    add_case("sum_squares grads", 1, false, 0, 4.0 * P, mt::test::sum_case(P, true), run32);
    // Mixed precision: AdamW also writes the bf16 weights (the registry case's 16-bit run).
    add_case(mixed ? "adamw + bf16 weights" : "adamw", 1, false, 0, (4.0 * 7 + (mixed ? mt::dtype_size(dt) : 0)) * P,
             mt::test::adamw_case(P, 1), mixed ? run : run32);
  }

  mt::Arena act_arena, scratch_arena;
  mt::Activations acts = model.alloc_activations(act_arena, int(B), int(T));
  for (int64_t i = 0; i < N; ++i) {
    acts.tokens.data_as<int32_t>()[i] = int32_t((i * 2654435761u) % cfg.V);
    acts.targets.data_as<int32_t>()[i] = int32_t((i * 40503u + 7) % cfg.V);
  }
  Tensor loss_sum = Tensor::zeros({1}, DType::F32);
  double lr = 1e-4;  // small: the step is timed many times
  auto step = [&] {
    mt::zero_(model.grads());
    mt::zero_(loss_sum);
    model.forward(acts, 1.0 / N, loss_sum);
    scratch_arena.reset();
    model.backward(acts, scratch_arena);
    opt.step(model.params(), model.grads(), lr);
  };
  const double step_ms = 1e3 * time_call(step);
  if (step_only) {
    std::printf("config %s: step %.3f ms (%.0f tok/s)\n", cfg.name, step_ms, N / (step_ms * 1e-3));
    return;
  }
  const double fb_ms = 1e3 * time_call([&] {
    model.forward(acts, 1.0 / N, loss_sum);
    scratch_arena.reset();
    model.backward(acts, scratch_arena);
  });

  double sum_ms = 0, gemm_ms = 0, gemm_flops = 0;
  for (const Row& r : rows) {
    sum_ms += r.ms;
    if (r.gemm) gemm_ms += r.ms, gemm_flops += r.flops;
  }
  std::printf("\n=== config %s, %s: L%d NH%d C%d T%d V%d (Vp %lld) B%d, N=%lld, %lld params ===\n", cfg.name,
              mt::dtype_name(dt), cfg.L, cfg.NH, cfg.C, cfg.T, cfg.V, (long long)Vp, cfg.B, (long long)N,
              (long long)P);
  std::printf("%-24s %5s %9s %7s %9s %9s %8s\n", "op", "calls", "ms/step", "share", "GFLOP/s", "MB/step", "GB/s");
  for (const Row& r : rows) {
    const double s = r.ms * 1e-3;
    char gf[16] = "", mb[16] = "", gbs[16] = "";
    if (r.flops > 0) std::snprintf(gf, sizeof gf, "%.1f", r.flops / s * 1e-9);
    if (r.bytes > 0) {
      std::snprintf(mb, sizeof mb, "%.2f", r.bytes * 1e-6);
      std::snprintf(gbs, sizeof gbs, "%.1f", r.bytes / s * 1e-9);
    }
    std::printf("%-24s %5d %9.3f %6.1f%% %9s %9s %8s\n", r.op.c_str(), r.calls, r.ms, 100 * r.ms / step_ms, gf, mb,
                gbs);
  }
  std::printf("%-24s %5s %9.3f %6.1f%%   (%.1f GFLOP/s over %.2f GFLOP)\n", "sum of GEMMs", "", gemm_ms,
              100 * gemm_ms / step_ms, gemm_flops / (gemm_ms * 1e-3) * 1e-9, gemm_flops * 1e-9);
  std::printf("%-24s %5s %9.3f %6.1f%%   (%.2fx the sum: each layer's own operands, as in the step)\n",
              "GEMMs back to back", "", in_sequence_ms, 100 * in_sequence_ms / step_ms, in_sequence_ms / gemm_ms);
  std::printf("%-24s %5s %9.3f %6.1f%%\n", "sum of non-GEMM ops", "", sum_ms - gemm_ms,
              100 * (sum_ms - gemm_ms) / step_ms);
  std::printf("%-24s %5s %9.3f %6.1f%%\n", "sum of all ops", "", sum_ms, 100 * sum_ms / step_ms);
  std::printf("%-24s %5s %9.3f %6.1f%%   (%.0f tok/s; forward+backward alone %.3f ms)\n", "measured step", "",
              step_ms, 100.0, N / (step_ms * 1e-3), fb_ms);
  std::printf("outside GEMMs (measured step - GEMMs): %.3f ms = %.1f%% of the step\n", step_ms - gemm_ms,
              100 * (step_ms - gemm_ms) / step_ms);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  const std::string which = argc > 3 ? argv[3] : "AB", precision = argc > 4 ? argv[4] : "fp32";
  if (argc > 5 || (precision != "fp32" && precision != "bf16") || (argc > 1 && !mt::bench::arg_int(argv[1], 1, 4096, &threads)) ||
      (argc > 2 && !mt::bench::arg_number(argv[2], 1e-3, 3600, &g_seconds)) || which.empty() ||
      which.find_first_not_of("AB") != std::string::npos) {
    mt::bench::usage_exit("bench_ops", "bad arguments",
                          "bench_ops [THREADS >= 1 [SECONDS_PER_CASE > 0 [CONFIGS: A, B or AB [fp32|bf16]]]]");
  }
  mt::set_compute_threads(threads);
  g_cold = std::getenv("BENCH_COLD") != nullptr;
  std::printf("bench_ops: %d threads, best ~10 ms batch within %.2f s per case; matmuls: %s\n", threads, g_seconds,
              mt::kernels::cpu::describe(mt::kernels::cpu::matmul_backends()).c_str());
  const DType dt = precision == "bf16" ? DType::BF16 : DType::F32;
  const Config configs[] = {{"A", 4, 4, 256, 64, 512, 4}, {"B", 4, 8, 384, 128, 2048, 8}};
  for (const Config& c : configs)
    if (which.find(c.name) != std::string::npos) run_config(c, dt);
  return 0;
}
