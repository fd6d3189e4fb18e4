// ZeRO-3's parameter gathers in a chunk's passes (see param_gathers.h). The requests mirror GPT::forward's
// need_params and GPT::backward's / backward_weights' backward_needs_param and backward_needs_block (model/gpt.cpp,
// model/llama_block.cpp); the store's walk mirrors ShardedParams::forward_needs, backward_needs, need, prefetch and its
// ring slots.
#include "plan/param_gathers.h"

#include <algorithm>
#include <string>

#include "parallel/sharded_params.h"

namespace mt::plan {

StageWork stage_work(const StageConfig& s, bool weight_pass) {
  const GPTConfig& g = s.model;
  const double C = g.d_model, tp = s.tp(), T = g.seq_len, Vp = padded_vocab(g.vocab_size, s.tp());
  // GPT-2's MLP 8 C^2, attention 4 C^2; Llama's SwiGLU 3 C H, attention C (Q + 2 KV) + Q C (q, k, v and o), with
  // Q = NH HS and KV = n_kv_head HS.
  const double Q = double(g.n_head) * g.head_size(), KV = double(g.kv_heads()) * g.head_size();
  const double mlp = g.llama() ? 3 * C * g.mlp_hidden() : 8 * C * C;
  const double attn = g.llama() ? C * (2 * Q + 2 * KV) : 4 * C * C;
  StageWork w;
  if (s.last()) w.head = C * Vp / tp;
  w.mlp = mlp / tp;
  w.attn = attn / tp + (weight_pass ? 0 : T * C / tp);
  w.mlp_out = (g.llama() ? C * g.mlp_hidden() : 4 * C * C) / tp;  // c_proj, down_proj
  w.attn_out = (g.llama() ? Q * C : C * C) / tp;                  // attn.c_proj, o_proj
  if (s.first()) w.embedding = C;
  return w;
}

namespace {

// The elements a parameter of `t` occupies.
ParamRequest range_of(const ParamTable& t, const std::string& name) {
  const ParamSpec& p = t[t.index_of(name)];
  return {p.offset, p.offset + p.numel(), 0};
}

// Stage-local block l's parameters (GPT::backward_needs_block: every slot of the block).
ParamRequest block_range(const StageConfig& s, const ParamTable& t, int l) {
  const int layer = s.block_begin() + l;
  const std::string prefix = s.model.llama() ? "model.layers." + std::to_string(layer) + "."
                                             : "h." + std::to_string(layer) + ".";
  ParamRequest r{INT64_MAX, 0, 0};
  for (const ParamSpec& p : t.specs())
    if (p.name.compare(0, prefix.size(), prefix) == 0) {
      r.begin = std::min(r.begin, p.offset);
      r.end = std::max(r.end, p.offset + p.numel());
    }
  return r;
}

// Where GPT::need_params(next) asks from: block `next`'s input norm (the forward fuses it into the block before),
// or the start of the layout past the last block.
int64_t forward_begin(const StageConfig& s, const ParamTable& t, int next) {
  if (next >= s.blocks()) return 0;
  const int layer = s.block_begin() + next;
  if (s.model.llama()) return range_of(t, llama_layer_name(layer, 0)).begin;  // input_layernorm
  const std::string h = "h." + std::to_string(layer) + ".";
  return std::min(range_of(t, h + "ln_1.weight").begin, range_of(t, h + "ln_1.bias").begin);
}

// Block l's lowest element (GPT::need_block_params).
int64_t block_begin(const StageConfig& s, const ParamTable& t, int l) { return block_range(s, t, l).begin; }

// GPT::forward: need_params(0) before the embedding (through block 0's input norm); then per block l,
// need_block_params(l) before it and need_params(l + 1) before the norm fused into its end (the next block's input
// norm, or everything after the last block); each asks from its begin up to the request before it.
std::vector<ParamRequest> forward_requests(const StageConfig& s, const ParamTable& t) {
  const StageWork w = stage_work(s, false);
  const int L = s.blocks();
  std::vector<ParamRequest> r;
  int64_t end = t.total_numel();
  auto ask = [&](int64_t begin, double after) {
    r.push_back({begin, end, after});
    end = std::min(end, begin);
  };
  ask(forward_begin(s, t, 0), w.embedding);
  for (int l = 0; l < L; ++l) {
    ask(block_begin(s, t, l), w.block());
    ask(forward_begin(s, t, l + 1), l + 1 == L ? w.head : 0.0);
  }
  return r;
}

// GPT::backward (and its input-only half): the head's parameters first on the last stage (GPT-2: ln_f's weight and
// bias and the tied wte; Llama: the norm and the head), then each block's, the last block first.
std::vector<ParamRequest> backward_requests(const StageConfig& s, const ParamTable& t) {
  const GPTConfig& g = s.model;
  const StageWork w = stage_work(s, false);
  std::vector<ParamRequest> r;
  if (s.last()) {
    const std::vector<std::string> head =
        g.llama() ? std::vector<std::string>{"model.norm.weight",
                                             g.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}
                  : std::vector<std::string>{"ln_f.weight", "ln_f.bias", "wte.weight"};
    for (const std::string& name : head) r.push_back(range_of(t, name));
    r.back().work_after = w.head;
  }
  for (int l = s.blocks() - 1; l >= 0; --l) {
    r.push_back(block_range(s, t, l));
    r.back().work_after = w.block() + (l == 0 ? w.embedding : 0.0);
  }
  return r;
}

// GPT::backward_weights: only train.recompute: light reads parameters there (each block's norms again), after the
// head's weight gradient.
std::vector<ParamRequest> weight_requests(const StageConfig& s, const ParamTable& t) {
  if (s.model.recompute != Recompute::Light) return {};
  const StageWork w = stage_work(s, true);
  std::vector<ParamRequest> r{{0, 0, w.head}};
  for (int l = s.blocks() - 1; l >= 0; --l) {
    r.push_back(block_range(s, t, l));
    r.back().work_after = w.block() + (l == 0 ? w.embedding : 0.0);
  }
  return r;
}

// The requests' shares of the pass's work.
std::vector<ParamRequest> normalised(std::vector<ParamRequest> r) {
  double total = 0;
  for (const ParamRequest& q : r) total += q.work_after;
  for (ParamRequest& q : r) q.work_after = total > 0 ? q.work_after / total : 0.0;
  return r;
}

}  // namespace

std::vector<ParamRequest> param_requests(const StageConfig& s, const ParamTable& t, ActionKind pass) {
  switch (pass) {
    case ActionKind::Forward: return normalised(forward_requests(s, t));
    case ActionKind::Backward:
    case ActionKind::BackwardInput: return normalised(backward_requests(s, t));
    case ActionKind::BackwardWeight: return normalised(weight_requests(s, t));
    default: return {};
  }
}

std::vector<ParamRequest> unit_reads(const StageConfig& s, const ParamTable& t, const std::vector<GradUnit>& units,
                                     ActionKind pass) {
  if (pass != ActionKind::Forward && pass != ActionKind::Backward) return {};
  const StageWork w = stage_work(s, false);
  const bool llama = s.model.llama();
  // A unit's compute, by the part its first parameter (in layout order) belongs to.
  auto work_of = [&](const GradUnit& u) {
    std::string first;
    for (const ParamSpec& p : t.specs())
      if (p.offset == u.begin) first = p.name;
    auto has = [&](const char* x) { return first.find(x) != std::string::npos; };
    if (has(llama ? "mlp.down_proj" : "mlp.c_proj")) return w.mlp_out;
    if (has(llama ? "mlp.up_proj" : "mlp.c_fc")) return w.mlp - w.mlp_out;
    if (has(llama ? "self_attn.o_proj" : "attn.c_proj")) return w.attn;
    if (has(llama ? "embed_tokens" : "wte") || has("wpe")) return w.embedding;
    return w.head;  // the final norm (with an untied head)
  };
  std::vector<ParamRequest> r;
  const int n = static_cast<int>(units.size());
  for (int i = 0; i < n; ++i) {
    const GradUnit& u = units[pass == ActionKind::Forward ? n - 1 - i : i];  // the forward pass walks down the layout
    r.push_back({u.begin, u.end, work_of(u)});
  }
  return normalised(r);
}

ChunkParamGathers::ChunkParamGathers(const StageConfig& s, const ParamTable& t, std::vector<GradUnit> units,
                                     std::vector<double> unit_us, int elem_bytes, bool shared_ring,
                                     std::vector<double> unit_cpu_us, std::vector<std::vector<GatherBucket>> buckets,
                                     bool read_driven)
    : units_(std::move(units)), unit_us_(std::move(unit_us)), unit_cpu_us_(std::move(unit_cpu_us)),
      buckets_(std::move(buckets)), elem_bytes_(elem_bytes), shared_(shared_ring), read_driven_(read_driven),
      forward_(read_driven ? unit_reads(s, t, units_, ActionKind::Forward) : param_requests(s, t, ActionKind::Forward)),
      backward_(read_driven ? unit_reads(s, t, units_, ActionKind::Backward)
                            : param_requests(s, t, ActionKind::Backward)),
      weight_(read_driven ? std::vector<ParamRequest>{} : param_requests(s, t, ActionKind::BackwardWeight)),
      resident_(units_.size(), false),
      early_(units_.size(), 0.0), early_in_flight_(units_.size(), false) {
  for (size_t u = 0, ring = 0; u < units_.size(); ++u)
    slot_.push_back(units_[u].pinned ? -1 : int(ring++ % kGradRingSlots));
  occupant_.assign(kGradRingSlots, -1);
  unit_cpu_us_.resize(units_.size(), 0.0);
}

void ChunkParamGathers::begin_step() {
  std::fill(resident_.begin(), resident_.end(), false);
  std::fill(occupant_.begin(), occupant_.end(), -1);
  std::fill(early_in_flight_.begin(), early_in_flight_.end(), false);
  last_pass_ = ActionKind::Forward;  // the step's first pass keeps nothing (ShardedParams' fresh store)
}

void ChunkParamGathers::prefetch_forward_start(double head_start_us) {
  double done = -head_start_us;  // one after another on the communicator
  const int n = static_cast<int>(units_.size());
  const bool all_pinned = std::all_of(slot_.begin(), slot_.end(), [](int s) { return s < 0; });
  for (int u = n - 1; u >= 0 && u >= (all_pinned ? 0 : n - 2); --u) {
    done += unit_us_[u];
    early_[u] = done;
    early_in_flight_[u] = true;
  }
}

const std::vector<ParamRequest>& ChunkParamGathers::requests(ActionKind kind) const {
  return kind == ActionKind::Forward ? forward_ : kind == ActionKind::BackwardWeight ? weight_ : backward_;
}

PassGathers ChunkParamGathers::pass(ActionKind kind, double work_us) {
  const int n = static_cast<int>(units_.size());
  const bool down = kind == ActionKind::Forward;  // the forward pass walks down the layout, the backward up
  // ShardedParams::begin_pass: every gather still in flight is waited for, and the unpinned units go, but for the
  // ring's first two when a backward pass follows a forward pass, and its last two when a forward pass follows a
  // backward pass in a ring of its own (a shared one holds their gradients).
  const int ring_units = static_cast<int>(std::count_if(slot_.begin(), slot_.end(), [](int s) { return s >= 0; }));
  int keep_from = ring_units, keep_to = ring_units;
  if (last_pass_ == ActionKind::Forward && !down) keep_from = 0, keep_to = 2;
  if (last_pass_ != ActionKind::Forward && down && !shared_) keep_from = ring_units - 2;
  last_pass_ = kind;
  for (int u = 0, ring = 0; u < n; ++u) {
    if (units_[u].pinned) continue;
    const int r = ring++;
    if (r >= keep_from && r < keep_to && resident_[u]) continue;
    resident_[u] = false;
    if (occupant_[slot_[u]] == u) occupant_[slot_[u]] = -1;
  }
  PassGathers out;
  std::vector<double> ready(n, 0.0);  // a gather in flight: when it completes (one after another on the communicator)
  std::vector<bool> flying(n, false), touched(n, false);  // in flight; touched by the current request
  double t = 0, comm_free = 0;
  // The step's first units, gathered since before this pass (prefetch_forward_start).
  for (int u = 0; u < n; ++u)
    if (early_in_flight_[u]) {
      flying[u] = true, ready[u] = early_[u], comm_free = std::max(comm_free, early_[u]);
      if (slot_[u] >= 0) occupant_[slot_[u]] = u;
      // Counted among the step's gathers, on the communicator from the pass's start.
      out.units.push_back(u);
      out.issued.push_back(0.0);
      out.busy_us.push_back(unit_us_[u]);
      out.bytes += (units_[u].end - units_[u].begin) * int64_t(elem_bytes_);
      out.cpu_us += unit_cpu_us_[u];
    }
  std::fill(early_in_flight_.begin(), early_in_flight_.end(), false);
  auto wait = [&](int u) {
    if (!flying[u]) return;
    out.wait_us += std::max(0.0, ready[u] - t);
    t = std::max(t, ready[u]);
    flying[u] = false;
  };
  auto issue = [&](int u) {
    if (slot_[u] >= 0) {  // the slot's previous unit is waited for and leaves (ShardedParams::issue)
      const int prev = occupant_[slot_[u]];
      if (prev >= 0 && prev != u) wait(prev), resident_[prev] = false;
      occupant_[slot_[u]] = u;
    }
    ready[u] = comm_free = std::max(t, comm_free) + unit_us_[u];
    flying[u] = true;
    out.units.push_back(u);
    out.issued.push_back(t);
    out.busy_us.push_back(unit_us_[u]);
    out.bytes += (units_[u].end - units_[u].begin) * int64_t(elem_bytes_);
    out.cpu_us += unit_cpu_us_[u];
  };
  auto prefetch = [&](int u) {  // unless u's slot holds a unit the current request touched (ShardedParams::prefetch)
    if (u < 0 || u >= n || resident_[u] || flying[u]) return;
    const int holder = slot_[u] >= 0 ? occupant_[slot_[u]] : -1;
    if (!(holder >= 0 && touched[holder])) issue(u);
  };
  // A pass that reports its reads (ShardedParams::reader) waits for each bucket as it reads it: the request's
  // compute walks its elements in the pass's order (down the layout forward, up it backward), the work spread over
  // them by their count (the blocks' multiply-adds are their weights'), and a unit's buckets arrive in that order
  // (ShardedParams::issue), the last one at ready[u]. (A backward pass reads no bias; their buckets, waited for when
  // the unit's gradients are final, are counted as if read: they are small.)
  auto reads = [&](const ParamRequest& q, double work) {
    if (q.end <= q.begin) return void(t += work);  // reads nothing
    const double elements = double(q.end - q.begin);
    for (int i = 0; i < n; ++i) {
      const int u = down ? n - 1 - i : i;
      if (units_[u].end <= q.begin || units_[u].begin >= q.end) continue;
      const std::vector<GatherBucket>& bs = buckets_[u];
      const int nb = static_cast<int>(bs.size());
      double after = 0;  // the unit's gather time after bucket k's in issue order
      for (const GatherBucket& b : bs) after += b.us;
      for (int j = 0; j < nb; ++j) {
        const GatherBucket& b = bs[down ? nb - 1 - j : j];
        after -= b.us;
        const int64_t lo = std::max(b.begin, q.begin), hi = std::min(b.end, q.end);
        if (lo >= hi) continue;
        if (flying[u]) {
          const double arrives = ready[u] - after;
          out.wait_us += std::max(0.0, arrives - t);
          t = std::max(t, arrives);
        }
        t += work * double(hi - lo) / elements;
      }
    }
  };
  for (const ParamRequest& q : requests(kind)) {
    std::fill(touched.begin(), touched.end(), false);
    int edge = -1;  // the last unit the request touched: the next in the pass's order is prefetched
    for (int i = 0; i < n; ++i) {
      const int u = down ? n - 1 - i : i;
      if (units_[u].end <= q.begin || units_[u].begin >= q.end) continue;
      touched[u] = true;
      if (!resident_[u] && !flying[u]) issue(u), ++out.not_prefetched;  // gathered now
      if (buckets_.empty()) wait(u);  // in full, unless reads() waits bucket by bucket
      resident_[u] = true;
      edge = u;
    }
    if (edge >= 0 && !(read_driven_ && units_[edge].pinned)) prefetch(down ? edge - 1 : edge + 1);
    if (!buckets_.empty()) reads(q, q.work_after * work_us);
    else t += q.work_after * work_us;
  }
  // A prefetch the pass never asked for (the backward pass's past its last block) completes before the next pass.
  for (int u = 0; u < n; ++u)
    if (flying[u]) resident_[u] = true;
  for (double& at : out.issued) at = t > 0 ? at / t : 0.0;
  return out;
}

}  // namespace mt::plan
