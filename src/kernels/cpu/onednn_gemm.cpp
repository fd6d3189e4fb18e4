// oneDNN matmul primitives behind one GEMM call (see onednn_gemm.h). A primitive is specialised to its shapes,
// strides, types and post-ops, and creating one costs far more than a small product, so each distinct call is
// created once and kept for the process's life (a model has a few dozen distinct matmuls).
#include "kernels/cpu/onednn_gemm.h"

#include "core/check.h"

#ifdef MESHTRAIN_WITH_ONEDNN
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <tuple>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/cpu/parallel.h"
#endif

namespace mt::kernels::cpu::onednn {

#ifdef MESHTRAIN_WITH_ONEDNN
namespace {
using dt = dnnl::memory::data_type;

dt to_dnnl(Type t) { return t == Type::BF16 ? dt::bf16 : dt::f32; }

// A [rows, cols] matrix stored row-major with leading dimension ld, or transposed ([cols, rows] with ld).
dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, bool trans, Type t) {
  const dnnl::memory::dims strides = trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return dnnl::memory::desc({rows, cols}, to_dnnl(t), strides);
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, Type, Type, bool, bool>;

// A primitive and the descriptions of its arguments.
struct Matmul {
  dnnl::memory::desc a, b, c, bias;
  dnnl::matmul primitive;
};

Matmul create(const GemmShape& s) {
  Matmul m;
  m.a = matrix(s.M, s.K, s.lda, s.trans_a, s.ab), m.b = matrix(s.K, s.N, s.ldb, s.trans_b, s.ab);
  m.c = matrix(s.M, s.N, s.ldc, false, s.c);
  if (s.bias) m.bias = dnnl::memory::desc({1, s.N}, to_dnnl(s.c), dnnl::memory::dims{s.N, 1});
  dnnl::primitive_attr attr;
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    m.primitive =
        dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(m.a, m.b, m.bias, m.c), attr, cpu_engine()));
  } catch (const dnnl::error& e) {
    CHECK(false, "oneDNN matmul M={} N={} K={} (trans {}{}, {}): {}", s.M, s.N, s.K, s.trans_a, s.trans_b,
          s.ab == Type::BF16 ? "bf16" : "fp32", e.what());
  }
  return m;
}

const Matmul& cached(const GemmShape& s) {
  static std::mutex mutex;
  static std::map<Key, Matmul> cache;
  const Key key{s.M, s.N, s.K, s.trans_a, s.trans_b, s.lda, s.ldb, s.ldc, s.ab, s.c, s.accumulate, s.bias};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, create(s)).first;
  return it->second;  // std::map never moves its elements
}

dnnl::cpu_isa isa() { return dnnl::get_effective_cpu_isa(); }
}  // namespace

bool available() { return true; }

std::string isa_name() {
  switch (isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "older than avx2";
  }
}

bool has_amx() { return isa() == dnnl::cpu_isa::avx512_core_amx; }

bool has_bf16_dot() { return has_amx() || isa() == dnnl::cpu_isa::avx512_core_bf16; }

bool has_avx512() {
  const dnnl::cpu_isa i = isa();
  return i == dnnl::cpu_isa::avx512_core || i == dnnl::cpu_isa::avx512_core_vnni ||
         i == dnnl::cpu_isa::avx512_core_bf16 || i == dnnl::cpu_isa::avx512_core_amx;
}

bool has_avx2() {
  const dnnl::cpu_isa i = isa();
  return has_avx512() || i == dnnl::cpu_isa::avx2 || i == dnnl::cpu_isa::avx2_vnni;
}

