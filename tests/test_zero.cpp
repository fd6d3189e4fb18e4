// ZeRO's sharding arithmetic: the gradient units and buckets of ZeRO-2 (parallel/sharded_grads.h), the optimizer
// segments of a rank's shards (train/zero_shards.h), and ShardedGrads' accumulation over passes with its two
// ring buffers (or three shared with ZeRO-3's parameters), on 1 rank here and on 2 and 3 through mpiexec (tests/comm_tests.cmake) with rank-valued gradients
// whose sums are exact.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "comm/make_communicator.h"
#include "core/arena.h"
#include "model/gpt.h"
#include "parallel/param_gather.h"
#include "parallel/sharded_grads.h"
#include "parallel/sharded_params.h"
#include "train/zero_shards.h"

using namespace mt;

namespace {

GPTConfig gpt2(int n_layer) {
  GPTConfig c;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 8;
  c.vocab_size = 64;
  return c;
}

// Rank r's gradient of element i in pass k is (i % 7 + r + k) / 4: added to the unit's parameters' views.
void add_pass_grads(const ParamTable& t, const GradUnit& unit, const std::vector<Tensor>& views, int r, int k) {
  for (int p = 0; p < t.size(); ++p) {
    if (t[p].offset < unit.begin || t[p].offset >= unit.end) continue;
    float* g = views[p].data_as<float>();
    for (int64_t j = 0; j < t[p].numel(); ++j) g[j] += float(((t[p].offset + j) % 7 + r + k) / 4.0);
  }
}

// This rank's shards hold each pass's average over the P ranks (exact for P = 2, rounded once for P = 3), added
// in fp32.
void check_pass_averages(const ShardedGrads& z, int passes, int P) {
  const float* shards = z.shard_grads().data_as<float>();
  for (int b = 0; b < static_cast<int>(z.buckets().size()); ++b)
    for (int64_t j = 0; j < z.shard(b).size(); ++j) {
      const int64_t i = z.buckets()[b].begin + z.shard(b).begin + j;
      float want = 0;
      for (int k = 0; k < passes; ++k) {
        double sum = 0;
        for (int q = 0; q < P; ++q) sum += (i % 7 + q + k) / 4.0;
        want += float(sum / P);
      }
      REQUIRE(shards[z.shard_offset(b) + j] == want);
    }
}

// Units tile [0, total) in order.
void check_tiling(const std::vector<GradUnit>& units, int64_t total) {
  REQUIRE(!units.empty());
  CHECK(units.front().begin == 0);
  CHECK(units.back().end == total);
  for (size_t u = 1; u < units.size(); ++u) CHECK(units[u].begin == units[u - 1].end);
}

}  // namespace

TEST_CASE("gradient units: the head's parameters, one unit per block, the embeddings, and which are pinned", "[zero]") {
  const GPTConfig g = gpt2(3);
  const ParamTable t = gpt_param_table(g);
  const std::vector<GradUnit> units = grad_units(t, true, false);
  check_tiling(units, t.total_numel());
  REQUIRE(units.size() == 5);  // ln_f, blocks 2, 1, 0, then wte and wpe
  CHECK(units[0].end == t[t.index_of("ln_f.bias")].offset + 16);
  for (int u = 1; u <= 3; ++u) {
    const int l = 3 - u;
    CHECK(units[u].begin == t[t.index_of("h." + std::to_string(l) + ".mlp.c_proj.weight")].offset);
    CHECK(units[u].end - units[u].begin == 12 * 16 * 16 + 13 * 16);
    CHECK(!units[u].pinned);
  }
  CHECK(!units[0].pinned);
  CHECK(units[4].pinned);  // the tied head writes wte's gradient first in every backward pass
  CHECK(!grad_units(t, false, false)[4].pinned);
  for (const GradUnit& u : grad_units(t, true, true)) CHECK(u.pinned);  // zb1

  GPTConfig four = g;  // a middle pipeline stage of four blocks: blocks only
  four.n_layer = 4;
  const ParamTable tm = gpt_param_table(four, {BlockSlice{1, 3}, {}});
  const std::vector<GradUnit> um = grad_units(tm, true, false);
  check_tiling(um, tm.total_numel());
  CHECK(um.size() == 2);

  GPTConfig llama = g;  // Llama, untied: the head unit holds lm_head and the norm
  llama.arch = ModelArch::Llama;
  llama.n_kv_head = 1;
  llama.multiple_of = 16;
  const ParamTable tl = gpt_param_table(llama);
  const std::vector<GradUnit> ul = grad_units(tl, false, false);
  check_tiling(ul, tl.total_numel());
  REQUIRE(ul.size() == 5);
  CHECK(ul[0].end == tl[tl.index_of("model.norm.weight")].offset + 16);
  CHECK(tl[tl.index_of("lm_head.weight")].offset < ul[0].end);
  CHECK(!ul[4].pinned);
}

