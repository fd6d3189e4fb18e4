// attention_forward / attention_backward: argument checks and device dispatch (kernels/attention.h).
#include "kernels/attention.h"

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
void dims(const char* op, const Tensor& qkv, int n_head, int64_t& B, int64_t& T, int64_t& C) {
  check_defined(qkv, op, "qkv"), check_activation(qkv, op, "qkv");
  CHECK(qkv.ndim() == 3, "{}: qkv must be [B, T, 3C], has shape {}", op, qkv.shape().str());
  B = qkv.dim(0), T = qkv.dim(1);
  CHECK(qkv.dim(2) % 3 == 0, "{}: qkv's last dimension {} is not 3C", op, qkv.dim(2));
  C = qkv.dim(2) / 3;
  CHECK(n_head >= 1 && C % n_head == 0, "{}: C={} is not divisible by n_head={}", op, C, n_head);
}
// An activation-typed argument: qkv's dtype, device, and shape s.
void same(const char* op, const Tensor& t, const char* name, const Tensor& qkv, const Shape& s) {
  check_defined(t, op, name), check_same_dtype(t, qkv, op, name, "qkv");
  check_same_device(t, qkv, op, name, "qkv"), check_shape(t, s, op, name);
}
// An accumulation-typed argument (datt): dtype acc_dtype(qkv), qkv's device, and shape s.
void acc(const char* op, const Tensor& t, const char* name, const Tensor& qkv, const Shape& s) {
  check_defined(t, op, name);
  check_acc_dtype(t, qkv.dtype(), op, name);
  check_same_device(t, qkv, op, name, "qkv"), check_shape(t, s, op, name);
}
}  // namespace

void set_gpu_attention(GpuAttention impl) {
#if MESHTRAIN_WITH_CUDA
  gpu::allow_cudnn_attention(impl == GpuAttention::Auto);
#else
  (void)impl;
#endif
}

bool gpu_attention_has_cudnn() {
#if MESHTRAIN_WITH_CUDNN
  return true;
#else
  return false;
#endif
}

Shape attention_record_shape(Device d, int64_t B, int64_t NH, int64_t T) {
  return d == Device::CUDA ? Shape{B, NH, T} : Shape{B, NH, T, T};
}

DType attention_record_dtype(Device d, DType S) { return d == Device::CUDA ? acc_dtype(S) : S; }

void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head) {
  const char* op = "attention_forward";
  int64_t B, T, C;
  dims(op, qkv, n_head, B, T, C);
  same(op, out, "out", qkv, Shape{B, T, C});
  if (qkv.device() == Device::CUDA) {
    // att is the log-sum-exp record, in the accumulation dtype.
    acc(op, att, "att", qkv, attention_record_shape(Device::CUDA, B, n_head, T));
    MT_ON_CUDA(op, gpu::attention_forward(out, att, qkv, B, T, C, n_head));
  }
  same(op, att, "att", qkv, Shape{B, n_head, T, T});
  dispatch_storage(qkv.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::attention_forward<S>(storage_ptr<S>(out), storage_ptr<S>(att), storage_ptr<S>(qkv), B, T, C, n_head);
  });
}

void attention_backward(const Tensor& dqkv, const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& att, int n_head) {
  const char* op = "attention_backward";
  int64_t B, T, C;
  dims(op, qkv, n_head, B, T, C);
  same(op, dqkv, "dqkv", qkv, qkv.shape());
  same(op, dout, "dout", qkv, Shape{B, T, C});
  if (qkv.device() == Device::CUDA) {
    same(op, out, "out", qkv, Shape{B, T, C});
    const Shape record = attention_record_shape(Device::CUDA, B, n_head, T);
    acc(op, att, "att", qkv, record);
    acc(op, datt, "datt", qkv, record);
    MT_ON_CUDA(op, gpu::attention_backward(dqkv, datt, dout, qkv, out, att, B, T, C, n_head));
  }
  // The cpu recomputes nothing from out: the probabilities in att are all it needs.
  same(op, att, "att", qkv, Shape{B, n_head, T, T});
  acc(op, datt, "datt", qkv, Shape{B, n_head, T, T});
  dispatch_storage(qkv.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::attention_backward<S>(storage_ptr<S>(dqkv), datt.data_as<cpu::acc_t<S>>(), storage_ptr<S>(dout),
                               storage_ptr<S>(qkv), storage_ptr<S>(att), B, T, C, n_head);
  });
}

}  // namespace mt::kernels
