// adamw_update: argument checks and device dispatch (kernels/adamw.h).
#include "kernels/adamw.h"

#include "kernels/cpu/adamw_cpu.h"
#include "kernels/cuda/adamw_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

void adamw_update(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const Tensor& grad_scale, const AdamWHyper& h, const Tensor& rounded) {
  const char* op = "adamw_update";
  check_defined(params, op, "params"), check_defined(grads, op, "grads"), check_defined(m, op, "m");
  check_defined(v, op, "v"), check_defined(grad_scale, op, "grad_scale");
  check_float(params, op, "params"), check_float(grads, op, "grads"), check_float(grad_scale, op, "grad_scale");
  check_same_dtype(m, params, op, "m", "params"), check_same_dtype(v, params, op, "v", "params");
  CHECK(!(params.dtype() == DType::F64 && grads.dtype() == DType::F32),
        "{}: fp64 params with fp32 grads is not supported", op);
  for (const Tensor* t : {&grads, &m, &v, &grad_scale}) check_same_device(*t, params, op, "an argument", "params");
  CHECK(grads.numel() == params.numel() && m.numel() == params.numel() && v.numel() == params.numel(),
        "{}: params/grads/m/v have {}/{}/{}/{} elements", op, params.numel(), grads.numel(), m.numel(), v.numel());
  CHECK(grad_scale.numel() == 1, "{}: grad_scale must have 1 element, has {}", op, grad_scale.numel());
  CHECK(h.step >= 1, "{}: step counts from 1, got {}", op, h.step);
  if (rounded.defined()) {
    CHECK((rounded.dtype() == DType::BF16 || rounded.dtype() == DType::F16) && params.dtype() == DType::F32 &&
              grads.dtype() == DType::F32,
          "{}: rounded must be bf16 or fp16 beside fp32 params and grads, got {} beside {} and {}", op,
          dtype_name(rounded.dtype()), dtype_name(params.dtype()), dtype_name(grads.dtype()));
    CHECK(rounded.numel() == params.numel(), "{}: rounded has {} elements, params {}", op, rounded.numel(),
          params.numel());
    check_same_device(rounded, params, op, "rounded", "params");
  }
  // On the GPU grad_scale stays in device memory (the kernel reads it): no host synchronisation.
  if (params.device() == Device::CUDA) {
    if (rounded.defined()) {  // the update, then the copy
      adamw_update(params, grads, m, v, grad_scale, h);
      copy_convert(rounded, params);
      return;
    }
    MT_ON_CUDA(op, gpu::adamw_update(params, grads, m, v, grad_scale, h));
  }
  const double gs = grad_scale.dtype() == DType::F32 ? double(*grad_scale.data_as<float>())
                                                     : *grad_scale.data_as<double>();
  const int64_t n = params.numel();
  if (params.dtype() == DType::F64)
    cpu::adamw_update<double, double>(params.data_as<double>(), grads.data_as<double>(), m.data_as<double>(),
                                      v.data_as<double>(), gs, n, h);
  else if (rounded.defined() && rounded.dtype() == DType::BF16)
    cpu::adamw_update<float, float>(params.data_as<float>(), grads.data_as<float>(), m.data_as<float>(),
                                    v.data_as<float>(), gs, n, h, static_cast<cpu::bf16*>(rounded.data()));
  else if (rounded.defined())
    cpu::adamw_update<float, float>(params.data_as<float>(), grads.data_as<float>(), m.data_as<float>(),
                                    v.data_as<float>(), gs, n, h, static_cast<cpu::fp16*>(rounded.data()));
  else if (grads.dtype() == DType::F32)
    cpu::adamw_update<float, float>(params.data_as<float>(), grads.data_as<float>(), m.data_as<float>(),
                                    v.data_as<float>(), gs, n, h);
  else
    cpu::adamw_update<float, double>(params.data_as<float>(), grads.data_as<double>(), m.data_as<float>(),
                                     v.data_as<float>(), gs, n, h);
}

}  // namespace mt::kernels