TEST_CASE("gradient units: sub-block units cut each block in three, about a third of it each", "[zero]") {
  // optim.zero_unit: sublayer. GPT-2 (C = 16): the MLP's output projection (4 C^2 + C), its input projection with
  // ln_2 (4 C^2 + 4 C + 2 C), the attention with ln_1 (C^2 + C + 3 C^2 + 3 C + 2 C); the head's and the embeddings'
  // units as before.
  const GPTConfig g = gpt2(3);
  const ParamTable t = gpt_param_table(g);
  const std::vector<GradUnit> units = grad_units(t, true, false, true);
  check_tiling(units, t.total_numel());
  REQUIRE(units.size() == 1 + 3 * 3 + 1);
  const int64_t C = 16;
  for (int l = 0; l < 3; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const int u = 1 + 3 * (2 - l);  // layout order: ln_f, block 2, 1, 0, the embeddings
    CHECK(units[u].begin == t[t.index_of(h + "mlp.c_proj.weight")].offset);
    CHECK(units[u + 1].begin == t[t.index_of(h + "mlp.c_fc.weight")].offset);
    CHECK(units[u + 2].begin == t[t.index_of(h + "attn.c_proj.weight")].offset);
    CHECK(units[u].end - units[u].begin == 4 * C * C + C);
    CHECK(units[u + 1].end - units[u + 1].begin == 4 * C * C + 6 * C);
    CHECK(units[u + 2].end - units[u + 2].begin == 4 * C * C + 6 * C);
    CHECK(units[u + 2].end == t[t.index_of(h + "ln_1.bias")].offset + C);
  }
  CHECK(ring_slot_numel(units) == 4 * C * C + 6 * C);  // two slots: two thirds of a block, not two blocks
  CHECK(units.back().pinned);
  CHECK(grad_units(t, true, false, false).size() == 5);

  GPTConfig llama = g;  // Llama: the down projection; up, gate and the post-attention norm; o, v, k, q, input norm
  llama.arch = ModelArch::Llama;
  llama.n_kv_head = 1;
  llama.multiple_of = 16;
  const ParamTable tl = gpt_param_table(llama);
  const std::vector<GradUnit> ul = grad_units(tl, false, false, true);
  check_tiling(ul, tl.total_numel());
  REQUIRE(ul.size() == 1 + 3 * 3 + 1);
  for (int l = 0; l < 3; ++l) {
    const int u = 1 + 3 * (2 - l);
    CHECK(ul[u].begin == tl[tl.index_of(llama_layer_name(l, 8))].offset);      // mlp.down_proj
    CHECK(ul[u + 1].begin == tl[tl.index_of(llama_layer_name(l, 7))].offset);  // mlp.up_proj
    CHECK(ul[u + 2].begin == tl[tl.index_of(llama_layer_name(l, 4))].offset);  // self_attn.o_proj
    CHECK(ul[u + 2].end == tl[tl.index_of(llama_layer_name(l, 0))].offset + C);
  }
}

