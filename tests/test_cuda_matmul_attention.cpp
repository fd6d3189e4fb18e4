// The GPU matmul (cuBLASLt) and the GPU flash attention against the CPU kernels on the same inputs: every output
// of the GPU run starts as NaN (so an element the kernel fails to write fails the comparison), accumulated
// gradients start from the same random values on both sides.
//
// Tolerances, as ||gpu - cpu|| / ||cpu|| (relative L2) and a max-abs bound relative to max |cpu|:
//  * fp32: 1e-5 and 1e-5. Both sides compute in fp32 (no TF32: CUBLAS_COMPUTE_32F), only the summation order
//    differs: ~sqrt(K) * 6e-8 relative.
//  * fp64: 1e-12 and 1e-12, the same argument at fp64's unit roundoff.
//  * bf16: 1e-2, fp16: 5e-3 (max-abs 2 ulps of the largest element: 2^-7 and 2^-10). Outputs are rounded once to
//    16 bits (unit roundoff 2^-9, 2^-12), and an fp32 sum that differs in its last bits can round to the
//    neighbouring 16-bit value. Attention also rounds P (and in the backward pass dS) to 16 bits at different
//    points than the CPU (the GPU rounds exp(s - m) before normalising, the CPU the normalised probabilities;
//    the GPU's D comes from the 16-bit out): each adds ~one unit roundoff relative, random in sign; the attention
//    gradient's max-abs bound is therefore 4 ulps of the largest element.
//  * fp32 gradients from 16-bit inputs (dweight, dbias): the products are exact in fp32, so 1e-5 as fp32.
//  * log-sum-exp against a host computation in double from the same (16-bit) inputs: |dL| <= 2e-5 (1e-4 for
//    16 bits, whose scores the tensor cores accumulate in fp32 over HS products of up-to-16-bit-mantissa values).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"

using namespace mt;
using namespace mt::kernels;

namespace {

struct Tolerance {
  double rel_l2, max_abs;  // max_abs: relative to max |cpu|
};
Tolerance tolerance(DType t) {
  switch (t) {
    case DType::F64: return {1e-12, 1e-12};
    case DType::BF16: return {1e-2, 1.0 / 128};
    case DType::F16: return {5e-3, 1.0 / 1024};
    default: return {1e-5, 1e-5};
  }
}

// Host values of any float dtype, widened to double.
std::vector<double> values(const Tensor& t) {
  const Tensor h = to_host(t);
  Tensor d = Tensor::empty(h.shape(), DType::F64);
  copy_convert(d, h);
  const double* p = d.data_as<double>();
  return std::vector<double>(p, p + d.numel());
}

// A host tensor of dtype dt holding N(0, sd^2) values from Philox stream `stream` (never zeros).
Tensor host_normal(Shape s, DType dt, uint64_t stream, double sd = 1.0) {
  Tensor d = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = sd * philox_normal(20240917, stream, uint64_t(i));
  if (dt == DType::F64) return d;
  Tensor t = Tensor::empty(s, dt);
  copy_convert(t, d);
  return t;
}

Tensor to_gpu(const Tensor& host) {
  Tensor g = Tensor::empty(host.shape(), host.dtype(), Device::CUDA);
  copy_convert(g, host);
  return g;
}

// A host tensor of dtype dt full of NaN.
Tensor nan_host(Shape s, DType dt) {
  Tensor d = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < d.numel(); ++i) d.data_as<double>()[i] = std::numeric_limits<double>::quiet_NaN();
  if (dt == DType::F64) return d;
  Tensor t = Tensor::empty(s, dt);
  copy_convert(t, d);
  return t;
}

// A GPU view starting one element into a larger buffer (copied from `host`): 2- or 4-byte aligned only, for the
// kernels' unaligned paths (element loads; cuBLASLt algorithms chosen by alignment).
Tensor misaligned_gpu(const Tensor& host, Tensor& storage) {
  storage = Tensor::empty({host.numel() + 1}, host.dtype(), Device::CUDA);
  Tensor v = storage.slice(1, host.shape());
  copy_convert(v, host);
  return v;
}

