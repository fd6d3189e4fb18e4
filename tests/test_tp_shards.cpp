// Tensor-parallel shard layouts of the parameter table: tp ranks initialise exactly their shards of the tp = 1
// weights, the local -> global index map tiles every parameter, safetensors import cuts a rank's shard out of a
// full file, and assembled shards export byte-identically to a tp = 1 model.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "model/gpt.h"
#include "model/tp_shard.h"
#include "test_support.h"

using namespace mt;

namespace {

GPTConfig small(int vocab) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 16;
  c.seq_len = 8;
  c.vocab_size = vocab;
  return c;
}

// Tensor-parallel rank tp_rank's part of the whole model.
ModelPart tp_part(int tp, int tp_rank) { return {BlockSlice{}, {tp, tp_rank, false}}; }

// One GPT per tp rank.
std::vector<std::unique_ptr<GPT>> shards(int vocab, int tp) {
  std::vector<std::unique_ptr<GPT>> m;
  for (int r = 0; r < tp; ++r) m.push_back(std::make_unique<GPT>(small(vocab), tp_part(tp, r), DType::F32));
  return m;
}

std::vector<const float*> flats(const std::vector<std::unique_ptr<GPT>>& m) {
  std::vector<const float*> f;
  for (const auto& g : m) f.push_back(g->params().data_as<float>());
  return f;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string temp_path(const std::string& name) { return mt::test::tmp_path("tp_shards", name); }

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

}  // namespace

TEST_CASE("padded vocabulary is a multiple of kVocabAlign * tp", "[model][tp]") {
  CHECK(padded_vocab(250) == 256);
  CHECK(padded_vocab(11) == 64);
  CHECK(padded_vocab(50257) == 50304);  // tp = 1: unchanged
  CHECK(padded_vocab(250, 4) == 256);
  CHECK(padded_vocab(300, 2) == 384);
  CHECK(padded_vocab(300, 4) == 512);
  CHECK(padded_vocab(50257, 4) == 50432);
  GPT m(small(250), tp_part(4, 3), DType::F32);
  CHECK(m.vocab_padded() == 256);
  CHECK(m.vocab_shard() == 64);
  CHECK(m.vocab_begin() == 192);
}

TEST_CASE("shard shapes follow Megatron's layout", "[model][tp]") {
  const int64_t C = 16;
  GPT m(small(250), tp_part(4, 1), DType::F32);
  auto local = [&](const std::string& name) { return m.table()[m.table().index_of(name)].shape; };
  CHECK(local("wte.weight") == Shape{64, C});
  CHECK(local("wpe.weight") == Shape{8, C});
  CHECK(local("h.0.attn.c_attn.weight") == Shape{C, 3 * C / 4});
  CHECK(local("h.0.attn.c_attn.bias") == Shape{3 * C / 4});
  CHECK(local("h.0.attn.c_proj.weight") == Shape{C / 4, C});
  CHECK(local("h.0.attn.c_proj.bias") == Shape{C});
  CHECK(local("h.1.mlp.c_fc.weight") == Shape{C, C});
  CHECK(local("h.1.mlp.c_fc.bias") == Shape{C});
  CHECK(local("h.1.mlp.c_proj.weight") == Shape{C, C});
  CHECK(local("h.1.mlp.c_proj.bias") == Shape{C});
  CHECK(local("h.1.ln_2.weight") == Shape{C});
  CHECK(local("ln_f.bias") == Shape{C});
  // c_attn: rank 1 of 4 holds head 1's q, k and v columns, in that order.
  const ParamSpec& qkv = m.table()[m.table().index_of("h.0.attn.c_attn.weight")];
  const int64_t HS = C / 4;
  for (int64_t row = 0; row < C; ++row)
    for (int64_t j = 0; j < 3 * HS; ++j) {
      const int64_t group = j / HS, col = group * C + 1 * HS + j % HS;
      REQUIRE(qkv.global_index(row * 3 * HS + j) == row * 3 * C + col);
    }
  const ParamSpec& bias = m.table()[m.table().index_of("h.0.attn.c_attn.bias")];
  for (int64_t j = 0; j < 3 * HS; ++j) REQUIRE(bias.global_index(j) == (j / HS) * C + HS + j % HS);
  // wte: rank 1 holds vocabulary rows 64..127.
  const ParamSpec& wte = m.table()[m.table().index_of("wte.weight")];
  CHECK(wte.global_index(0) == 64 * C);
  CHECK(wte.global_index(64 * C - 1) == 128 * C - 1);
  // Padding: only wte's rows >= vocab_size.
  CHECK_FALSE(wte.is_padding(250 * C - 1));
  CHECK(wte.is_padding(250 * C));
}

