// Timing the model's passes on this machine (see calibration.h).
#include "plan/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/errors.h"
#include "core/threads.h"
#include "kernels/cpu/matmul_backend.h"
#include "optim/optimizer.h"
#include "plan/null_communicator.h"
#include "plan/stage_passes.h"
#include "plan/timing.h"
#include "train/model_config.h"

namespace mt::plan {

namespace {

constexpr double kMinSeconds = 0.25;  // per measured shape, when its passes are short

// Each time is the median of its repetitions: a run's step is a sum of passes and runs at their typical speed, slow
// moments included (the lower quartile, used before, lay 5% below the median on a 2-core VM whose speed varies, and
// the trainer's passes near the median), while a burst of outside load over less than half of the repetitions
// leaves it untouched.

// A time as the calibration file keeps it (3 decimals of a us): a plan made from the file then equals, to the
// bit, the plan that wrote it.
double kept(double us) { return std::round(us * 1000) / 1000; }
PassTimes kept(const PassTimes& t) { return {kept(t.fwd), kept(t.bwd), kept(t.bwd_input), kept(t.bwd_weight)}; }

}  // namespace

// A shape's key and its pass times, as a "stage" or "cold" line holds them.
std::string shape_line(const StageShape& s, const PassTimes& t) {
  return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {:.3f} {:.3f} {:.3f} {:.3f}", s.blocks, int(s.first), int(s.last),
                     s.B, s.tp, int(s.sp), int(s.dtype), int(s.split), s.inflight, int(s.recompute), s.cp, t.fwd, t.bwd,
                     t.bwd_input, t.bwd_weight);
}
bool read_shape_line(std::istream& in, StageShape& s, PassTimes& t) {
  int dt = 0, rc = 0;
  in >> s.blocks >> s.first >> s.last >> s.B >> s.tp >> s.sp >> dt >> s.split >> s.inflight >> rc >> s.cp >> t.fwd >>
      t.bwd >> t.bwd_input >> t.bwd_weight;
  s.dtype = static_cast<DType>(dt);
  s.recompute = static_cast<Recompute>(rc);
  return bool(in);
}

Calibration::Calibration(const ModelConfig& model, const CalibrationOptions& opts) : model_(model), opts_(opts) {
  opts_.reps = std::max(1, opts_.reps);
  opts_.max_timed_blocks = std::max(1, opts_.max_timed_blocks);
}

PassTimes Calibration::stage(const StageShape& s) { return times(s, false); }

PassTimes Calibration::cold(const StageShape& s) { return opts_.evict_bytes > 0 ? times(s, true) : stage(s); }

PassTimes Calibration::times(const StageShape& s, bool cold) {
  const int K = opts_.max_timed_blocks;
  if (s.blocks <= K) {
    std::map<StageShape, PassTimes>& known = cold ? cold_ : stages_;
    auto it = known.find(s);
    if (it != known.end()) return it->second;
    const auto t0 = Clock::now();
    TpTraffic unused;
    const PassTimes t = kept(measure(s, cold ? unused : traffic_[s], cold));
    count_measurement(us_since(t0) * 1e-6);
    if (!cold) rounds_[s].push_back(t);
    return known[s] = t;
  }
  // More blocks than are timed: K blocks with the stage's ends, plus the rest at a middle stage's time per block.
  StageShape timed = s, mid = s;
  timed.blocks = mid.blocks = K;
  mid.first = mid.last = false;
  const PassTimes a = times(timed, cold), b = times(mid, cold);
  const double extra = double(s.blocks - K) / K;
  return {a.fwd + extra * b.fwd, a.bwd + extra * b.bwd, a.bwd_input + extra * b.bwd_input,
          a.bwd_weight + extra * b.bwd_weight};
}

