// sgd_update and outer_nesterov_update: argument checks, the CPU loops and the dispatch to the GPU kernels
// (kernels/sgd.h).
#include "kernels/sgd.h"

#include "kernels/cuda/sgd_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
template <typename P, typename G>
void sgd_cpu(P* p, const G* g, P* b, double gs, int64_t n, const SGDHyper& h) {
  const P decay = P(1.0 - h.lr * h.weight_decay), lr = P(h.lr), mom = P(h.momentum), scale = P(gs);
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) {
    const P grad = P(g[i]) * scale;
    b[i] = mom * b[i] + grad;
    p[i] = p[i] * decay - lr * b[i];
  }
}
template <typename P>
void outer_nesterov_cpu(P* a, P* v, P* x, P lr, P mu, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) {
    const P d = a[i] - x[i];
    v[i] = mu * v[i] + d;
    a[i] -= lr * (d + mu * v[i]);
    x[i] = a[i];
  }
}
}  // namespace

void outer_nesterov_update(const Tensor& anchor, const Tensor& velocity, const Tensor& x, double lr, double momentum) {
  const char* op = "outer_nesterov_update";
  check_defined(anchor, op, "anchor"), check_defined(velocity, op, "velocity"), check_defined(x, op, "x");
  CHECK(anchor.dtype() == DType::F32 || anchor.dtype() == DType::F64, "{}: anchor must be fp32 or fp64, is {}", op,
        dtype_name(anchor.dtype()));
  check_same_dtype(velocity, anchor, op, "velocity", "anchor"), check_same_dtype(x, anchor, op, "x", "anchor");
  check_same_device(velocity, anchor, op, "velocity", "anchor"), check_same_device(x, anchor, op, "x", "anchor");
  CHECK(velocity.numel() == anchor.numel() && x.numel() == anchor.numel(),
        "{}: anchor/velocity/x have {}/{}/{} elements", op, anchor.numel(), velocity.numel(), x.numel());
  if (anchor.device() == Device::CUDA) MT_ON_CUDA(op, gpu::outer_nesterov_update(anchor, velocity, x, lr, momentum));
  if (anchor.dtype() == DType::F64)
    outer_nesterov_cpu(anchor.data_as<double>(), velocity.data_as<double>(), x.data_as<double>(), lr, momentum,
                       anchor.numel());
  else
    outer_nesterov_cpu(anchor.data_as<float>(), velocity.data_as<float>(), x.data_as<float>(), float(lr),
                       float(momentum), anchor.numel());
}

void sgd_update(const Tensor& params, const Tensor& grads, const Tensor& buf, const Tensor& grad_scale,
                const SGDHyper& h) {
  const char* op = "sgd_update";
  check_defined(params, op, "params"), check_defined(grads, op, "grads"), check_defined(buf, op, "buf");
  check_defined(grad_scale, op, "grad_scale");
  check_float(params, op, "params"), check_float(grads, op, "grads"), check_float(grad_scale, op, "grad_scale");
  check_same_dtype(buf, params, op, "buf", "params");
  CHECK(!(params.dtype() == DType::F64 && grads.dtype() == DType::F32),
        "{}: fp64 params with fp32 grads is not supported", op);
  for (const Tensor* t : {&grads, &buf, &grad_scale}) check_same_device(*t, params, op, "an argument", "params");
  CHECK(grads.numel() == params.numel() && buf.numel() == params.numel(), "{}: params/grads/buf have {}/{}/{} elements",
        op, params.numel(), grads.numel(), buf.numel());
  CHECK(grad_scale.numel() == 1, "{}: grad_scale must have 1 element, has {}", op, grad_scale.numel());
  // On the GPU grad_scale stays in device memory (the kernel reads it): no host synchronisation.
  if (params.device() == Device::CUDA) MT_ON_CUDA(op, gpu::sgd_update(params, grads, buf, grad_scale, h));
  const double gs = grad_scale.dtype() == DType::F32 ? double(*grad_scale.data_as<float>())
                                                     : *grad_scale.data_as<double>();
  const int64_t n = params.numel();
  if (params.dtype() == DType::F64)
    sgd_cpu(params.data_as<double>(), grads.data_as<double>(), buf.data_as<double>(), gs, n, h);
  else if (grads.dtype() == DType::F32)
    sgd_cpu(params.data_as<float>(), grads.data_as<float>(), buf.data_as<float>(), gs, n, h);
  else
    sgd_cpu(params.data_as<float>(), grads.data_as<double>(), buf.data_as<float>(), gs, n, h);
}

}  // namespace mt::kernels