TEST_CASE("the local -> global index map covers every element exactly once", "[model][tp]") {
  for (int tp : {1, 2, 4})
    for (int vocab : {256, 250, 300}) {
      auto m = shards(vocab, tp);
      const ParamTable& t0 = m[0]->table();
      for (int p = 0; p < t0.size(); ++p) {
        const ParamSpec& s0 = t0[p];
        INFO("tp " << tp << " vocab " << vocab << " " << s0.name);
        std::vector<int> count(s0.global_shape.numel(), 0);
        for (int r = 0; r < tp; ++r) {
          const ParamSpec& s = m[r]->table()[p];
          REQUIRE(s.name == s0.name);
          REQUIRE(s.offset == s0.offset);  // every tp rank has the same flat layout
          REQUIRE(s.shape == s0.shape);
          REQUIRE(s.shard.part == r);
          REQUIRE(s.num_runs() * s.run_length() == s.numel());
          for (int64_t l = 0; l < s.numel(); ++l) {
            const int64_t g = s.global_index(l);
            REQUIRE(g >= 0);
            REQUIRE(g < s.global_shape.numel());
            ++count[g];
          }
        }
        const int want = s0.shard.whole() ? tp : 1;  // replicated: every rank covers all of it
        for (int64_t g = 0; g < int64_t(count.size()); ++g) REQUIRE(count[g] == want);
      }
    }
}

TEST_CASE("tp ranks initialise exactly their shards of the tp=1 weights", "[model][tp]") {
  for (int vocab : {256, 250, 300}) {
    GPT ref(small(vocab), DType::F32);
    ref.init(1234, 0.02);
    const auto full_ref = assemble_full(ref.table(), {ref.params().data_as<float>()});
    const std::string ref_path = temp_path("ref.safetensors");
    ref.export_safetensors(ref_path);
    for (int tp : {1, 2, 4}) {
      INFO("vocab " << vocab << " tp " << tp);
      auto m = shards(vocab, tp);
      for (auto& g : m) g->init(1234, 0.02);
      const auto full = assemble_full(m[0]->table(), flats(m));
      REQUIRE(full.size() == full_ref.size());
      for (size_t p = 0; p < full.size(); ++p) {
        INFO(ref.table()[int(p)].name);
        REQUIRE(full[p].size() == full_ref[p].size());
        REQUIRE(same_bits(full[p].data(), full_ref[p].data(), int64_t(full[p].size())));
      }
      // Each shard is the matching slice of the full weights, vocabulary padding zero.
      for (int r = 0; r < tp; ++r)
        for (int p = 0; p < m[r]->table().size(); ++p) {
          const ParamSpec& s = m[r]->table()[p];
          std::vector<float> want(s.numel());
          extract_shard(s, full_ref[p].data(), want.data());
          REQUIRE(same_bits(m[r]->param(p).data_as<float>(), want.data(), s.numel()));
          for (int64_t l = 0; l < s.numel(); ++l)
            if (s.is_padding(s.global_index(l))) REQUIRE(m[r]->param(p).data_as<float>()[l] == 0.0f);
        }
      // The assembled weights export byte-identically to the tp = 1 model (unpadded wte included).
      const std::string path = temp_path("tp.safetensors");
      write_full_safetensors(path, m[0]->table(), full);
      REQUIRE(slurp(path) == slurp(ref_path));
      std::remove(path.c_str());
    }
    std::remove(ref_path.c_str());
  }
}

TEST_CASE("load_safetensors of a tp=1 export gives each tp rank its initial shard", "[model][tp][io]") {
  for (int vocab : {256, 250}) {
    GPT ref(small(vocab), DType::F32);
    ref.init(77, 0.02);
    const std::string path = temp_path("full.safetensors");
    ref.export_safetensors(path);
    for (int tp : {2, 4}) {
      auto inited = shards(vocab, tp);
      auto loaded = shards(vocab, tp);
      for (int r = 0; r < tp; ++r) {
        inited[r]->init(77, 0.02);
        loaded[r]->load_safetensors(path);
        INFO("vocab " << vocab << " tp " << tp << " rank " << r);
        REQUIRE(same_bits(loaded[r]->params().data_as<float>(), inited[r]->params().data_as<float>(),
                          inited[r]->table().total_numel()));
      }
    }
    std::remove(path.c_str());
  }
}

TEST_CASE("a GPT refuses a tp degree that does not divide n_head", "[model][tp]") {
  // CHECK aborts (the config validation reports these as input errors before a model is built): run each in a
  // child process and expect it to abort.
  auto aborts = [](const ModelPart& part) {
    return !test::abort_message("tp_shards", [&] { GPT m(small(256), part, DType::F32); }).empty();
  };
  CHECK(aborts(tp_part(3, 0)));  // n_head 4 over tp 3
  CHECK(aborts(tp_part(2, 2)));  // tp_rank out of range
  CHECK_FALSE(aborts(tp_part(4, 3)));
}