void Calibration::count_measurement(double seconds) {
  seconds_ += seconds;
  ++measurements_;
  if (opts_.progress) {
    std::fprintf(stderr, "\rplanner: timing the passes on this machine: %d shapes, %.1f s", measurements_, seconds_);
  } else if (opts_.progress_every_s > 0 && seconds_ - progress_printed_s_ >= opts_.progress_every_s) {
    std::fprintf(stderr, "planner: timing the passes on this machine: %d shapes, %.1f s\n", measurements_, seconds_);
    progress_printed_s_ = seconds_;
  }
}

int Calibration::retime() {
  // The shapes in key order, not in the order the layouts asked for them.
  for (auto& [s, rounds] : rounds_) {
    const auto t0 = Clock::now();
    TpTraffic unused;
    rounds.push_back(kept(measure(s, unused, false)));
    count_measurement(us_since(t0) * 1e-6);
    auto median_of = [&](double PassTimes::*pass) {
      std::vector<double> v;
      for (const PassTimes& t : rounds) v.push_back(t.*pass);
      return median(v);
    };
    stages_[s] = {median_of(&PassTimes::fwd), median_of(&PassTimes::bwd), median_of(&PassTimes::bwd_input),
                  median_of(&PassTimes::bwd_weight)};
  }
  return int(rounds_.size());
}

const TpTraffic& Calibration::traffic(const StageShape& s) {
  auto it = traffic_.find(s);
  if (it != traffic_.end()) return it->second;
  stage(s);
  const int K = opts_.max_timed_blocks;
  if (s.blocks <= K) return traffic_.at(s);
  // The timed stage's collectives, then a middle stage's per block (its K blocks ask for the same ones in turn) for
  // each block beyond K.
  StageShape timed = s, mid = s;
  timed.blocks = mid.blocks = K;
  mid.first = mid.last = false;
  TpTraffic t = traffic(timed);
  const TpTraffic& m = traffic(mid);
  auto extend = [&](std::vector<TpOp>& out, const std::vector<TpOp>& per_k) {
    CHECK(per_k.size() % K == 0, "calibration: {} collectives over {} middle blocks", per_k.size(), K);
    const size_t per_block = per_k.size() / K;
    for (int b = K; b < s.blocks; ++b) out.insert(out.end(), per_k.begin(), per_k.begin() + per_block);
  };
  extend(t.fwd, m.fwd);
  extend(t.bwd, m.bwd);
  extend(t.bwd_input, m.bwd_input);
  extend(t.bwd_weight, m.bwd_weight);
  return traffic_[s] = t;
}

// One write per cache line of a buffer twice the last-level cache, on every compute thread: what the other ranks'
// passes leave in the caches of a rank whose turn comes.
void Calibration::evict() {
  if (evict_buffer_.empty()) evict_buffer_.assign(size_t(opts_.evict_bytes), 0);
  char* p = evict_buffer_.data();
  const int64_t lines = int64_t(evict_buffer_.size()) / 64;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < lines; ++i) p[i * 64] = char(p[i * 64] + 1);
}

