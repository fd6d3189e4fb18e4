// gqa_expand / gqa_reduce: argument checks and device dispatch (kernels/gqa.h).
#include "kernels/gqa.h"

#include "kernels/cpu/gqa_cpu.h"
#include "kernels/cuda/gqa_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// qkv [..., (NH + 2 KV) HS] and full [..., 3 NH HS] with the same leading dimensions, dtype and device. Returns N.
void check_gqa(const char* op, const Tensor& qkv, const char* qkv_name, const Tensor& full, const char* full_name,
               int n_head, int n_kv_head, int head_size, int64_t& N) {
  check_defined(qkv, op, qkv_name), check_defined(full, op, full_name), check_activation(qkv, op, qkv_name);
  check_same_dtype(full, qkv, op, full_name, qkv_name), check_same_device(full, qkv, op, full_name, qkv_name);
  CHECK(n_head > 0 && n_kv_head > 0 && head_size > 0, "{}: n_head = {}, n_kv_head = {}, head_size = {} must be > 0", op,
        n_head, n_kv_head, head_size);
  CHECK(n_head % n_kv_head == 0, "{}: n_head = {} is not a multiple of n_kv_head = {}", op, n_head, n_kv_head);
  const int64_t W = int64_t(n_head + 2 * n_kv_head) * head_size, WF = 3 * int64_t(n_head) * head_size;
  CHECK(qkv.ndim() >= 1 && qkv.dim(-1) == W, "{}: {} {} must be [..., (n_head + 2 n_kv_head) * head_size = {}]", op,
        qkv_name, qkv.shape().str(), W);
  N = qkv.numel() / W;
  Shape expected = qkv.shape();
  expected.d[expected.n - 1] = WF;
  check_shape(full, expected, op, full_name);
  // Rows of one are read while the other's rows are written.
  const char *a = static_cast<const char*>(qkv.data()), *b = static_cast<const char*>(full.data());
  CHECK(!(a < b + full.nbytes() && b < a + qkv.nbytes()), "{}: {} overlaps {}", op, full_name, qkv_name);
}
}  // namespace

void gqa_expand(const Tensor& qkv_full, const Tensor& qkv, int n_head, int n_kv_head, int head_size) {
  const char* op = "gqa_expand";
  int64_t N;
  check_gqa(op, qkv, "qkv", qkv_full, "qkv_full", n_head, n_kv_head, head_size, N);
  if (qkv.device() == Device::CUDA) MT_ON_CUDA(op, gpu::gqa_expand(qkv_full, qkv, n_head, n_kv_head, head_size));
  dispatch_storage(qkv.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::gqa_expand<S>(storage_ptr<S>(qkv_full), storage_ptr<S>(qkv), N, n_head, n_kv_head, head_size);
  });
}

void gqa_reduce(const Tensor& dqkv, const Tensor& dqkv_full, int n_head, int n_kv_head, int head_size) {
  const char* op = "gqa_reduce";
  int64_t N;
  check_gqa(op, dqkv, "dqkv", dqkv_full, "dqkv_full", n_head, n_kv_head, head_size, N);
  if (dqkv.device() == Device::CUDA) MT_ON_CUDA(op, gpu::gqa_reduce(dqkv, dqkv_full, n_head, n_kv_head, head_size));
  dispatch_storage(dqkv.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::gqa_reduce<S>(storage_ptr<S>(dqkv), storage_ptr<S>(dqkv_full), N, n_head, n_kv_head, head_size);
  });
}

}  // namespace mt::kernels
