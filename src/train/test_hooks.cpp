// The environment's fault-injection hooks (see test_hooks.h).
#include "train/test_hooks.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/device.h"

namespace mt {

namespace {
// "what@STEP" -> STEP when `what` matches, else -1.
int step_of(const char* env, const char* what) {
  const char* v = std::getenv(env);
  if (!v) return -1;
  const std::string s = v, w = what;
  return s.size() > w.size() + 1 && s.compare(0, w.size(), w) == 0 && s[w.size()] == '@'
             ? std::atoi(s.c_str() + w.size() + 1)
             : -1;
}
}  // namespace

TestHooks TestHooks::from_env() {
  TestHooks h;
  h.grad_inf_step = step_of("MESHTRAIN_INJECT", "grad-inf");
  h.loss_nan_step = step_of("MESHTRAIN_INJECT", "loss-nan");
  h.late_gather_step = step_of("MESHTRAIN_INJECT", "late-gather");
  h.drift_step = step_of("MESHTRAIN_INJECT", "drift");
  h.kill_step = step_of("MESHTRAIN_FAULT", "kill");
  h.stop_step = step_of("MESHTRAIN_FAULT", "stop");
  h.check_step = step_of("MESHTRAIN_FAULT", "check");
  h.skip_step = step_of("MESHTRAIN_FAULT", "skip");
  h.size_step = step_of("MESHTRAIN_FAULT", "size");
  h.reduce_step = step_of("MESHTRAIN_FAULT", "reduce");
  for (const char* env : {"MESHTRAIN_INJECT", "MESHTRAIN_FAULT"})
    if (std::getenv(env)) spdlog::warn("test hook {}={} is set", env, std::getenv(env));
  return h;
}

void inject_grad_inf(const PipelineChunks& model) {
  const ParamTable& t = model.table();
  int p = 0;
  while (p + 1 < t.size() && t[p].shard.whole()) ++p;
  float inf = std::numeric_limits<float>::infinity();
  Tensor at;  // parameter p's first gradient element: in the flat buffer, or (ZeRO-2) in its chunk's unit buffer
  if (model.grads().defined()) at = model.grads().slice(t[p].offset, {1});
  for (int c = 0; c < model.size() && !at.defined(); ++c) {
    const int i = model.chunk(c).table().index_of(t[p].name);
    if (i >= 0 && model.base(c) + model.chunk(c).table()[i].offset == t[p].offset) at = model.chunk(c).grad(i).slice(0, {1});
  }
  copy_convert(at, Tensor(&inf, {1}, DType::F32));  // host or GPU
  spdlog::warn("MESHTRAIN_INJECT: inf injected into the gradient of {} on this rank", t[p].name);
}

void inject_weight_drift(const PipelineChunks& model) {
  CHECK(model.params().defined(), "MESHTRAIN_INJECT=drift needs the weights in a flat buffer (no ZeRO-3)");
  const ParamTable& t = model.table();
  int64_t at = -1;
  std::string name;
  if (model.tied_chunk() >= 0) {
    const ParamSpec& s = model.chunk(model.tied_chunk()).table()[model.tied_param()];
    at = model.base(model.tied_chunk()) + s.offset, name = s.name;
  }
  for (int p = 0; p < t.size() && at < 0; ++p)
    if (t[p].shard.whole()) at = t[p].offset, name = t[p].name;
  CHECK(at >= 0, "MESHTRAIN_INJECT=drift: no parameter with copies on this rank");
  // One ulp in the weights' own dtype (fp32, or bf16/fp16 compute weights): the last bit of the element flipped.
  Tensor one = to_host(model.params().slice(at, {1}));
  static_cast<unsigned char*>(one.data())[0] ^= 1;  // the lowest byte on a little-endian host
  copy_convert(model.params().slice(at, {1}), one);  // host or GPU
  spdlog::warn("MESHTRAIN_INJECT: one weight of {} moved by one ulp on this rank", name);
}

void maybe_fault(const TestHooks& h, int step) {
  CHECK(step != h.check_step, "MESHTRAIN_FAULT: a failed check at step {}", step);
  if (step != h.kill_step && step != h.stop_step) return;
  spdlog::warn("MESHTRAIN_FAULT: this rank receives {} at step {}", step == h.kill_step ? "SIGKILL" : "SIGSTOP", step);
  std::raise(step == h.kill_step ? SIGKILL : SIGSTOP);
}

}  // namespace mt