// Uploads `host` (aligned as Tensor::empty allocates, or one element into a buffer held by `storage`).
Tensor upload(const Tensor& host, bool misaligned, Tensor& storage) {
  return misaligned ? misaligned_gpu(host, storage) : to_gpu(host);
}

void require_close(const Tensor& gpu, const Tensor& cpu, Tolerance tol, const std::string& what) {
  const std::vector<double> g = values(gpu), c = values(cpu);
  REQUIRE(g.size() == c.size());
  double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = std::abs(g[i] - c[i]);
    if (!(d <= max_diff)) max_diff = d, worst = i;  // a NaN (unwritten element) becomes the max and stays
    if (std::isnan(max_diff)) break;
    diff2 += (g[i] - c[i]) * (g[i] - c[i]), ref2 += c[i] * c[i];
    max_ref = std::max(max_ref, std::abs(c[i]));
  }
  const double rel = std::sqrt(diff2 / std::max(ref2, 1e-300));
  INFO(what << ": relative L2 " << rel << " (<= " << tol.rel_l2 << "), max |gpu - cpu| " << max_diff << " at "
            << worst << " (gpu " << g[worst] << ", cpu " << c[worst] << "; bound " << tol.max_abs * max_ref << ")");
  REQUIRE(!std::isnan(max_diff));
  REQUIRE(rel <= tol.rel_l2);
  REQUIRE(max_diff <= tol.max_abs * max_ref);
}

struct MatmulShape {
  int64_t N, C, OC;
};

// matmul forward and backward for one shape, layout, bias choice and dtype; `misaligned` places every GPU operand
// one element into its buffer.
void check_matmul(MatmulShape ms, WeightLayout layout, bool with_bias, DType dt, bool misaligned) {
  const int64_t N = ms.N, C = ms.C, OC = ms.OC;
  const DType acc = acc_dtype(dt);
  const Shape wshape = layout == WeightLayout::InOut ? Shape{C, OC} : Shape{OC, C};
  INFO("N " << N << " C " << C << " OC " << OC << ", " << (layout == WeightLayout::InOut ? "InOut" : "OutIn")
            << (with_bias ? ", bias" : ", no bias") << ", " << dtype_name(dt) << (misaligned ? ", misaligned" : ""));
  const Tensor inp = host_normal({N, C}, dt, 1), w = host_normal(wshape, dt, 2, 0.1);
  const Tensor bias = with_bias ? host_normal({OC}, dt, 3) : Tensor();
  const Tensor dout = host_normal({N, OC}, dt, 4);
  const Tensor dw0 = host_normal(wshape, acc, 5), db0 = host_normal({OC}, acc, 6);

  // CPU reference; the gradients accumulate onto dw0, db0.
  Tensor out = Tensor::empty({N, OC}, dt), dinp = Tensor::empty({N, C}, dt);
  Tensor dw = Tensor::empty(wshape, acc), db = Tensor::empty({OC}, acc);
  copy_convert(dw, dw0), copy_convert(db, db0);
  matmul_forward(out, inp, w, bias, layout);
  matmul_backward(dinp, dw, with_bias ? db : Tensor(), dout, inp, w, layout);

  // GPU: overwritten outputs start as NaN, accumulated ones from dw0, db0.
  Tensor st[8];
  const Tensor g_inp = upload(inp, misaligned, st[0]), g_w = upload(w, misaligned, st[1]);
  const Tensor g_dout = upload(dout, misaligned, st[2]);
  const Tensor g_bias = with_bias ? upload(bias, misaligned, st[3]) : Tensor();
  const Tensor g_out = upload(nan_host({N, OC}, dt), misaligned, st[4]);
  const Tensor g_dinp = upload(nan_host({N, C}, dt), misaligned, st[5]);
  const Tensor g_dw = upload(dw0, misaligned, st[6]), g_db = upload(db0, misaligned, st[7]);
  matmul_forward(g_out, g_inp, g_w, g_bias, layout);
  matmul_backward(g_dinp, g_dw, with_bias ? g_db : Tensor(), g_dout, g_inp, g_w, layout);
  device_synchronize(Device::CUDA);

  require_close(g_out, out, tolerance(dt), "out");
  require_close(g_dinp, dinp, tolerance(dt), "dinp");
  require_close(g_dw, dw, tolerance(acc), "dweight");
  if (with_bias) require_close(g_db, db, tolerance(acc), "dbias");
}