PassTimes Calibration::measure(const StageShape& s, TpTraffic& traffic, bool cold) {
  if (opts_.beside) opts_.beside(&s);
  set_compute_threads(opts_.threads);
  StagePasses passes(model_, s);
  CountingCommunicator &tp = passes.tp, &ring = passes.ring;
  const int k = passes.inflight();
  auto forward = [&](int record) { return passes.forward(record); };
  std::vector<double> f, b, bi, bw;
  for (int i = 0; i + 1 < k; ++i) forward(i);  // fill the pipeline
  // At least opts_.reps repetitions, more (up to 8x) while they take under kMinSeconds: short passes are noisy.
  const auto started = Clock::now();
  for (int rep = 0; rep <= opts_.reps || (rep <= 8 * opts_.reps && us_since(started) < kMinSeconds * 1e6); ++rep) {
    const int j = rep + k - 1;
    // The first repetition's collectives, pass by pass, are the stage's tp traffic.
    auto note = [&](std::vector<TpOp>& pass) {
      if (rep == 0) {
        pass = tp.ops;
        pass.insert(pass.end(), ring.ops.begin(), ring.ops.end());
      }
      tp.ops.clear();
      ring.ops.clear();
    };
    tp.ops.clear();
    ring.ops.clear();
    if (cold) evict();
    const double tf = forward(j);
    note(traffic.fwd);
    if (cold) evict();
    const double tb = passes.backward(j - (k - 1));
    note(s.split ? traffic.bwd_input : traffic.bwd);
    double tw = 0;
    if (s.split) {
      if (cold) evict();
      tw = passes.backward_weights(j - (k - 1));
      note(traffic.bwd_weight);
    }
    if (rep == 0) continue;  // warm-up: first touches of the memory
    f.push_back(tf);
    (s.split ? bi : b).push_back(tb);
    bw.push_back(tw);
  }
  PassTimes t;
  t.fwd = median(f);
  if (s.split) {
    t.bwd_input = median(bi);
    t.bwd_weight = median(bw);
  } else {
    t.bwd = median(b);
  }
  if (opts_.verbose)
    std::fprintf(stderr, "calibration: %d block%s%s%s B=%d tp=%d%s cp=%d %s%s, %d in flight (%zu reps%s): fwd %.0f us, "
                 "bwd %.0f us%s\n", s.blocks, s.blocks == 1 ? "" : "s", s.first ? " +embedding" : "",
                 s.last ? " +head" : "", s.B, s.tp, s.sp ? " sp" : "", s.cp, dtype_name(s.dtype),
                 s.split ? " split" : "",
                 k, f.size(), cold ? ", cold caches" : "", t.fwd,
                 s.split ? t.bwd_input + t.bwd_weight : t.bwd,
                 s.split ? fmt::format(" (input {:.0f} + weight {:.0f})", t.bwd_input, t.bwd_weight).c_str() : "");
  return t;
}

double Calibration::optimizer_us(int64_t numel, DType compute) {
  numel = std::max<int64_t>(1, numel);
  const auto key = std::make_pair(numel, int(compute));
  auto it = optim_.find(key);
  if (it != optim_.end()) return it->second;
  if (opts_.beside) opts_.beside(nullptr);
  const auto start = Clock::now();
  set_compute_threads(opts_.threads);
  const bool masters = compute != DType::F32;
  OptimSegment seg;
  seg.numel = numel;
  seg.decay = true;
  OptimizerSettings os;
  Optimizer opt({seg}, numel, DType::F32, Device::CPU, os, nullptr, nullptr, nullptr, masters);
  Tensor params = Tensor::empty({numel}, compute), grads = Tensor::empty({numel}, DType::F32);
  fill_values(params, 0.02, 3);
  if (masters) {
    Tensor full = Tensor::empty({numel}, DType::F32);
    fill_values(full, 0.02, 3);
    opt.load_masters(full);
  }
  std::vector<double> t;
  for (int rep = 0; rep <= opts_.reps; ++rep) {
    fill_values(grads, 1e-3, 4);  // outside the timing: the backward pass writes them in a run
    const auto t0 = Clock::now();
    opt.step(params, grads, 1e-3);
    if (rep > 0) t.push_back(us_since(t0));
  }
  const double us = median(t);
  seconds_ += us_since(start) * 1e-6;
  ++measurements_;
  if (opts_.verbose) std::fprintf(stderr, "calibration: optimizer over %lld elements (%s): %.0f us\n",
                                  static_cast<long long>(numel), dtype_name(compute), us);
  return optim_[key] = kept(us);
}

double Calibration::zero_grads_us(int64_t numel) {
  numel = std::max<int64_t>(1, numel);
  auto it = zeroing_.find(numel);
  if (it != zeroing_.end()) return it->second;
  if (opts_.beside) opts_.beside(nullptr);
  const auto start = Clock::now();
  set_compute_threads(opts_.threads);
  Tensor grads = Tensor::empty({numel}, DType::F32);
  std::vector<double> t;
  for (int rep = 0; rep <= opts_.reps; ++rep) {
    fill_values(grads, 1e-3, 5);  // a step leaves them written (and in cache as far as they fit)
    const auto t0 = Clock::now();
    zero_(grads);
    if (rep > 0) t.push_back(us_since(t0));
  }
  const double us = median(t);
  seconds_ += us_since(start) * 1e-6;
  return zeroing_[numel] = kept(us);
}

