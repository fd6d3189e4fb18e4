// gqa_expand / gqa_reduce: argument checks and device dispatch (kernels/gqa.h).
#include "kernels/gqa.h"

#include "kernels/cpu/gqa_cpu.h"
#include "kernels/cuda/gqa_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// A tensor argument and its name in messages.
struct Arg {
  const Tensor& t;
  const char* name;
};

// q [..., NH HS], k and v [..., KV HS] and full [..., 3 NH HS], with q's leading dimensions, dtype and device.
// Returns N, the number of rows.
int64_t check_gqa(const char* op, Arg q, Arg k, Arg v, Arg full, int n_head, int n_kv_head, int head_size) {
  check_defined(q.t, op, q.name), check_activation(q.t, op, q.name);
  CHECK(n_head > 0 && n_kv_head > 0 && head_size > 0, "{}: n_head = {}, n_kv_head = {}, head_size = {} must be > 0", op,
        n_head, n_kv_head, head_size);
  CHECK(n_head % n_kv_head == 0, "{}: n_head = {} is not a multiple of n_kv_head = {}", op, n_head, n_kv_head);
  const int64_t QW = int64_t(n_head) * head_size, KW = int64_t(n_kv_head) * head_size;
  CHECK(q.t.ndim() >= 1 && q.t.dim(-1) == QW, "{}: {} {} must be [..., n_head * head_size = {}]", op, q.name,
        q.t.shape().str(), QW);
  for (auto [a, width] : {std::pair{&k, KW}, std::pair{&v, KW}, std::pair{&full, 3 * QW}}) {
    check_defined(a->t, op, a->name), check_same_dtype(a->t, q.t, op, a->name, q.name);
    check_same_device(a->t, q.t, op, a->name, q.name);
    Shape expected = q.t.shape();
    expected.d[expected.n - 1] = width;
    check_shape(a->t, expected, op, a->name);
  }
  return q.t.numel() / QW;
}

void check_no_overlap(const char* op, Arg a, Arg b) {
  CHECK(!overlaps(a.t, b.t), "{}: {} overlaps {}", op, a.name, b.name);
}
}  // namespace

void gqa_expand(const Tensor& qkv_full, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int n_kv_head,
                int head_size) {
  const char* op = "gqa_expand";
  const Arg aq{q, "q"}, ak{k, "k"}, av{v, "v"}, afull{qkv_full, "qkv_full"};
  const int64_t N = check_gqa(op, aq, ak, av, afull, n_head, n_kv_head, head_size);
  // A gather: the rows of q, k and v are read while other rows of qkv_full are written (the inputs are only read,
  // so they may overlap one another).
  for (const Arg& a : {aq, ak, av}) check_no_overlap(op, afull, a);
  if (q.device() == Device::CUDA) MT_ON_CUDA(op, gpu::gqa_expand(qkv_full, q, k, v, n_head, n_kv_head, head_size));
  dispatch_storage(q.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::gqa_expand<S>(storage_ptr<S>(qkv_full), storage_ptr<S>(q), storage_ptr<S>(k), storage_ptr<S>(v), N, n_head,
                       n_kv_head, head_size);
  });
}

void gqa_reduce(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dqkv_full, int n_head,
                int n_kv_head, int head_size) {
  const char* op = "gqa_reduce";
  const Arg aq{dq, "dq"}, ak{dk, "dk"}, av{dv, "dv"}, afull{dqkv_full, "dqkv_full"};
  const int64_t N = check_gqa(op, aq, ak, av, afull, n_head, n_kv_head, head_size);
  // dqkv_full is read while the outputs are written, and two outputs sharing an element would leave it to
  // whichever write comes last.
  check_no_overlap(op, aq, ak), check_no_overlap(op, aq, av), check_no_overlap(op, ak, av);
  for (const Arg& a : {aq, ak, av}) check_no_overlap(op, a, afull);
  if (dq.device() == Device::CUDA) MT_ON_CUDA(op, gpu::gqa_reduce(dq, dk, dv, dqkv_full, n_head, n_kv_head, head_size));
  dispatch_storage(dq.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::gqa_reduce<S>(storage_ptr<S>(dq), storage_ptr<S>(dk), storage_ptr<S>(dv), storage_ptr<S>(dqkv_full), N, n_head,
                       n_kv_head, head_size);
  });
}

}  // namespace mt::kernels