void check_bias_gelu(MatmulShape ms, DType dt, bool with_bias) {
  const int64_t N = ms.N, C = ms.C, OC = ms.OC;
  INFO("matmul_bias_gelu_forward N " << N << " C " << C << " OC " << OC << ", " << dtype_name(dt)
                                     << (with_bias ? ", bias" : ", no bias"));
  const Tensor inp = host_normal({N, C}, dt, 21), w = host_normal({C, OC}, dt, 22, 0.1);
  const Tensor bias = with_bias ? host_normal({OC}, dt, 23) : Tensor();
  Tensor pre = Tensor::empty({N, OC}, dt), out = Tensor::empty({N, OC}, dt);
  matmul_bias_gelu_forward(pre, out, inp, w, bias);
  const Tensor g_pre = to_gpu(nan_host({N, OC}, dt)), g_out = to_gpu(nan_host({N, OC}, dt));
  matmul_bias_gelu_forward(g_pre, g_out, to_gpu(inp), to_gpu(w), with_bias ? to_gpu(bias) : Tensor());
  device_synchronize(Device::CUDA);
  require_close(g_pre, pre, tolerance(dt), "pre");
  require_close(g_out, out, tolerance(dt), "gelu(pre)");
}

// The attention gradient's bounds: see the file comment (4 ulps of the largest element for 16 bits).
Tolerance attention_backward_tolerance(DType t) {
  switch (t) {
    case DType::BF16: return {1e-2, 4.0 / 256};
    case DType::F16: return {5e-3, 4.0 / 2048};
    default: return tolerance(t);
  }
}

// meshtrain's flash-attention kernels, and cuDNN's fused attention where the build has it (16-bit, aligned).
std::vector<GpuAttention> gpu_attention_impls() {
  std::vector<GpuAttention> impls{GpuAttention::Own};
  if (gpu_attention_has_cudnn()) impls.push_back(GpuAttention::Auto);
  return impls;
}

