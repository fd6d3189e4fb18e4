// cuDNN fused attention (attention_cudnn.h). Per shape (B, T, NH, HS, dtype) two cuDNN graphs are built once and
// cached: an SDPA forward that also writes the softmax stats (log-sum-exp, fp32), and an SDPA backward from those
// stats. Q, K and V are strided views of qkv [B, T, 3C] (dims [B, NH, T, HS], strides [3TC, HS, 3C, 1]), O and dO
// of [B, T, C], dQ, dK and dV of dqkv, so nothing is copied or transposed. The workspace each graph needs comes
// from the caching allocator per call (a block freed after the launch is reused only by later work on the same
// compute stream), so after the first step these calls allocate nothing.
#include "kernels/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <spdlog/spdlog.h>

#include <cudnn_frontend.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/check.h"
#include "core/cuda/cuda_context.h"

namespace mt::kernels::gpu {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct Graphs {
  std::shared_ptr<fe::graph::Graph> forward, backward;  // null when cuDNN has no engine for the shape
  int64_t forward_workspace = 0, backward_workspace = 0;
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t>;  // dtype, B, T, NH, HS

struct State {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  std::map<Key, Graphs> graphs;
};

// Created on first use and never destroyed (as the compute stream and cuBLASLt's handle: at exit the CUDA runtime
// may already be gone).
State& state() {
  static State* s = [] {
    auto* st = new State;
    const cudnnStatus_t status = cudnnCreate(&st->handle);
    MT_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnCreate failed: {}", cudnnGetErrorString(status));
    return st;
  }();
  return *s;
}

std::vector<int64_t> dims(int64_t B, int64_t NH, int64_t T, int64_t HS) { return {B, NH, T, HS}; }
// Row t of head h of batch b at b*T*ld + t*ld + h*HS: [B, NH, T, HS] with a row stride of ld (3C for qkv, C else).
std::vector<int64_t> strides(int64_t T, int64_t ld, int64_t HS) { return {T * ld, HS, ld, 1}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    std::vector<int64_t> d, std::vector<int64_t> s) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(s));
}

// validate .. build_plans; false (with cuDNN's message at debug level) when no engine takes the graph.
bool build(fe::graph::Graph& g, cudnnHandle_t handle, int64_t& workspace, const char* what) {
  fe::error_t e = g.validate();
  if (e.is_good()) e = g.build_operation_graph(handle);
  if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A});
  if (e.is_good()) e = g.check_support(handle);
  if (e.is_good()) e = g.build_plans(handle);
  if (e.is_good()) e = g.get_workspace_size(workspace);
  if (e.is_bad()) spdlog::debug("cuDNN attention {}: {}", what, e.get_message());
  return e.is_good();
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

Graphs make_graphs(cudnnHandle_t handle, DType dtype, int64_t B, int64_t T, int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  const float scale = float(1.0 / std::sqrt(double(HS)));
  const auto d = dims(B, NH, T, HS), s_qkv = strides(T, 3 * C, HS), s_out = strides(T, C, HS);
  const std::vector<int64_t> d_stats = {B, NH, T, 1}, s_stats = {NH * T, T, 1, 1};
  Graphs r;

  auto f = new_graph(dtype);
  {
    auto q = input(*f, "Q", kQ, d, s_qkv), k = input(*f, "K", kK, d, s_qkv), v = input(*f, "V", kV, d, s_qkv);
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_is_inference(false).set_causal_mask(true)
                    .set_attn_scale(scale);
    auto [o, stats] = f->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim(d).set_stride(s_out);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(d_stats).set_stride(s_stats);
  }
  if (!build(*f, handle, r.forward_workspace, "forward")) return r;

  // The deterministic backward engine first; cuDNN versions without one for this shape get the default one.
  for (bool deterministic : {true, false}) {
    auto b = new_graph(dtype);
    auto q = input(*b, "Q", kQ, d, s_qkv), k = input(*b, "K", kK, d, s_qkv), v = input(*b, "V", kV, d, s_qkv);
    auto o = input(*b, "O", kO, d, s_out), dout = input(*b, "dO", kdO, d, s_out);
    auto stats = b->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats).set_dim(d_stats)
                               .set_stride(s_stats).set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_causal_mask(true)
                    .set_attn_scale(scale).set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = b->sdpa_backward(q, k, v, o, dout, stats, opts);
    dq->set_output(true).set_uid(kdQ).set_dim(d).set_stride(s_qkv);
    dk->set_output(true).set_uid(kdK).set_dim(d).set_stride(s_qkv);
    dv->set_output(true).set_uid(kdV).set_dim(d).set_stride(s_qkv);
    if (build(*b, handle, r.backward_workspace, deterministic ? "backward (deterministic)" : "backward")) {
      if (!deterministic) spdlog::warn("cuDNN attention: no deterministic backward engine; gradients may differ "
                                       "in the last bits from run to run");
      r.forward = f;
      r.backward = b;
      return r;
    }
  }
  return r;
}

