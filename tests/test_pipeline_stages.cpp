// Pipeline stages of the GPT: a chain of stages computes exactly what the whole model computes (loss, every
// gradient, the tied embedding's as the sum of its two copies), the zero-bubble split backward (input pass, then
// weight pass) equals the one-pass backward, and a pipeline rank's chunks are laid out as documented. fp64, so
// "equal" means equal up to the last few bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/philox.h"
#include "kernels/elementwise.h"
#include "model/pipeline_chunks.h"
#include "test_support.h"

using namespace mt;

namespace {

GPTConfig small() {
  GPTConfig c;
  c.n_layer = 4;
  c.n_head = 2;
  c.d_model = 8;
  c.seq_len = 5;
  c.vocab_size = 11;
  return c;
}

void perturbed_init(GPT& m) {
  m.init(7, 0.3);
  // LayerNorm weights and biases away from 1/0 so their gradients are generic (keyed by name: same in every stage).
  for (int p = 0; p < m.table().size(); ++p) {
    const ParamSpec& s = m.table()[p];
    double* w = m.param(p).data_as<double>();
    for (int64_t i = 0; i < s.full_shape.numel(); ++i) w[i] += 0.1 * philox_normal(99, fnv1a64(s.name), i);
  }
}

void fill_batch(Activations& a, int V) {
  std::mt19937 rng(3);
  for (int64_t i = 0; i < a.tokens.numel(); ++i) {
    a.tokens.data_as<int32_t>()[i] = int32_t(rng() % V);
    a.targets.data_as<int32_t>()[i] = int32_t(rng() % V);
  }
}

double max_rel(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) scale = std::max(scale, std::fabs(b.data_as<double>()[i]));
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(a.data_as<double>()[i] - b.data_as<double>()[i]) / std::max(scale, 1e-300));
  return worst;
}

}  // namespace

TEST_CASE("a chain of pipeline stages computes the whole model's loss and gradients", "[pipeline][model]") {
  const GPTConfig cfg = small();
  const std::vector<int> layers{1, 2, 1};
  const int B = 2, T = 5;
  const double dloss = 1.0 / (B * T);
  GPT whole(cfg, DType::F64);
  perturbed_init(whole);
  Arena arena, scratch;
  Activations wa = whole.alloc_activations(arena, B, T);
  fill_batch(wa, cfg.vocab_size);
  Tensor whole_loss = Tensor::zeros({1}, DType::F64);
  whole.forward(wa, dloss, whole_loss);
  whole.backward(wa, scratch);

  std::vector<std::unique_ptr<GPT>> stages;
  std::vector<Activations> acts;
  for (int s = 0; s < 3; ++s) {
    stages.push_back(std::make_unique<GPT>(cfg, ModelPart{stage_blocks(layers, s), {}}, DType::F64));
    perturbed_init(*stages[s]);
    acts.push_back(stages[s]->alloc_activations(arena, B, T));
    fill_batch(acts[s], cfg.vocab_size);  // the first stage reads tokens, the last targets
  }
  CHECK(stages[0]->table().index_of("wpe.weight") >= 0);
  CHECK(stages[1]->table().index_of("wte.weight") < 0);
  CHECK(stages[2]->table().index_of("ln_f.weight") >= 0);
  CHECK(stages[2]->table().index_of("h.3.mlp.c_fc.weight") >= 0);
  CHECK(stages[2]->table().index_of("h.2.mlp.c_fc.weight") < 0);
  Tensor loss = Tensor::zeros({1}, DType::F64);
  for (int s = 0; s < 3; ++s) {
    if (s > 0) copy_convert(acts[s].input(), acts[s - 1].output());
    stages[s]->forward(acts[s], s == 2 ? dloss : 0.0, s == 2 ? loss : Tensor());
  }
  CHECK(loss.data_as<double>()[0] == Approx(whole_loss.data_as<double>()[0]).epsilon(1e-14));

  Tensor dout;
  for (int s = 2; s >= 0; --s) {
    Tensor dinput = s > 0 ? Tensor::zeros(acts[s].input().shape(), DType::F64) : Tensor();
    std::vector<int64_t> ready;
    std::vector<std::vector<double>> seen;  // the gradients [0, end) as each report found them
    const double* g = stages[s]->grads().data_as<double>();
    stages[s]->backward(acts[s], scratch, [&](int64_t end) {
      ready.push_back(end);
      seen.emplace_back(g, g + end);
    }, BackwardPart::All, dout, dinput);
    CHECK(std::is_sorted(ready.begin(), ready.end()));
    CHECK(ready.back() == stages[s]->table().total_numel());
    // A reducer sends what is reported final at once: nothing below a report may change after it. Each block
    // reports four times (docs/planner.md's ready points), the last stage once more after the head.
    for (size_t i = 0; i < ready.size(); ++i) CHECK(std::equal(seen[i].begin(), seen[i].end(), g));
    CHECK(ready.size() == size_t(4 * stages[s]->num_blocks() + (s == 2 ? 2 : 1)));
    dout = dinput;
  }
  for (int p = 0; p < whole.table().size(); ++p) {
    const std::string& name = whole.table()[p].name;
    Tensor sum = Tensor::zeros(whole.table()[p].shape, DType::F64);
    for (auto& st : stages) {  // wte: the embedding's part on stage 0 plus the head's on stage 2
      const int i = st->table().index_of(name);
      if (i >= 0) kernels::accumulate(sum, st->grad(i));
    }
    INFO(name);
    CHECK(max_rel(sum, whole.grad(p)) < 1e-12);
  }
}