TEST_CASE("gradient buckets: a quarter of the size within bucket_bytes of either end of the layout", "[zero]") {
  const ParamTable t = gpt_param_table(gpt2(3));
  const int64_t n = t.total_numel();
  std::set<int64_t> starts;
  for (const ParamSpec& p : t.specs()) starts.insert(p.offset);
  for (double per : {200.0, 1000.0, 3000.0, 6000.0, double(n)}) {
    INFO("bucket elements " << per);
    const std::vector<Bucket> b = make_buckets(t, n, 4, 4 * per);
    REQUIRE(!b.empty());
    CHECK(b.front().begin == 0);
    CHECK(b.back().end == n);
    for (size_t k = 0; k < b.size(); ++k) {
      if (k) CHECK(b[k].begin == b[k - 1].end);
      CHECK(starts.count(b[k].begin) == 1);
      const bool one_param = std::none_of(t.specs().begin(), t.specs().end(), [&](const ParamSpec& p) {
        return p.offset > b[k].begin && p.offset < b[k].end;
      });
      const bool edge = per < n && (b[k].begin < per || b[k].begin >= n - per);
      CHECK((double(b[k].numel()) <= (edge ? per / 4 : per) || one_param));
    }
    if (per == n) CHECK(b.size() == 1);  // the whole model in one bucket: nothing to cut
    if (per <= n / 4)  // the middle keeps the full size
      CHECK(std::any_of(b.begin(), b.end(), [&](const Bucket& k) { return double(k.numel()) > per / 4; }));
  }
}

TEST_CASE("gradient buckets cut at given offsets: a range of its own, the rest untouched", "[zero]") {
  const std::vector<Bucket> b = {{0, 10}, {10, 30}, {30, 40}};
  auto cut = [&](std::vector<int64_t> at) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const Bucket& k : cut_buckets(b, at)) out.emplace_back(k.begin, k.end);
    return out;
  };
  using V = std::vector<std::pair<int64_t, int64_t>>;
  CHECK(cut({}) == V{{0, 10}, {10, 30}, {30, 40}});
  CHECK(cut({0, 10, 40}) == V{{0, 10}, {10, 30}, {30, 40}});  // at the edges: nothing to cut
  CHECK(cut({24, 14, 24}) == V{{0, 10}, {10, 14}, {14, 24}, {24, 30}, {30, 40}});
  CHECK(cut({32, 40}) == V{{0, 10}, {10, 30}, {30, 32}, {32, 40}});  // the last parameter alone
}

TEST_CASE("unit buckets: within a unit, at most the bucket size unless one parameter is larger", "[zero]") {
  const ParamTable t = gpt_param_table(gpt2(3));
  const std::vector<GradUnit> units = grad_units(t, true, false);
  for (double bytes : {1.0, 4.0 * 300, 4.0 * 5000, 1e9}) {
    INFO("bucket bytes " << bytes);
    const std::vector<Bucket> b = unit_buckets(t, units, 4, bytes);
    REQUIRE(!b.empty());
    CHECK(b.front().begin == 0);
    CHECK(b.back().end == t.total_numel());
    std::set<int64_t> starts;
    for (const ParamSpec& p : t.specs()) starts.insert(p.offset);
    for (size_t k = 0; k < b.size(); ++k) {
      if (k) CHECK(b[k].begin == b[k - 1].end);
      CHECK(starts.count(b[k].begin) == 1);  // cut at parameter boundaries
      int inside = 0;
      for (const GradUnit& u : units) inside += b[k].begin >= u.begin && b[k].end <= u.end;
      CHECK(inside == 1);
      const bool one_param = std::none_of(t.specs().begin(), t.specs().end(), [&](const ParamSpec& p) {
        return p.offset > b[k].begin && p.offset < b[k].end;
      });
      CHECK((double(b[k].numel()) * 4 <= bytes || one_param));
    }
    if (bytes == 1e9) CHECK(b.size() == units.size());  // one bucket per unit
  }
}