const Graphs& graphs_for(DType dtype, int64_t B, int64_t T, int64_t C, int64_t NH) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  const Key key{int(dtype), B, T, NH, C / NH};
  auto it = st.graphs.find(key);
  if (it == st.graphs.end()) {
    it = st.graphs.emplace(key, make_graphs(st.handle, dtype, B, T, NH, C / NH)).first;
    if (it->second.forward)
      spdlog::debug("cuDNN attention: graphs built for B={} T={} NH={} HS={}", B, T, NH, C / NH);
    else
      spdlog::warn("cuDNN attention: no engine for B={} T={} n_head={} head size {} ({}); using meshtrain's "
                   "flash-attention kernels (run with --log-level debug for cuDNN's reason)",
                   B, T, NH, C / NH, dtype_name(dtype));
  }
  return it->second;
}

void execute(const std::shared_ptr<fe::graph::Graph>& g, int64_t workspace_bytes,
             std::unordered_map<int64_t, void*>& pack) {
  State& st = state();
  const cudnnStatus_t status = cudnnSetStream(st.handle, compute_stream());
  MT_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnSetStream failed: {}", cudnnGetErrorString(status));
  void* workspace = workspace_bytes > 0 ? device_allocator().allocate(size_t(workspace_bytes)) : nullptr;
  fe::error_t e = g->execute(st.handle, pack, workspace);
  if (workspace) device_allocator().release(workspace);
  MT_CHECK(e.is_good(), "cuDNN attention failed: {}", e.get_message());
}

void* at(const Tensor& t, int64_t offset_elements) {
  return static_cast<char*>(t.data()) + offset_elements * int64_t(dtype_size(t.dtype()));
}

}  // namespace

bool cudnn_attention_supported(DType dtype, int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  const int64_t HS = C / NH;
  if (HS % 8 != 0 || HS > 128 || B == 0 || T == 0) return false;
  return graphs_for(dtype, B, T, C, NH).forward != nullptr;
}

void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t B, int64_t T, int64_t C,
                             int64_t NH) {
  const Graphs& g = graphs_for(qkv.dtype(), B, T, C, NH);
  MT_CHECK(g.forward, "cuDNN attention: no engine for this shape (check cudnn_attention_supported first)");
  std::unordered_map<int64_t, void*> pack = {{kQ, at(qkv, 0)},  {kK, at(qkv, C)},
                                             {kV, at(qkv, 2 * C)}, {kO, at(out, 0)},
                                             {kStats, at(lse, 0)}};
  execute(g.forward, g.forward_workspace, pack);
}

void cudnn_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const Graphs& g = graphs_for(qkv.dtype(), B, T, C, NH);
  MT_CHECK(g.backward, "cuDNN attention: no engine for this shape (check cudnn_attention_supported first)");
  std::unordered_map<int64_t, void*> pack = {
      {kQ, at(qkv, 0)},        {kK, at(qkv, C)},        {kV, at(qkv, 2 * C)},
      {kO, at(out, 0)},        {kdO, at(dout, 0)},      {kStats, at(lse, 0)},
      {kdQ, at(dqkv, 0)},      {kdK, at(dqkv, C)},      {kdV, at(dqkv, 2 * C)}};
  execute(g.backward, g.backward_workspace, pack);
}

}  // namespace mt::kernels::gpu
