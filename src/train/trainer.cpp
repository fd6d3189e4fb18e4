// The step loop. Per step: zero gradients; for each micro-batch, forward (the loss's gradient scaled by
// 1 / tokens in the global batch) and backward (gradients accumulate); clip and AdamW; then the single read
// of device scalars (loss and gradient norm) for the log. Activations and scratch come from arenas sized
// by the first step, so steady-state steps allocate nothing.
#include "train/trainer.h"

#include <mpi.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/arena.h"
#include "core/errors.h"
#include "core/threads.h"
#include "data/batcher.h"
#include "model/gpt.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "train/dataset.h"
#include "train/metrics.h"

namespace mt {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double read_scalar(const Tensor& t) {
  return t.dtype() == DType::F64 ? t.data_as<double>()[0] : t.data_as<float>()[0];
}

std::string format_duration(double seconds) {
  long s = std::lround(std::max(0.0, seconds));
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

int ranks_on_this_node() {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int n = 1;
  MPI_CHECK(MPI_Comm_size(node, &n));
  MPI_CHECK(MPI_Comm_free(&node));
  return n;
}

GPTConfig gpt_config(const ModelConfig& m) {
  GPTConfig g;
  g.n_layer = m.n_layer;
  g.n_head = m.n_head;
  g.d_model = m.d_model;
  g.seq_len = m.seq_len;
  g.vocab_size = m.vocab_size;
  return g;
}

// Mean loss over `batches` global batches of the validation stream (the same windows at every evaluation).
double evaluate(const GPT& model, Activations& acts, Batcher& val, const Config& cfg, const Tensor& loss_sum) {
  zero_(loss_sum);
  const int mb = cfg.train.micro_batch, gb = cfg.train.global_batch;
  for (int b = 0; b < cfg.train.eval_batches; ++b)
    for (int first = 0; first < gb; first += mb) {
      val.fill(b, first, mb, acts.tokens.data_as<int32_t>(), acts.targets.data_as<int32_t>());
      model.forward(acts, 0.0, loss_sum);
    }
  return read_scalar(loss_sum) / (double(cfg.train.eval_batches) * gb * cfg.model.seq_len);
}

}  // namespace

void run_training(const Config& cfg) {
  // Valid names that later versions implement: refuse them up front rather than train something else.
  if (cfg.precision.compute != "fp32")
    input_error("precision.compute={}: this version trains in fp32 only (mixed precision is not built yet)",
                cfg.precision.compute);
  if (cfg.device != "cpu") input_error("device={}: this build has no CUDA backend; use device=cpu", cfg.device);
  if (cfg.optim.zero != 0) input_error("optim.zero=1: ZeRO-1 needs data parallelism, which this version lacks");
  if (cfg.run.profile) input_error("run.profile=true: the profiler is not built yet");
  if (cfg.run.checkpoint_every != 0) input_error("run.checkpoint_every={}: checkpoints are not built yet", cfg.run.checkpoint_every);
  if (cfg.run.resume != "auto" && cfg.run.resume != "none")
    input_error("run.resume={}: checkpoints are not built yet; use auto or none", cfg.run.resume);
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : default_compute_threads(ranks_on_this_node());
  set_compute_threads(threads);
  spdlog::info("mesh: dp=1 x tp=1 x pp=1 (1 rank), device {}, {} compute threads", cfg.device, threads);

  std::filesystem::create_directories(cfg.run.dir);
  {
    std::ofstream f(cfg.run.dir + "/config.yaml");
    if (!f) input_error("run.dir: cannot write {}/config.yaml", cfg.run.dir);
    f << to_yaml(cfg);
  }

  Dataset data = load_dataset(cfg);
  spdlog::info("data: {}", data.train.description);
  if (data.entropy_rate_nats >= 0)
    spdlog::info("data: best achievable loss (entropy rate) {:.4f} nats; uniform guess ln(V) = {:.4f}",
                 data.entropy_rate_nats, std::log(double(cfg.model.vocab_size)));

  const int T = cfg.model.seq_len, mb = cfg.train.micro_batch, gb = cfg.train.global_batch;
  const int n_micro = gb / mb;
  GPT model(gpt_config(cfg.model), DType::F32, Device::CPU);
  if (cfg.model.init_from.empty()) model.init(cfg.train.seed, cfg.model.init_std);
  else model.load_safetensors(cfg.model.init_from);
  spdlog::info("model: GPT-2 L={} NH={} C={} T={} V={} (padded {}): {:.3f}M parameters{}", cfg.model.n_layer,
               cfg.model.n_head, cfg.model.d_model, T, cfg.model.vocab_size, model.vocab_padded(),
               model.num_parameters() / 1e6, cfg.model.init_from.empty() ? "" : ", from " + cfg.model.init_from);

  OptimizerSettings os;
  os.beta1 = cfg.optim.beta1;
  os.beta2 = cfg.optim.beta2;
  os.eps = cfg.optim.eps;
  os.weight_decay = cfg.optim.weight_decay;
  os.grad_clip = cfg.train.grad_clip;
  Optimizer opt(param_segments(model.table()), model.table().total_numel(), DType::F32, Device::CPU, os);
  LRSchedule sched{cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};

  Arena act_arena, scratch_arena;
  Activations acts = model.alloc_activations(act_arena, mb, T);
  Tensor loss_sum = Tensor::zeros({1}, DType::F32);
  Batcher train_batches(&data.train.tokens, T, gb, cfg.data.order, cfg.train.seed);
  Batcher val_batches(&data.val.tokens, T, gb, "sequential", cfg.train.seed);
  spdlog::info("memory: parameters {:.1f} MiB, gradients {:.1f} MiB, optimizer state {:.1f} MiB, activations "
               "{:.1f} MiB per micro-batch ({} micro-batches of {} x {} tokens per step)",
               model.params().nbytes() / 1048576.0, model.grads().nbytes() / 1048576.0,
               opt.state_bytes() / 1048576.0, act_arena.bytes_in_use() / 1048576.0, n_micro, mb, T);

  MetricsWriter metrics(cfg.run.dir + "/metrics.jsonl");
  const double dloss = 1.0 / (double(gb) * T);
  const int64_t tokens_per_step = int64_t(gb) * T;
  double total_ms = 0, last_loss = 0, last_val = -1;
  const auto run_start = Clock::now();
  for (int step = 1; step <= cfg.train.steps; ++step) {
    const auto t0 = Clock::now();
    zero_(model.grads());
    zero_(loss_sum);
    for (int m = 0; m < n_micro; ++m) {
      train_batches.fill(step - 1, int64_t(m) * mb, mb, acts.tokens.data_as<int32_t>(), acts.targets.data_as<int32_t>());
      model.forward(acts, dloss, loss_sum);
      scratch_arena.reset();
      model.backward(acts, scratch_arena);
    }
    if (step == 1 && !cfg.run.dump_grads.empty()) model.export_grads(cfg.run.dump_grads);
    const double lr = sched.at(step);
    opt.step(model.params(), model.grads(), lr);

    StepMetrics row;
    row.step = step;
    row.loss = read_scalar(loss_sum) * dloss;
    row.grad_norm = read_scalar(opt.grad_norm());
    row.lr = lr;
    row.tokens = tokens_per_step * step;
    row.step_ms = ms_since(t0);
    row.compute_ms = row.step_ms;
    row.tokens_per_s = tokens_per_step / (row.step_ms / 1000.0);
    if (!std::isfinite(row.loss)) {
      metrics.write(row);
      throw std::runtime_error(fmt::format("the loss became non-finite ({}) at step {}", row.loss, step));
    }
    if (cfg.train.eval_every > 0 && (step % cfg.train.eval_every == 0 || step == cfg.train.steps)) {
      row.val_loss = evaluate(model, acts, val_batches, cfg, loss_sum);
      last_val = row.val_loss;
    }
    metrics.write(row);
    total_ms += row.step_ms;
    last_loss = row.loss;
    if (step % cfg.run.log_every == 0 || step == cfg.train.steps || step == 1) {
      const double eta_s = (cfg.train.steps - step) * (ms_since(run_start) / step) / 1000.0;
      spdlog::info("step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | {:.1f} ms/step | "
                   "ETA {}",
                   step, cfg.train.steps, row.loss, row.val_loss >= 0 ? fmt::format(" | val {:.4f}", row.val_loss) : "",
                   lr, row.grad_norm, row.tokens_per_s, row.step_ms, format_duration(eta_s));
    }
  }

  model.export_safetensors(cfg.run.dir + "/model.safetensors");
  model.export_hf_config(cfg.run.dir + "/config.json");
  spdlog::info("done: {} steps, final loss {:.4f}{}, {:.0f} tok/s on average, peak RSS {:.1f} MiB, activation "
               "arena {:.1f} MiB ({} block allocations); wrote {}/model.safetensors and config.json",
               cfg.train.steps, last_loss, last_val >= 0 ? fmt::format(", val loss {:.4f}", last_val) : "",
               tokens_per_step * cfg.train.steps / (total_ms / 1000.0), peak_rss_mib(),
               (act_arena.bytes_reserved() + scratch_arena.bytes_reserved()) / 1048576.0,
               act_arena.block_allocations() + scratch_arena.block_allocations(), cfg.run.dir);
}

}  // namespace mt
