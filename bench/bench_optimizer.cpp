// The optimizer step (gradient norm, clip, AdamW, the masters' cast into the compute copy) over a GPT's parameter
// table, with the segments merged into runs as Optimizer does against one kernel call per parameter, in the same run.
// Run: build/bench/bench_optimizer [--layers 12] [--d-model 768] [--vocab 50304] [--seq 1024] [--steps 20]
//        [--device cpu|cuda]    (defaults: GPT-2 124M; bf16 compute copy over fp32 masters, as the GPU runs train)
//
// The two numbers. FLOPs: ~20 per parameter, nothing next to a step's matmuls. Bytes: the norm reads the fp32
// gradient (4), AdamW reads gradient, master, m, v and writes master, m, v (28), the cast reads the master and writes
// the bf16 copy (6): 38 bytes per parameter, 4.7 GB for 124M. Calls: the norm's sum of squares, AdamW and the cast
// once per parameter each (3 x 148 for GPT-2 124M; on the GPU the sum of squares is two launches: 592) against once per
// run. On the GPU a launch costs microseconds whatever its size, so the per-parameter path pays ~600 of them.
// The "per parameter" baseline is the same Optimizer given segments that lie one element apart (in the params,
// grads and state buffers alike), so no two merge: the same code and kernels, one call per parameter and kernel.
// Prints per variant: kernel calls per step (norm, AdamW and cast together), median ms per step, GB/s at 38 bytes
// per parameter, and the ratio per-parameter / merged.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_args.h"
#include "core/device.h"
#include "core/threads.h"
#include "model/gpt.h"
#include "optim/optimizer.h"

using namespace mt;

namespace {

[[noreturn]] void usage(const std::string& why) {
  bench::usage_exit("bench_optimizer", why, "bench_optimizer [--layers 12] [--d-model 768] [--vocab 50304] "
                    "[--seq 1024] [--steps 20] [--device cpu|cuda]");
}

struct Result {
  double ms;
  size_t calls;
};

// Median ms of `steps` optimizer steps (after 2 warm-up steps), each ended by a device synchronisation. Params,
// grads and the state are `total` elements long, each segment at the same offset in all of them.
Result time_steps(const std::vector<OptimSegment>& segs, int64_t total, Device dev, int steps) {
  OptimizerSettings os;  // clipping on (1.0), as in training
  Optimizer opt(segs, total, DType::F32, dev, os, nullptr, nullptr, nullptr, true);
  Tensor masters = Tensor::zeros({total}, DType::F32), grads = Tensor::zeros({total}, DType::F32);
  float* p = masters.data_as<float>();
  float* g = grads.data_as<float>();
  for (int64_t i = 0; i < total; ++i) {
    p[i] = 0.02f * float((i * 7919) % 201 - 100) / 100.f;
    g[i] = 1e-4f * float((i * 104729) % 199 - 99);
  }
  auto on_device = [dev](const Tensor& host) {
    if (dev == Device::CPU) return host;
    Tensor d = Tensor::zeros(host.shape(), host.dtype(), dev);
    copy_convert(d, host);
    return d;
  };
  const Tensor grads_dev = on_device(grads), masters_dev = on_device(masters);
  Tensor compute = Tensor::zeros({total}, DType::BF16, dev);
  opt.load_masters(masters_dev);
  copy_convert(compute, masters_dev);
  std::vector<double> ms;
  for (int s = 0; s < steps + 2; ++s) {
    device_synchronize(dev);
    const auto t0 = std::chrono::steady_clock::now();
    if (!opt.step(compute, grads_dev, 1e-4)) usage("the gradient norm was not finite");
    device_synchronize(dev);
    if (s >= 2) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], opt.calls_per_step()};
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 12, d_model = 768, vocab = 50304, seq = 1024, steps = 20;
  std::string device = "cpu";
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    bool ok = true;
    if (a == "--layers") ok = bench::arg_int(argv[i + 1], 1, 1024, &layers);
    else if (a == "--d-model") ok = bench::arg_int(argv[i + 1], 64, 1 << 16, &d_model);
    else if (a == "--vocab") ok = bench::arg_int(argv[i + 1], 1, 1 << 22, &vocab);
    else if (a == "--seq") ok = bench::arg_int(argv[i + 1], 1, 1 << 20, &seq);
    else if (a == "--steps") ok = bench::arg_int(argv[i + 1], 1, 100000, &steps);
    else if (a == "--device") device = argv[i + 1];
    else usage("unknown option " + a);
    if (!ok) usage("bad value for " + a + ": " + argv[i + 1]);
  }
  if (d_model % 64) usage("--d-model must be a multiple of 64 (heads of 64)");
  if (device != "cpu" && device != "cuda") usage("--device must be cpu or cuda");
  const Device dev = device == "cuda" ? Device::CUDA : Device::CPU;
  if (dev == Device::CUDA) {
    if (!cuda_available()) usage("--device cuda: no usable GPU (or a build without CUDA)");
    cuda_init(0);
  }
  GPTConfig cfg;
  cfg.n_layer = layers;
  cfg.d_model = d_model;
  cfg.n_head = d_model / 64;
  cfg.seq_len = seq;
  cfg.vocab_size = vocab;
  const ParamTable table = gpt_param_table(cfg);
  const int64_t n = table.total_numel();

  const std::vector<OptimSegment> merged = param_segments(table);
  std::vector<OptimSegment> apart = merged;  // each segment one element after the last one's end, everywhere
  int64_t end = 0;
  for (OptimSegment& g : apart) {
    g.offset = g.state_offset = end;
    end += g.numel + 1;
  }
  const Result a = time_steps(apart, end, dev, steps);
  const Result b = time_steps(merged, n, dev, steps);
  const double gb = 38.0 * double(n) / 1e9;
  const std::string where = dev == Device::CPU ? "cpu, " + std::to_string(compute_threads()) + " threads" : "cuda";
  std::printf("optimizer step, GPT L=%d C=%d V=%d T=%d: %.1fM parameters in %zu tensors, bf16 copy over fp32 masters, "
              "AdamW, clip 1.0, %s, median of %d steps\n", layers, d_model, vocab, seq, n / 1e6, merged.size(),
              where.c_str(), steps);
  std::printf("%-14s %6s %10s %10s %8s\n", "variant", "calls", "ms/step", "GB/s", "ratio");
  std::printf("%-14s %6zu %10.3f %10.1f %8s\n", "per parameter", a.calls, a.ms, gb / (a.ms * 1e-3), "1.00");
  std::printf("%-14s %6zu %10.3f %10.1f %7.2fx\n", "merged runs", b.calls, b.ms, gb / (b.ms * 1e-3), a.ms / b.ms);
  return 0;
}