namespace {
// Operands whose rows alias in the caches, read from copies with longer rows (fp32 on AVX2 only; not measured with
// AVX-512, where oneDNN's source refuses its no-copy kernel for such leading dimensions itself). On an AMD EPYC with
// Zen 3 (docs/performance.md):
// - a transposed A ([K, M] in memory) with rows a multiple of 4 KiB apart: config A's fc_proj weight gradient (A =
//   the GELU output, 256 x 1024) ran at 76-88 GFLOP/s, at 149-170 padded.
// - a B ([K, N] in memory) with rows a multiple of 1 KiB apart, in the products oneDNN runs on AVX2 without packing
//   them (its "no-copy" kernel, which its source chooses where 1/M + 1/N >= 0.0038): config A's fc forward product
//   and weight gradient (rows 4 KiB apart) ran at 71-98 GFLOP/s, at 161-194 padded; rows 1-6 KiB apart cost less
//   (101-146 against 137-194). Config B's products (M = 1024) ran as fast unpadded, so only no-copy ones pay a copy.
// The copies are bounded at 8 MiB each (config B's larger operands gained about what their copy cost).
constexpr int64_t kAliasFloatsA = 1024, kAliasFloatsB = 256, kPadFloats = 16, kMaxPadBytes = 8 << 20;
constexpr double kNoCopyThreshold = 0.0038;

bool avx2_only() { return !has_avx512() && has_avx2(); }

// A row of n floats lengthened so that it is no multiple of 1 KiB.
int64_t padded_ld(int64_t n) { return (n + kPadFloats) % kAliasFloatsB == 0 ? n + 2 * kPadFloats : n + kPadFloats; }

bool fits(int64_t rows, int64_t cols) { return rows * padded_ld(cols) * int64_t(sizeof(float)) <= kMaxPadBytes; }

bool pad_a(const GemmShape& s) {
  return s.trans_a && s.ab == Type::F32 && s.lda % kAliasFloatsA == 0 && avx2_only() && fits(s.K, s.M);
}

bool pad_b(const GemmShape& s) {
  return !s.trans_b && s.ab == Type::F32 && s.ldb % kAliasFloatsB == 0 && avx2_only() &&
         1.0 / double(s.M) + 1.0 / double(s.N) >= kNoCopyThreshold && fits(s.K, s.N);
}

// rows x cols floats (row stride ld) copied into scratch with rows of padded_ld(cols).
const float* copy_padded(const void* src_, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& scratch) {
  const int64_t pld = padded_ld(cols);
  scratch.resize(size_t(rows * pld));
  const float* src = static_cast<const float*>(src_);
  float* dst = scratch.data();
#pragma omp parallel for if (rows * cols > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) std::copy(src + r * ld, src + r * ld + cols, dst + r * pld);
  return dst;
}
}  // namespace

void gemm(const GemmShape& s, const void* a, const void* b, const void* bias, void* c) {
  if (s.M == 0 || s.N == 0) return;
  CHECK(s.K > 0, "oneDNN matmul with an empty inner dimension (M={} N={})", s.M, s.N);
  GemmShape shape = s;
  thread_local std::vector<float> scratch_a, scratch_b;
  if (pad_a(s)) a = copy_padded(a, s.K, s.M, s.lda, scratch_a), shape.lda = padded_ld(s.M);
  if (pad_b(s)) b = copy_padded(b, s.K, s.N, s.ldb, scratch_b), shape.ldb = padded_ld(s.N);
  const Matmul& mm = cached(shape);
  // The stream only orders this thread's work; a CPU stream per thread lets ranks' threads run side by side.
  thread_local dnnl::stream stream(cpu_engine());
  auto mem = [&](const dnnl::memory::desc& d, const void* p) {
    return dnnl::memory(d, cpu_engine(), const_cast<void*>(p));
  };
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, mem(mm.a, a)}, {DNNL_ARG_WEIGHTS, mem(mm.b, b)}, {DNNL_ARG_DST, mem(mm.c, c)}};
  if (s.bias) args.emplace(DNNL_ARG_BIAS, mem(mm.bias, bias));
  mm.primitive.execute(stream, args);
  stream.wait();
}

#else
bool available() { return false; }
std::string isa_name() { return "none"; }
bool has_amx() { return false; }
bool has_bf16_dot() { return false; }
bool has_avx512() { return false; }
bool has_avx2() { return false; }
void gemm(const GemmShape&, const void*, const void*, const void*, void*) {
  CHECK(false, "meshtrain was built without oneDNN (install libdnnl-dev: scripts/setup.sh)");
}
#endif

}  // namespace mt::kernels::cpu::onednn