TEST_CASE("zero segments: the ranks' shards cover every element once, packed in bucket order", "[zero]") {
  const ParamTable t = gpt_param_table(gpt2(2));
  const std::vector<Bucket> b = unit_buckets(t, grad_units(t, true, false), 4, 4.0 * 700);
  for (int dp : {1, 2, 3, 8}) {
    INFO("dp " << dp);
    std::vector<int> seen(t.total_numel(), 0);
    for (int r = 0; r < dp; ++r) {
      int64_t packed = 0;
      for (const OptimSegment& g : zero_segments(t, b, dp, r)) {
        CHECK(g.state_offset == packed);  // no gaps: shard elements are contiguous in the packed state
        packed += g.numel;
        for (int64_t i = g.offset; i < g.offset + g.numel; ++i) ++seen[i];
        // A segment lies within one parameter and takes its decay.
        const ParamSpec* p = nullptr;
        for (const ParamSpec& s : t.specs())
          if (g.offset >= s.offset && g.offset < s.offset + s.numel()) p = &s;
        REQUIRE(p);
        CHECK(g.offset + g.numel <= p->offset + p->numel());
        CHECK(g.decay == p->decay);
      }
      int64_t shards = 0;
      for (const Bucket& k : b) shards += shard_range(k.numel(), dp, r).size();
      CHECK(packed == shards);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  }
}

// Three micro-batches through a 3-block model's units, as a backward pass reports them: the ring's two buffers
// are reused by blocks 2 and 0, the pinned embedding keeps its own. Rank r's gradient element i in pass k is
// (i % 7 + r + k) / 4: the sums over ranks are exact in fp32, so each pass's average is rounded at most once.
TEST_CASE("ShardedGrads: every pass reduce-scattered and added into this rank's shards", "[zero][sharded]") {
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int P = dp->size(), r = dp->rank();
  const ParamTable t = gpt_param_table(gpt2(3));
  const std::vector<GradUnit> units = grad_units(t, true, false);
  for (bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    ShardedGrads z(*dp, t, units, unit_buckets(t, units, 4, 4.0 * 900), DType::F32, DType::F32, Device::CPU);
    const std::vector<Tensor> views = z.grad_views();
    z.zero();
    const int passes = 3;
    for (int k = 0; k < passes; ++k) {
      REQUIRE(z.begin_pass(k == passes - 1, overlap));
      for (size_t u = 0; u < units.size(); ++u) {
        add_pass_grads(t, units[u], views, r, k);  // += through the parameters' views, as the backward pass does
        z.grads_ready(units[u].end);
      }
    }
    z.finish();
    check_pass_averages(z, passes, P);
    // The next step starts from zero.
    z.zero();
    for (int64_t i = 0; i < z.shard_numel(); ++i) REQUIRE(z.shard_grads().data_as<float>()[i] == 0.0f);
  }
}

// ZeRO-3's shared ring (sharded_grads.h): two slots hold the gathered parameters, and each unit's gradients are
// written over its parameters, as the model does (GPT::set_grads_over_params: each parameter reported as read, then
// zeroed, then accumulated into). The parameter store gathers each unit into the slot that the reduction of the unit
// two before it is still reading, and a forward pass between backward passes gathers over the last unit's reduction
// too. The shards must still be the averages of what the passes wrote, as in the test above: with 3 passes
// (reductions staged, then added) and with one (reduced straight into the shards). The parameters are large, so a
// reduction read after a gather overwrote it, or a gather still landing after the gradients were written, gives
// wrong shards.
TEST_CASE("ShardedGrads: a ring shared with the gathered parameters keeps every reduction", "[zero][sharded]") {
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int P = dp->size(), r = dp->rank();
  const ParamTable t = gpt_param_table(gpt2(3));
  const std::vector<GradUnit> units = grad_units(t, true, false);
  const int n = static_cast<int>(units.size());
  for (const int passes : {3, 1})
  for (const bool reads : {false, true}) {
    // reads: the passes report each parameter they read, as the trainer's model does, so no request waits for a
    // whole unit; the backward pass reads no bias, so those buckets are waited for only when their gradients are
    // written (GPT::grad reports them as reads).
    INFO("passes " << passes << (reads ? ", reads reported, biases not read backward" : ""));
    ShardedGradsOptions opts;
    opts.shared_ring = true;
    opts.reduces_once = passes == 1;
    const std::vector<Bucket> buckets = unit_buckets(t, units, 4, 4.0 * 900);
    ShardedGrads z(*dp, t, units, buckets, DType::F32, DType::F32, Device::CPU, {}, opts);
    REQUIRE(z.ring_slots().numel() == 2 * ring_slot_numel(units));
    CHECK(z.bytes() == int64_t(4 * (sharded_grads_size(units, buckets, P, r, opts).store +
                                    sharded_grads_size(units, buckets, P, r, opts).staging)));
    ShardedParams params(*dp, t, units, buckets, DType::F32, Device::CPU, {}, z.ring_slots());
    Tensor weights = Tensor::zeros({t.total_numel()}, DType::F32);
    for (int64_t i = 0; i < weights.numel(); ++i) weights.data_as<float>()[i] = 1000.0f + float(i % 13);
    params.load_shards(weights);
    const std::vector<Tensor> views = z.grad_views(), weight_views = params.param_views();
    const std::function<void(int)> read = reads ? params.reader() : std::function<void(int)>();
    // What a pass reads of unit u once it asked for it: the weights, never a slot's gradients (a unit kept from the
    // forward pass, or left in a slot the gradients took).
    auto reads_weights = [&](int u, bool biases) {
      for (int p = 0; p < t.size(); ++p) {
        const bool bias = t[p].name.size() > 4 && t[p].name.compare(t[p].name.size() - 4, 4, "bias") == 0;
        if (t[p].offset < units[u].begin || t[p].offset >= units[u].end || (bias && !biases)) continue;
        if (read) read(p);
        if (std::memcmp(weight_views[p].data(), weights.data_as<float>() + t[p].offset, weight_views[p].nbytes()))
          return false;
      }
      return true;
    };
    z.zero();
    params.begin_step();
    for (int k = 0; k < passes; ++k) {
      params.begin_pass(PassOrder::Forward);  // gathers every unit, over the previous pass's last reduction
      for (int u = n - 1; u >= 0; --u) {
        params.forward_needs(units[u].begin);
        CHECK(reads_weights(u, true));
      }
      params.begin_pass(PassOrder::Backward);
      REQUIRE(z.begin_pass(k == passes - 1, true));
      for (int u = 0; u < n; ++u) {
        params.backward_needs(units[u].begin, units[u].end);
        CHECK(reads_weights(u, !reads));
        for (int p = 0; p < t.size(); ++p)  // each gradient written over its parameter
          if (t[p].offset >= units[u].begin && t[p].offset < units[u].end && !units[u].pinned) {
            if (read) read(p);
            zero_(views[p]);
          }
        add_pass_grads(t, units[u], views, r, k);
        z.grads_ready(units[u].end);
      }
    }
    z.finish();
    check_pass_averages(z, passes, P);
    // And the parameters read through the ring are the weights, not gradients.
    Tensor whole = Tensor::zeros({t.total_numel()}, DType::F32);
    params.gather_into(whole);
    CHECK(std::memcmp(whole.data(), weights.data(), whole.nbytes()) == 0);
  }
}

TEST_CASE("ShardedParams: a model reading its gathered units computes the whole model's step", "[zero][sharded]") {
  // ZeRO-3's store (parallel/sharded_params.h) behind GPT's parameter views and both passes' hooks: every rank keeps
  // only its shards of the weights, gathers each unit into a ring of two slots when a pass asks (prefetching the
  // next; a pass keeps the two units the pass before it ended with, where it starts), and must give the flat model's
  // loss and gradients bit for bit, over two forward and backward passes.
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  GPTConfig llama = gpt2(3);
  llama.arch = ModelArch::Llama;
  llama.n_kv_head = 1;
  llama.multiple_of = 16;
  for (const GPTConfig& c : {gpt2(4), llama})
  for (const int mode : {0, 1, 2}) {
    INFO((c.llama() ? "llama (untied head: no pinned unit)" : "gpt2 (tied: the embedding pinned)"));
    // reads: the model reports each parameter it reads (the trainer's way), so a forward request waits for no
    // whole unit and each read waits for its own bucket. Sub-block units (three per block) follow the reads.
    const bool reads = mode > 0, sublayers = mode == 2;
    INFO((sublayers ? "sub-block units, following the reads"
                    : reads ? "reads reported: waits bucket by bucket" : "waits unit by unit"));
    GPT flat(c, DType::F64), viewed(c, DType::F64);
    flat.init(11, 0.2);
    const ParamTable& t = flat.table();
    const std::vector<GradUnit> units = grad_units(t, c.tied(), false, sublayers);
    ShardedParams z(*dp, t, units, unit_buckets(t, units, 8, 8.0 * 700), DType::F64, Device::CPU);
    z.load_shards(flat.params());
    viewed.set_param_views(z.param_views());
    if (reads) viewed.set_param_read_hook(z.reader());
    if (sublayers) z.set_read_driven();
    {
      // The trainer's initialisation: each parameter drawn alone (GPT::init_param) and its elements' shards loaded,
      // which must give the shards of the whole model's init.
      ShardedParams parts(*dp, t, units, unit_buckets(t, units, 8, 8.0 * 700), DType::F64, Device::CPU);
      for (int p = 0; p < t.size(); ++p) {
        Tensor part = Tensor::zeros({t[p].numel()}, DType::F32);
        flat.init_param(11, 0.2, p, part);
        parts.load_shards(part, t[p].offset);
      }
      Tensor whole32 = Tensor::zeros({t.total_numel()}, DType::F32);
      GPT(c, DType::F32).init(11, 0.2, whole32);  // fp32, as the trainer draws them
      z.load_shards(whole32);
      CHECK(std::memcmp(parts.shards().data(), z.shards().data(), z.shards().nbytes()) == 0);
      z.load_shards(flat.params());
    }
    int64_t ring = 0, pinned = 0, largest = 0, pinned_numel = 0;
    for (const GradUnit& u : units) {
      (u.pinned ? pinned : ring) += 1;
      if (u.pinned) pinned_numel += u.end - u.begin;
      else largest = std::max(largest, u.end - u.begin);
    }
    CHECK(z.buffer_bytes() == (2 * largest + pinned_numel) * 8);  // two ring slots and the pinned units

    Arena arena, scratch;
    Activations a = flat.alloc_activations(arena, 2, 8), b = viewed.alloc_activations(arena, 2, 8);
    for (int64_t i = 0; i < a.tokens.numel(); ++i) {
      a.tokens.data_as<int32_t>()[i] = b.tokens.data_as<int32_t>()[i] = int32_t((i * 7) % 64);
      a.targets.data_as<int32_t>()[i] = b.targets.data_as<int32_t>()[i] = int32_t((i * 5 + 3) % 64);
    }
    Tensor want = Tensor::zeros({1}, DType::F64), got = Tensor::zeros({1}, DType::F64);
    zero_(flat.grads());
    zero_(viewed.grads());
    z.begin_step();
    const int64_t step_start = z.gathers_issued();
    z.prefetch_forward_start();  // as the trainer does after each optimizer step
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t before = pass == 0 ? step_start : z.gathers_issued(), missed = z.gathers_not_prefetched();
      flat.forward(a, 0.1, want);
      z.begin_pass(PassOrder::Forward);
      viewed.forward(b, 0.1, got, [&](int64_t begin) { z.forward_needs(begin); });
      // Each unit gathered once per forward pass (the pinned ones once per step), not once per request; the step's
      // first pass finds its first units in flight (prefetch_forward_start), and the second keeps the last two ring
      // units the backward pass before it ended with (block 0 and block 1, or Llama's untied embeddings and block
      // 0; with sub-block units block 0's last two, or the embeddings and its attention), which it reads first.
      // Every other unit is prefetched.
      CHECK(z.gathers_issued() - before == (pass == 0 ? ring + pinned : ring - 2));
      CHECK(z.gathers_not_prefetched() - missed == 0);
      scratch.reset();
      flat.backward(a, scratch);
      z.begin_pass(PassOrder::Backward);
      scratch.reset();
      const int64_t missed_bwd = z.gathers_not_prefetched(), issued_bwd = z.gathers_issued();
      viewed.backward(b, scratch, {}, BackwardPart::All, {}, {},
                      [&](int64_t lo, int64_t hi) { z.backward_needs(lo, hi); });
      // The head's unit and the last block (its MLP output projection) stay from the forward pass; every other unit
      // is prefetched.
      CHECK(z.gathers_issued() - issued_bwd == ring - 2);
      CHECK(z.gathers_not_prefetched() - missed_bwd == 0);
    }
    CHECK(got.data_as<double>()[0] == want.data_as<double>()[0]);
    CHECK(std::memcmp(viewed.grads().data(), flat.grads().data(), flat.grads().nbytes()) == 0);
    // The export's gather: every rank holds the whole weights again.
    Tensor whole = Tensor::zeros({t.total_numel()}, DType::F64);
    z.gather_into(whole);
    CHECK(std::memcmp(whole.data(), flat.params().data(), whole.nbytes()) == 0);
  }
}