void check_attention(int64_t B, int64_t T, int64_t NH, int64_t HS, DType dt, bool misaligned, GpuAttention impl) {
  const int64_t C = NH * HS;
  const DType acc = acc_dtype(dt);
  INFO("attention B " << B << " T " << T << " NH " << NH << " HS " << HS << ", " << dtype_name(dt)
                      << (misaligned ? ", misaligned" : "")
                      << (impl == GpuAttention::Own ? ", meshtrain's kernels" : ", cuDNN where it applies"));
  set_gpu_attention(impl);
  const Tensor qkv = host_normal({B, T, 3 * C}, dt, 31), dout = host_normal({B, T, C}, dt, 32);

  // CPU reference: probabilities [B, NH, T, T].
  Tensor out = Tensor::empty({B, T, C}, dt), att = Tensor::empty(attention_record_shape(Device::CPU, B, NH, T), dt);
  attention_forward(out, att, qkv, int(NH));
  Tensor dqkv = Tensor::empty({B, T, 3 * C}, dt), datt = Tensor::empty(att.shape(), acc);
  attention_backward(dqkv, datt, dout, qkv, out, att, int(NH));

  // GPU: log-sum-exp record [B, NH, T]; every output and the scratch start as NaN.
  const Shape record = attention_record_shape(Device::CUDA, B, NH, T);
  REQUIRE(record == Shape{B, NH, T});
  Tensor st[3];
  const Tensor g_qkv = upload(qkv, misaligned, st[0]), g_dout = upload(dout, misaligned, st[1]);
  const Tensor g_dqkv = upload(nan_host({B, T, 3 * C}, dt), misaligned, st[2]);
  const Tensor g_out = to_gpu(nan_host({B, T, C}, dt));
  const Tensor g_lse = to_gpu(nan_host(record, acc)), g_datt = to_gpu(nan_host(record, acc));
  attention_forward(g_out, g_lse, g_qkv, int(NH));
  attention_backward(g_dqkv, g_datt, g_dout, g_qkv, g_out, g_lse, int(NH));
  device_synchronize(Device::CUDA);
  set_gpu_attention(GpuAttention::Auto);

  require_close(g_out, out, tolerance(dt), "out");
  require_close(g_dqkv, dqkv, attention_backward_tolerance(dt), "dqkv");

  // The log-sum-exp of each query's scaled scores, in double from the same (rounded) inputs.
  const std::vector<double> x = values(qkv), lse = values(g_lse);
  const double lse_tol = dt == DType::F64 ? 1e-12 : (dt == DType::F32 ? 2e-5 : 1e-4);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < HS; ++k)
            dot += x[(b * T + i) * 3 * C + h * HS + k] * x[(b * T + j) * 3 * C + C + h * HS + k];
          s[j] = dot / std::sqrt(double(HS));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double v : s) z += std::exp(v - mx);
        const double ref = mx + std::log(z), got = lse[(b * NH + h) * T + i];
        INFO("lse[" << b << ", " << h << ", " << i << "] gpu " << got << ", host " << ref);
        REQUIRE(std::abs(got - ref) <= lse_tol * std::max(1.0, std::abs(ref)));
      }
}

}  // namespace

TEST_CASE("cuda matmul: forward and backward against the cpu, odd shapes", "[cuda][matmul]") {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn})
      for (bool bias : {true, false}) {
        check_matmul({37, 72, 200}, layout, bias, dt, false);
        check_matmul({5, 3, 7}, layout, bias, dt, false);
      }
}

TEST_CASE("cuda matmul: misaligned operands", "[cuda][matmul]") {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (WeightLayout layout : {WeightLayout::InOut, WeightLayout::OutIn})
      check_matmul({37, 72, 200}, layout, true, dt, true);
}

TEST_CASE("cuda matmul: the bias gradient summed in row chunks", "[cuda][matmul]") {
  // Enough rows that the bias gradient splits them into chunks (at least 128 rows each) and adds the chunks'
  // partial sums in a second launch: even chunks, an uneven last chunk, and GPT-2's OC = 768.
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    check_matmul({4096, 8, 72}, WeightLayout::InOut, true, dt, false);
    check_matmul({3000, 8, 40}, WeightLayout::InOut, true, dt, false);
    check_matmul({4096, 16, 768}, WeightLayout::OutIn, true, dt, false);
  }
  check_matmul({3000, 8, 40}, WeightLayout::InOut, true, DType::BF16, true);
}

TEST_CASE("cuda matmul: GPT-2 shapes", "[cuda][matmul]") {
  // N = B*T = 4*64 rows; c_attn [768, 2304], c_proj [768, 768], c_fc [768, 3072], mlp c_proj [3072, 768], and a
  // 2048-row slice of the tied head (OutIn, no bias).
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    check_matmul({256, 768, 2304}, WeightLayout::InOut, true, dt, false);
    check_matmul({256, 768, 768}, WeightLayout::InOut, true, dt, false);
    check_matmul({256, 768, 3072}, WeightLayout::InOut, true, dt, false);
    check_matmul({256, 3072, 768}, WeightLayout::InOut, true, dt, false);
    check_matmul({256, 768, 2048}, WeightLayout::OutIn, false, dt, false);
  }
}

