// Model weights in and out: Hugging Face GPT-2 and Llama safetensors import/export and config.json.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "core/errors.h"
#include "model/gpt.h"
#include "model/safetensors.h"

namespace mt {

namespace {

// Names in the file that carry no parameters: GPT-2's causal-mask buffers and Llama's rotary frequencies (older
// files keep them), and an LM head tied to the embedding (written by some exporters all the same).
bool ignorable(const std::string& name, const GPTConfig& cfg) {
  auto ends_with = [&](const char* suf) {
    std::string s(suf);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (cfg.llama()) return ends_with(".rotary_emb.inv_freq") || (cfg.tie_embeddings && name == "lm_head.weight");
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || name == "lm_head.weight";
}

std::string strip_prefix(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
}

std::vector<SafetensorOut> unpadded_views(const GPT& m, const Tensor& flat, std::vector<std::vector<float>>& keep) {
  std::vector<SafetensorOut> out;
  keep.clear();
  keep.reserve(m.table().size());
  for (const ParamSpec& s : m.table().specs()) {
    const int64_t n = s.full_shape.numel();  // padding rows are the tail of wte, so a prefix is the full tensor
    keep.emplace_back(n);
    Tensor dst(keep.back().data(), {n}, DType::F32);
    copy_convert(dst, flat.slice(s.offset, {n}));
    std::vector<int64_t> shape(s.full_shape.d.begin(), s.full_shape.d.begin() + s.full_shape.n);
    out.push_back({s.name, DType::F32, shape, keep.back().data()});
  }
  return out;
}

void check_float_dtype(const SafetensorsFile& f, const SafetensorInfo& info) {
  if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16" && info.dtype != "F64")
    input_error("safetensors file '{}': tensor '{}' has dtype {}, not a float type (F32, BF16, F16, F64)", f.path(),
                info.name, info.dtype);
}

// Decodes elements [begin, begin + n) of a float tensor (F32, F64, BF16, F16) in the file into `out`.
void decode_range(const SafetensorsFile& f, const SafetensorInfo& info, int64_t begin, int64_t n, double* out) {
  check_float_dtype(f, info);
  const unsigned char* base = f.data(info);
  if (info.dtype == "F32") {
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, base + 4 * (begin + i), 4);
      out[i] = v;
    }
  } else if (info.dtype == "F64") {
    std::memcpy(out, base + 8 * begin, 8 * n);
  } else {  // BF16 or F16
    const bool bf = info.dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, base + 2 * (begin + i), 2);
      out[i] = bf ? bf16_to_float(h) : fp16_to_float(h);
    }
  }
}

}  // namespace

void GPT::load_safetensors(const std::string& path, const Tensor& into) {
  const Tensor flat = into.defined() ? into : params_;
  CHECK(flat.defined() && flat.numel() == table_.total_numel(),
        "load_safetensors: a buffer of {} elements for {} parameters", flat.numel(), table_.total_numel());
  SafetensorsFile f = SafetensorsFile::open(path);
  std::set<std::string> loaded;
  // A pipeline stage holds some of the model's tensors: the rest belong to other stages, not to no model.
  const ParamTable all = gpt_param_table(cfg_, ModelPart{BlockSlice{}, sharding()});
  zero_(flat);
  for (const SafetensorInfo& info : f.tensors()) {
    if (ignorable(strip_prefix(info.name), cfg_) || ignorable(info.name, cfg_)) continue;
    const std::string name = cfg_.llama() ? info.name : strip_prefix(info.name);
    const int p = table_.index_of(name);
    if (p < 0 && all.index_of(name) >= 0) {
      if (!loaded.insert(name).second) input_error("{}: tensor '{}' appears twice (with and without prefix)", path, name);
      continue;
    }
    if (p < 0) {
      const bool other = cfg_.llama() ? name.find("wte.") != std::string::npos || name.find(".c_attn.") != std::string::npos
                                      : name.find("model.layers.") == 0 || name.find("embed_tokens") != std::string::npos;
      input_error("{}: unknown tensor '{}' for a {} with n_layer={}{}", path, info.name,
                  cfg_.llama() ? "Llama" : "GPT-2", cfg_.n_layer,
                  other ? fmt::format(": the file holds a {} (model.arch={} reads it)", cfg_.llama() ? "GPT-2" : "Llama",
                                      cfg_.llama() ? "gpt2" : "llama")
                        : "");
    }
    if (!loaded.insert(name).second) input_error("{}: tensor '{}' appears twice (with and without prefix)", path, name);
    const ParamSpec& s = table_[p];
    Shape want = s.full_shape;
    // A checkpoint may hold more positions than this run's seq_len: take the first seq_len rows.
    const bool is_wpe = name == "wpe.weight";
    bool shape_ok = info.shape.size() == static_cast<size_t>(want.n);
    for (int i = 0; shape_ok && i < want.n; ++i)
      shape_ok = (is_wpe && i == 0) ? info.shape[0] >= want[0] : info.shape[i] == want[i];
    if (!shape_ok) {
      std::string got;
      for (size_t i = 0; i < info.shape.size(); ++i) got += (i ? ", " : "") + std::to_string(info.shape[i]);
      input_error("{}: tensor '{}' has shape [{}], the model expects {}", path, info.name, got, want.str());
    }
    // The file holds the full tensor; decode only this rank's shard, run by run. Global indices below
    // full_numel() index the file's tensor directly (wpe: its first seq_len rows); the rest is vocabulary
    // padding and stays zero.
    check_float_dtype(f, info);  // even when this rank's shard is all padding
    std::vector<double> buf(s.numel(), 0.0);
    const int64_t len = s.run_length(), full = s.full_numel();
    for (int64_t q = 0; q < s.num_runs(); ++q) {
      const int64_t g0 = s.run_global_begin(q);
      const int64_t n = std::max<int64_t>(0, std::min(len, full - g0));
      if (n > 0) decode_range(f, info, g0, n, buf.data() + q * len);
    }
    copy_convert(flat.slice(s.offset, s.shape), Tensor(buf.data(), s.shape, DType::F64));
  }
  for (const ParamSpec& s : table_.specs())
    if (!loaded.count(s.name)) input_error("{}: tensor '{}' is missing", path, s.name);
}