TEST_CASE("the split backward (input pass, then weight pass) equals the one-pass backward", "[pipeline][model]") {
  const GPTConfig cfg = small();
  const std::vector<int> layers{2, 1, 1};
  const int B = 2, T = 5;
  for (int s = 0; s < 3; ++s) {
    INFO("stage " << s);
    const ModelPart part{stage_blocks(layers, s), {}};
    GPT one(cfg, part, DType::F64), two(cfg, part, DType::F64);
    perturbed_init(one);
    perturbed_init(two);
    Arena arena, scratch;
    Activations a1 = one.alloc_activations(arena, B, T), a2 = two.alloc_activations(arena, B, T, true);
    fill_batch(a1, cfg.vocab_size);
    fill_batch(a2, cfg.vocab_size);
    if (s > 0) {
      std::mt19937 rng(5);
      std::normal_distribution<double> nd;
      for (int64_t i = 0; i < a1.input().numel(); ++i) a1.input().data_as<double>()[i] = nd(rng);
      copy_convert(a2.input(), a1.input());
    }
    one.forward(a1, 0.1, Tensor());
    two.forward(a2, 0.1, Tensor());
    Tensor dout;
    if (s < 2) {
      dout = Tensor::zeros(a1.output().shape(), DType::F64);
      std::mt19937 rng(6);
      std::normal_distribution<double> nd;
      for (int64_t i = 0; i < dout.numel(); ++i) dout.data_as<double>()[i] = nd(rng);
    }
    Tensor din1 = s > 0 ? Tensor::zeros(a1.input().shape(), DType::F64) : Tensor();
    Tensor din2 = s > 0 ? Tensor::zeros(a1.input().shape(), DType::F64) : Tensor();
    one.backward(a1, scratch, {}, BackwardPart::All, dout, din1);
    int input_pass_calls = 0;
    two.backward(a2, scratch, [&](int64_t) { ++input_pass_calls; }, BackwardPart::InputOnly, dout, din2);
    CHECK(input_pass_calls == 0);  // nothing is final before the weight pass
    if (s > 0) CHECK(max_rel(din2, din1) < 1e-13);
    std::vector<int64_t> ready;
    two.backward_weights(a2, [&](int64_t end) { ready.push_back(end); });
    CHECK(std::is_sorted(ready.begin(), ready.end()));
    CHECK(ready.back() == two.table().total_numel());
    CHECK(max_rel(two.grads(), one.grads()) < 1e-13);
  }
}

TEST_CASE("a pipeline rank's chunks share flat buffers, last chunk first", "[pipeline]") {
  GPTConfig cfg = small();
  const std::vector<int> layers{1, 1, 1, 1};  // p = 2, v = 2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
  for (int rank = 0; rank < 2; ++rank) {
    PipelineChunks m(cfg, TensorSharding{}, layers, 2, rank, DType::F64);
    REQUIRE(m.size() == 2);
    CHECK(m.stage(0) == rank);
    CHECK(m.stage(1) == 2 + rank);
    CHECK(m.base(1) == 0);
    CHECK(m.base(0) >= m.chunk(1).table().total_numel());
    CHECK(m.chunk(0).params().data() == m.params().slice(m.base(0), {1}).data());
    CHECK(m.tied_chunk() == (rank == 0 ? 0 : 1));
    CHECK(m.tied_copy_is_head() == (rank == 1));
    const ParamTable t = PipelineChunks::rank_table(cfg, TensorSharding{}, layers, 2, rank);
    REQUIRE(t.size() == m.table().size());
    for (int i = 0; i < t.size(); ++i) {
      CHECK(t[i].name == m.table()[i].name);
      CHECK(t[i].offset == m.table()[i].offset);
    }
    CHECK(m.table().index_of(rank == 0 ? "h.2.ln_1.weight" : "h.1.ln_1.weight") >= 0);
    CHECK(m.table().index_of(rank == 0 ? "h.1.ln_1.weight" : "h.0.ln_1.weight") < 0);
  }
}