// The matmul writing memory that nothing wrote before (the other cases poison their outputs with a copy first), then
// a kernel reading it, as in the trainer's activation arena. Run alone under compute-sanitizer's initcheck
// (scripts/gpu_sanitize.sh's matmul_fresh target), it shows whether the tool sees the matmul's own stores: on an
// H100 (2026-11-28) it did at GPT-2's c_attn shape, while the bf16 trainer on configs/tiny.yaml drew reports; the
// tiny model's shapes (32 rows, widths 32 and 96) are here to tell the two apart.
TEST_CASE("cuda matmul: output in fresh memory, read by a kernel", "[cuda][matmul][fresh]") {
  const int64_t shapes[][3] = {{1024, 768, 2304}, {32, 32, 32}, {32, 32, 96}};  // N, C, OC
  for (const auto& sh : shapes) {
    for (DType dt : {DType::F32, DType::BF16}) {
      const int64_t N = sh[0], C = sh[1], OC = sh[2];
      INFO(dtype_name(dt) << " N " << N << " C " << C << " OC " << OC);
      const Tensor inp = host_normal({N, C}, dt, 1), w = host_normal({C, OC}, dt, 2, 0.1);
      const Tensor bias = host_normal({OC}, dt, 3), base = host_normal({N, OC}, dt, 4);
      Tensor out = Tensor::empty({N, OC}, dt), sum = Tensor::empty({N, OC}, dt);
      matmul_forward(out, inp, w, bias, WeightLayout::InOut);
      copy_convert(sum, base);
      kernels::accumulate(sum, out);
      const Tensor g_out = Tensor::empty({N, OC}, dt, Device::CUDA), g_sum = to_gpu(base);
      matmul_forward(g_out, to_gpu(inp), to_gpu(w), to_gpu(bias), WeightLayout::InOut);
      kernels::accumulate(g_sum, g_out);
      require_close(g_sum, sum, tolerance(dt), "base + out");
    }
  }
}

TEST_CASE("cuda matmul_bias_gelu_forward: fused GELU_AUX_BIAS epilogue (16-bit, OC a multiple of 8)",
          "[cuda][matmul]") {
  for (DType dt : {DType::BF16, DType::F16}) {
    check_bias_gelu({37, 72, 200}, dt, true);
    check_bias_gelu({37, 72, 200}, dt, false);
    check_bias_gelu({256, 768, 3072}, dt, true);
  }
}

// The composed path calls kernels::gelu_forward on cuda (a separate kernel file).
TEST_CASE("cuda matmul_bias_gelu_forward: composition (fp32, fp64, OC not a multiple of 8)", "[cuda][matmul]") {
  check_bias_gelu({37, 72, 200}, DType::F32, true);
  check_bias_gelu({37, 72, 200}, DType::F64, true);
  check_bias_gelu({37, 72, 36}, DType::BF16, true);
  check_bias_gelu({37, 72, 36}, DType::F16, true);
}

TEST_CASE("cuda attention: forward (out, log-sum-exp) and backward against the cpu", "[cuda][attention]") {
  struct Dims {
    int64_t B, T, NH, HS;
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (const Dims& d : {Dims{1, 1, 2, 64}, Dims{2, 17, 3, 32}, Dims{2, 64, 4, 64}, Dims{1, 200, 2, 64},
                          Dims{2, 200, 4, 32}, Dims{1, 130, 3, 64}})
      for (GpuAttention impl : gpu_attention_impls()) check_attention(d.B, d.T, d.NH, d.HS, dt, false, impl);
}

TEST_CASE("cuda attention: other head sizes and misaligned views", "[cuda][attention]") {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (GpuAttention impl : gpu_attention_impls()) {
      check_attention(1, 77, 2, 16, dt, false, impl);
      check_attention(1, 77, 1, 128, dt, false, impl);
      check_attention(2, 70, 2, 64, dt, true, impl);
    }
}