void Calibration::set_slicing(int copies, double slicing) { slicing_[copies] = std::round(slicing * 1e4) / 1e4; }

double Calibration::slicing(int copies) const {
  auto it = slicing_.find(copies);
  return it == slicing_.end() ? -1.0 : it->second;
}

std::string Calibration::header() const {
  // The matmul libraries too: a file timed with another library (train.cpu_matmul) holds other times.
  return fmt::format("meshtrain planner calibration v5 (medians): {} n_head {} n_kv_head {} d_model {} ffn_hidden {} "
                     "seq_len {} vocab {} threads {}{} timed_blocks {} matmul {}",
                     name_of(model_.arch), model_.n_head, model_.n_kv_head, model_.d_model,
                     gpt_config(model_).mlp_hidden(), model_.seq_len, model_.vocab_size, opts_.threads,
                     opts_.neighbours > 0 ? fmt::format(" neighbours {}", opts_.neighbours) : "",
                     opts_.max_timed_blocks, kernels::cpu::describe(kernels::cpu::matmul_backends()));
}

int Calibration::load(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line) || line != header()) return 0;
  int n = 0;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "stage") {
      StageShape s;
      PassTimes t;
      read_shape_line(in, s, t);
      TpTraffic traffic;
      for (std::vector<TpOp>* pass : {&traffic.fwd, &traffic.bwd, &traffic.bwd_input, &traffic.bwd_weight}) {
        size_t count = 0;
        in >> count;
        for (size_t i = 0; in && i < count; ++i) {
          int kind = 0;
          int64_t bytes = 0;
          in >> kind >> bytes;
          pass->push_back({static_cast<CommKind>(kind), bytes});
        }
      }
      if (in) stages_[s] = t, traffic_[s] = traffic, ++n;
    } else if (kind == "cold") {
      StageShape s;
      PassTimes t;
      if (read_shape_line(in, s, t)) cold_[s] = t, ++n;
    } else if (kind == "optimizer") {
      int64_t numel = 0;
      int dt = 0;
      double us = 0;
      in >> numel >> dt >> us;
      if (in) optim_[{numel, dt}] = us, ++n;
    } else if (kind == "zero") {
      int64_t numel = 0;
      double us = 0;
      in >> numel >> us;
      if (in) zeroing_[numel] = us, ++n;
    } else if (kind == "slicing") {
      int copies = 0;
      double value = 0;
      in >> copies >> value;
      if (in && value >= 0) slicing_[copies] = value, ++n;
    }
  }
  return n;
}

void Calibration::save(const std::string& path) const {
  std::ofstream f(path);
  if (!f) throw InputError(fmt::format("--calibration: cannot write {}", path));
  f << header() << "\n";
  for (const auto& [s, t] : stages_) {
    f << "stage " << shape_line(s, t);
    // Then each pass's collectives: their count, and each one's kind and bytes.
    const TpTraffic& traffic = traffic_.at(s);
    for (const std::vector<TpOp>* pass : {&traffic.fwd, &traffic.bwd, &traffic.bwd_input, &traffic.bwd_weight}) {
      f << " " << pass->size();
      for (const TpOp& op : *pass) f << " " << int(op.kind) << " " << op.bytes;
    }
    f << "\n";
  }
  for (const auto& [s, t] : cold_) f << "cold " << shape_line(s, t) << "\n";
  for (const auto& [k, us] : optim_) f << fmt::format("optimizer {} {} {:.3f}\n", k.first, k.second, us);
  for (const auto& [n, us] : zeroing_) f << fmt::format("zero {} {:.3f}\n", n, us);
  for (const auto& [copies, value] : slicing_) f << fmt::format("slicing {} {:.4f}\n", copies, value);
}

}  // namespace mt::plan
