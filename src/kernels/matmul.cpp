// matmul_forward, matmul_bias_gelu_forward, matmul_backward: argument checks and device dispatch (kernels/matmul.h has the contract).
#include "kernels/matmul.h"

#include "kernels/cpu/matmul_cpu.h"
#include "kernels/cuda/matmul_cuda.h"
#include "kernels/gelu.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// Returns (C, OC) after checking the weight against inp's width.
void weight_dims(const Tensor& weight, const Tensor& inp, WeightLayout layout, const char* op, int64_t& C,
                 int64_t& OC) {
  CHECK(weight.ndim() == 2, "{}: weight must be 2-D, has shape {}", op, weight.shape().str());
  CHECK(inp.ndim() >= 1, "{}: inp must have at least one dimension", op);
  C = inp.dim(-1);
  const int64_t in_dim = layout == WeightLayout::InOut ? weight.dim(0) : weight.dim(1);
  OC = layout == WeightLayout::InOut ? weight.dim(1) : weight.dim(0);
  CHECK(in_dim == C, "{}: inp has {} columns but weight {} ({}) expects {}", op, C, weight.shape().str(),
        layout == WeightLayout::InOut ? "InOut" : "OutIn", in_dim);
}
// The checks of a forward product res[N, OC] = inp @ W (+ bias), giving N, C and OC.
void check_forward(const char* op, const char* res_name, const Tensor& res, const Tensor& inp, const Tensor& weight,
                   const Tensor& bias, WeightLayout layout, int64_t& N, int64_t& C, int64_t& OC) {
  check_defined(res, op, res_name), check_defined(inp, op, "inp"), check_defined(weight, op, "weight");
  check_activation(inp, op, "inp");
  check_same_dtype(res, inp, op, res_name, "inp"), check_same_dtype(weight, inp, op, "weight", "inp");
  check_same_device(res, inp, op, res_name, "inp"), check_same_device(weight, inp, op, "weight", "inp");
  weight_dims(weight, inp, layout, op, C, OC);
  N = inp.numel() / C;
  CHECK(res.numel() == N * OC && res.dim(-1) == OC, "{}: {} has shape {}, expected {} rows of {}", op, res_name,
        res.shape().str(), N, OC);
  if (bias.defined()) {
    check_same_dtype(bias, inp, op, "bias", "inp"), check_same_device(bias, inp, op, "bias", "inp");
    CHECK(bias.numel() == OC, "{}: bias has {} elements, expected {}", op, bias.numel(), OC);
  }
}
}  // namespace

void matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                    WeightLayout layout) {
  const char* op = "matmul_forward";
  int64_t N, C, OC;
  check_forward(op, "out", out, inp, weight, bias, layout, N, C, OC);
  if (inp.device() == Device::CUDA) MT_ON_CUDA(op, gpu::matmul_forward(out, inp, weight, bias, N, C, OC, layout));
  dispatch_storage(inp.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::matmul_forward<S>(storage_ptr<S>(out), storage_ptr<S>(inp), storage_ptr<S>(weight), storage_ptr<S>(bias), N,
                           C, OC, layout);
  });
}

void matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, WeightLayout layout) {
  const char* op = "matmul_backward";
  check_defined(dout, op, "dout"), check_defined(inp, op, "inp"), check_defined(weight, op, "weight");
  check_activation(inp, op, "inp");
  check_same_dtype(dout, inp, op, "dout", "inp"), check_same_dtype(weight, inp, op, "weight", "inp");
  check_same_device(dout, inp, op, "dout", "inp"), check_same_device(weight, inp, op, "weight", "inp");
  int64_t C, OC;
  weight_dims(weight, inp, layout, op, C, OC);
  const int64_t N = inp.numel() / C;
  CHECK(dout.numel() == N * OC && dout.dim(-1) == OC, "{}: dout has shape {}, expected {} rows of {}", op,
        dout.shape().str(), N, OC);
  if (dinp.defined()) {
    check_same_dtype(dinp, inp, op, "dinp", "inp"), check_same_device(dinp, inp, op, "dinp", "inp");
    CHECK(dinp.numel() == N * C, "{}: dinp has shape {}, inp {}", op, dinp.shape().str(), inp.shape().str());
  }
  if (dweight.defined()) {
    check_acc_dtype(dweight, inp.dtype(), op, "dweight"), check_same_device(dweight, inp, op, "dweight", "inp");
    check_shape(dweight, weight.shape(), op, "dweight");
  }
  if (dbias.defined()) {
    check_acc_dtype(dbias, inp.dtype(), op, "dbias"), check_same_device(dbias, inp, op, "dbias", "inp");
    CHECK(dbias.numel() == OC, "{}: dbias has {} elements, expected {}", op, dbias.numel(), OC);
  }
  // The products themselves (dinp reads the weight; dweight and dbias do not).
  auto run = [&](const Tensor& dx, const Tensor& dw, const Tensor& db) {
    if (inp.device() == Device::CUDA)
      MT_ON_CUDA(op, gpu::matmul_backward(dx, dw, db, dout, inp, weight, N, C, OC, layout));
    dispatch_storage(inp.dtype(), [&](auto s) {
      using S = decltype(s);
      using A = cpu::acc_t<S>;
      cpu::matmul_backward<S>(storage_ptr<S>(dx), storage_ptr<A>(dw), storage_ptr<A>(db), storage_ptr<S>(dout),
                              storage_ptr<S>(inp), storage_ptr<S>(weight), N, C, OC, layout);
    });
  };
  if (dweight.defined() && dweight.data() == weight.data()) {
    if (dinp.defined()) run(dinp, Tensor(), Tensor());
    zero_(dweight);
    if (dbias.defined()) zero_(dbias);
    return run(Tensor(), dweight, dbias);
  }
  run(dinp, dweight, dbias);
}

void matmul_bias_gelu_forward(const Tensor& pre, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias, WeightLayout layout) {
  const char* op = "matmul_bias_gelu_forward";
  int64_t N, C, OC;
  check_forward(op, "pre", pre, inp, weight, bias, layout, N, C, OC);
  check_defined(out, op, "out");
  check_same_dtype(out, inp, op, "out", "inp"), check_same_device(out, inp, op, "out", "inp");
  CHECK(out.shape() == pre.shape(), "{}: out has shape {}, pre {}", op, out.shape().str(), pre.shape().str());
  CHECK(out.data() != pre.data(), "{}: out and pre must not alias (the backward pass reads pre)", op);
#ifdef MESHTRAIN_WITH_CUDA
  // One cuBLASLt call with the GELU_AUX_BIAS epilogue where it applies (16-bit, OC a multiple of 8).
  if (inp.device() == Device::CUDA && gpu::matmul_bias_gelu_forward(pre, out, inp, weight, bias, N, C, OC, layout))
    return;
#endif
  // The composition: on the CPU, and on the GPU for fp32/fp64 (rounded as the unfused layers are).
  matmul_forward(pre, inp, weight, bias, layout);
  gelu_forward(out, pre);
}

}  // namespace mt::kernels