void GPT::export_safetensors(const std::string& path) const {
  CHECK(sharding().tp == 1, "export_safetensors writes a tp = 1 model; gather the {} shards with assemble_full and "
        "write_full_safetensors (model/tp_shard.h)", sharding().tp);
  std::vector<std::vector<float>> keep;
  write_safetensors(path, unpadded_views(*this, params_, keep), {{"format", "pt"}});
}

void GPT::export_grads(const std::string& path) const {
  CHECK(sharding().tp == 1, "export_grads writes a tp = 1 model; gather the {} shards with assemble_full and "
        "write_full_safetensors (model/tp_shard.h)", sharding().tp);
  std::vector<std::vector<float>> keep;
  write_safetensors(path, unpadded_views(*this, grads_, keep), {{"format", "pt"}});
}

void write_hf_config(const std::string& path, const GPTConfig& cfg) {
  std::ofstream f(path);
  if (!f) input_error("cannot write {}", path);
  if (cfg.llama()) {
    // A LlamaConfig: what Hugging Face's loader reads to rebuild the model (rope_scaling none, no biases).
    f << "{\n"
      << "  \"architectures\": [\"LlamaForCausalLM\"],\n"
      << "  \"model_type\": \"llama\",\n"
      << "  \"hidden_act\": \"silu\",\n"
      << "  \"hidden_size\": " << cfg.d_model << ",\n"
      << "  \"intermediate_size\": " << cfg.mlp_hidden() << ",\n"
      << "  \"num_hidden_layers\": " << cfg.n_layer << ",\n"
      << "  \"num_attention_heads\": " << cfg.n_head << ",\n"
      << "  \"num_key_value_heads\": " << cfg.kv_heads() << ",\n"
      << "  \"max_position_embeddings\": " << cfg.seq_len << ",\n"
      << "  \"vocab_size\": " << cfg.vocab_size << ",\n"
      << "  \"rms_norm_eps\": " << fmt::format("{:g}", cfg.norm_eps) << ",\n"
      << "  \"rope_theta\": " << fmt::format("{:g}", cfg.rope_theta) << ",\n"
      << "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n  \"attention_dropout\": 0.0,\n"
      << "  \"tie_word_embeddings\": " << (cfg.tie_embeddings ? "true" : "false") << ",\n"
      << "  \"torch_dtype\": \"float32\"\n"
      << "}\n";
    return;
  }
  f << "{\n"
    << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
    << "  \"model_type\": \"gpt2\",\n"
    << "  \"activation_function\": \"gelu_new\",\n"
    << "  \"layer_norm_epsilon\": 1e-05,\n"
    << "  \"n_layer\": " << cfg.n_layer << ",\n"
    << "  \"n_head\": " << cfg.n_head << ",\n"
    << "  \"n_embd\": " << cfg.d_model << ",\n"
    << "  \"n_positions\": " << cfg.seq_len << ",\n"
    << "  \"n_ctx\": " << cfg.seq_len << ",\n"
    << "  \"vocab_size\": " << cfg.vocab_size << ",\n"
    << "  \"attn_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"resid_pdrop\": 0.0,\n"
    << "  \"tie_word_embeddings\": true,\n"
    << "  \"torch_dtype\": \"float32\"\n"
    << "}\n";
}

}  // namespace mt