TEST_CASE("ParamGather: a parameter read waits for its own bucket, and a read of every bucket gathers it all",
          "[zero][sharded]") {
  // ZeRO-1/2's gather after the optimizer (parallel/param_gather.h), on demand as the late-gather test hook makes
  // it: nothing is sent until a read asks. A read through reader() gathers exactly its parameter's bucket; the
  // others keep the other ranks' stale elements until read or waited for.
  CommOptions o;
  o.timeout_s = 60;
  auto dp = make_communicator(MPI_COMM_WORLD, "dp", o);
  const int P = dp->size(), r = dp->rank();
  GPT model(gpt2(2), DType::F32);
  const ParamTable& t = model.table();
  const std::vector<Bucket> buckets = make_buckets(t, t.total_numel(), 4, 4.0 * 600);
  REQUIRE(buckets.size() >= 3);
  // Element i: its value where this rank owns it (its shard of the bucket), -1 (stale) elsewhere.
  const Tensor params = model.params();
  float* v = params.data_as<float>();
  for (const Bucket& b : buckets)
    for (int64_t i = b.begin; i < b.end; ++i) {
      const ShardRange s = shard_range(b.numel(), P, r);
      v[i] = (i - b.begin >= s.begin && i - b.begin < s.end) ? float(i % 97) : -1.0f;
    }
  ParamGather g(*dp, buckets);
  g.set_on_demand();
  const std::function<void(int)> read = g.reader(t);
  g.launch(params);
  auto gathered = [&](const Bucket& b) {
    for (int64_t i = b.begin; i < b.end; ++i)
      if (v[i] != float(i % 97)) return false;
    return true;
  };
  const int p = t.index_of("h.1.mlp.c_fc.weight");  // inside one bucket
  int in = -1;
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b)
    if (buckets[b].begin <= t[p].offset && t[p].offset < buckets[b].end) in = b;
  REQUIRE(in >= 0);
  read(p);
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
    INFO("bucket " << b << " of " << buckets.size() << ", the read's " << in);
    CHECK(gathered(buckets[b]) == (b == in || P == 1));
  }
  for (int q = 0; q < t.size(); ++q) read(q);
  for (const Bucket& b : buckets) CHECK(gathered(b));
}
