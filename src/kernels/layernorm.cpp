// layernorm_forward / layernorm_backward: argument checks and device dispatch (kernels/layernorm.h).
#include "kernels/layernorm.h"

#include <utility>

#include "kernels/cpu/layernorm_cpu.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
void check_common(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias_or_dbias,
                  const Tensor& mean, const Tensor& rstd, int64_t& N, int64_t& C) {
  check_defined(x, op, "inp"), check_defined(weight, op, "weight"), check_defined(bias_or_dbias, op, "bias");
  check_defined(mean, op, "mean"), check_defined(rstd, op, "rstd");
  check_float(x, op, "inp");
  for (const Tensor* t : {&weight, &bias_or_dbias, &mean, &rstd}) {
    check_same_dtype(*t, x, op, "a parameter/statistic", "inp");
    check_same_device(*t, x, op, "a parameter/statistic", "inp");
  }
  C = x.dim(-1);
  N = x.numel() / C;
  CHECK(weight.numel() == C && bias_or_dbias.numel() == C, "{}: weight/bias have {}/{} elements, expected C={}",
        op, weight.numel(), bias_or_dbias.numel(), C);
  CHECK(mean.numel() == N && rstd.numel() == N, "{}: mean/rstd have {}/{} elements, expected N={}", op,
        mean.numel(), rstd.numel(), N);
}
}  // namespace

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias) {
  const char* op = "layernorm_forward";
  int64_t N, C;
  check_common(op, inp, weight, bias, mean, rstd, N, C);
  check_defined(out, op, "out"), check_same_dtype(out, inp, op, "out", "inp");
  check_same_device(out, inp, op, "out", "inp"), check_shape(out, inp.shape(), op, "out");
  if (inp.device() == Device::CUDA) no_cuda(op);
  if (inp.dtype() == DType::F32)
    cpu::layernorm_forward<float>(out.data_as<float>(), mean.data_as<float>(), rstd.data_as<float>(),
                                  inp.data_as<float>(), weight.data_as<float>(), bias.data_as<float>(), N, C,
                                  kLayerNormEps);
  else
    cpu::layernorm_forward<double>(out.data_as<double>(), mean.data_as<double>(), rstd.data_as<double>(),
                                   inp.data_as<double>(), weight.data_as<double>(), bias.data_as<double>(), N, C,
                                   kLayerNormEps);
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  int64_t N, C;
  check_common(op, inp, weight, dbias, mean, rstd, N, C);
  for (auto [t, name] : {std::pair{&dinp, "dinp"}, std::pair{&dout, "dout"}}) {
    check_defined(*t, op, name), check_same_dtype(*t, inp, op, name, "inp");
    check_same_device(*t, inp, op, name, "inp"), check_shape(*t, inp.shape(), op, name);
  }
  check_defined(dweight, op, "dweight"), check_same_dtype(dweight, inp, op, "dweight", "inp");
  check_same_device(dweight, inp, op, "dweight", "inp");
  CHECK(dweight.numel() == C, "{}: dweight has {} elements, expected {}", op, dweight.numel(), C);
  if (inp.device() == Device::CUDA) no_cuda(op);
  if (inp.dtype() == DType::F32)
    cpu::layernorm_backward<float>(dinp.data_as<float>(), dweight.data_as<float>(), dbias.data_as<float>(),
                                   dout.data_as<float>(), inp.data_as<float>(), weight.data_as<float>(),
                                   mean.data_as<float>(), rstd.data_as<float>(), N, C);
  else
    cpu::layernorm_backward<double>(dinp.data_as<double>(), dweight.data_as<double>(), dbias.data_as<double>(),
                                    dout.data_as<double>(), inp.data_as<double>(), weight.data_as<double>(),
                                    mean.data_as<double>(), rstd.data_as<double>(), N, C);
}

}  // namespace mt::kernels
