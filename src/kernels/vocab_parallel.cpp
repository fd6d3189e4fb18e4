// Vocab-parallel cross-entropy steps: argument checks and device dispatch (kernels/vocab_parallel.h).
#include "kernels/vocab_parallel.h"

#include <algorithm>

#include "kernels/cpu/vocab_parallel_cpu.h"
#include "kernels/cuda/vocab_parallel_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {

struct Dims {
  int64_t N, Vl, nreal;  // rows, local width, real (non-padding) local columns
};

// Checks shared by the three steps; returns the row count, local width and number of real local columns.
Dims check_logits(const Tensor& logits, int64_t v0, int64_t vocab, const char* op) {
  check_defined(logits, op, "logits"), check_activation(logits, op, "logits");
  CHECK(logits.ndim() >= 1 && logits.dim(-1) >= 1, "{}: logits has shape {}", op, logits.shape().str());
  CHECK(v0 >= 0, "{}: v0 {} must be >= 0", op, v0);
  CHECK(vocab >= 1, "{}: vocab {} must be >= 1", op, vocab);
  const int64_t Vl = logits.dim(-1);
  return {logits.numel() / Vl, Vl, std::clamp<int64_t>(vocab - v0, 0, Vl)};
}

// A per-row buffer (row_max, stats) in the logits' accumulation dtype, on their device, with `numel` elements.
void check_row_buffer(const Tensor& t, const Tensor& logits, int64_t numel, const char* op, const char* name) {
  check_defined(t, op, name);
  check_acc_dtype(t, logits.dtype(), op, name);
  check_same_device(t, logits, op, name, "logits");
  CHECK(t.numel() == numel, "{}: {} has {} elements, expected {}", op, name, t.numel(), numel);
}

void check_targets(const Tensor& targets, const Tensor& logits, int64_t N, int64_t vocab, const char* op) {
  check_defined(targets, op, "targets");
  CHECK(targets.dtype() == DType::I32, "{}: targets must be int32, is {}", op, dtype_name(targets.dtype()));
  check_same_device(targets, logits, op, "targets", "logits");
  CHECK(targets.numel() == N, "{}: targets has {} elements, expected N={}", op, targets.numel(), N);
  // Device targets are not read here (that would synchronise): the GPU kernels never use an out-of-range target
  // as an address and give it a NaN loss (kernels/cuda/vocab_parallel_cuda.cu).
  if (targets.device() == Device::CUDA) return;
  const int32_t* t = targets.data_as<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    CHECK(t[n] >= 0 && t[n] < vocab, "{}: target {} at row {} is outside [0, {})", op, t[n], n, vocab);
}


}  // namespace

void vocab_parallel_xent_local_max(const Tensor& row_max, const Tensor& logits, int64_t v0, int64_t vocab) {
  const char* op = "vocab_parallel_xent_local_max";
  const Dims d = check_logits(logits, v0, vocab, op);
  check_row_buffer(row_max, logits, d.N, op, "row_max");
  if (logits.device() == Device::CUDA) MT_ON_CUDA(op, gpu::vocab_parallel_xent_local_max(row_max, logits, d.nreal));
  dispatch_storage(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::vocab_parallel_xent_local_max<S>(row_max.data_as<cpu::acc_t<S>>(), storage_ptr<S>(logits), d.N, d.Vl,
                                          d.nreal);
  });
}

void vocab_parallel_xent_local_sums(const Tensor& stats, const Tensor& logits, const Tensor& targets,
                                    const Tensor& row_max, int64_t v0, int64_t vocab) {
  const char* op = "vocab_parallel_xent_local_sums";
  const Dims d = check_logits(logits, v0, vocab, op);
  check_row_buffer(stats, logits, 2 * d.N, op, "stats");
  check_row_buffer(row_max, logits, d.N, op, "row_max");
  check_targets(targets, logits, d.N, vocab, op);
  if (logits.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::vocab_parallel_xent_local_sums(stats, logits, targets, row_max, v0, d.nreal));
  dispatch_storage(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    cpu::vocab_parallel_xent_local_sums<S>(stats.data_as<A>(), storage_ptr<S>(logits), targets.data_as<int32_t>(),
                                           row_max.data_as<A>(), d.N, d.Vl, v0, d.nreal);
  });
}

void vocab_parallel_xent_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                const Tensor& targets, const Tensor& row_max, const Tensor& stats, int64_t v0,
                                int64_t vocab, double dloss) {
  const char* op = "vocab_parallel_xent_finish";
  const Dims d = check_logits(logits, v0, vocab, op);
  check_defined(losses, op, "losses"), check_losses(losses, logits, op);
  check_same_device(losses, logits, op, "losses", "logits");
  CHECK(losses.numel() == d.N, "{}: losses has {} elements, expected N={}", op, losses.numel(), d.N);
  check_row_buffer(stats, logits, 2 * d.N, op, "stats");
  check_row_buffer(row_max, logits, d.N, op, "row_max");
  check_targets(targets, logits, d.N, vocab, op);
  if (dlogits.defined()) {
    check_same_dtype(dlogits, logits, op, "dlogits", "logits");
    check_same_device(dlogits, logits, op, "dlogits", "logits");
    CHECK(dlogits.numel() == logits.numel() && dlogits.dim(-1) == d.Vl, "{}: dlogits has shape {}, logits {}", op,
          dlogits.shape().str(), logits.shape().str());
  }
  if (logits.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::vocab_parallel_xent_finish(losses, dlogits, logits, targets, row_max, stats, v0, vocab,
                                                   d.nreal, dloss));
  dispatch_storage(logits.dtype(), [&](auto s) {
    using S = decltype(s);
    using A = cpu::acc_t<S>;
    S* dl = storage_ptr<S>(dlogits);
    const S* l = storage_ptr<S>(logits);
    const A *mx = row_max.data_as<A>(), *st = stats.data_as<A>();
    const int32_t* t = targets.data_as<int32_t>();
    if (losses.dtype() == DType::F32) {
      cpu::vocab_parallel_xent_finish<S, float>(losses.data_as<float>(), dl, l, t, mx, st, d.N, d.Vl, v0, d.nreal,
                                                dloss);
    } else if constexpr (!cpu::is_16bit<S>) {
      cpu::vocab_parallel_xent_finish<S, double>(losses.data_as<double>(), dl, l, t, mx, st, d.N, d.Vl, v0,
                                                 d.nreal, dloss);
    }
  });
}

}  // namespace mt::kernels
