// The typed config: one table of key descriptors (dotted name, field accessor, meaning) from which YAML parsing,
// `--set` overrides, to_yaml, the --help text and the nearest-key suggestion all derive, so no key list can
// drift from another. Each key's name is the stringized member path (`model.n_layer` -> cfg.model.n_layer), so
// the table cannot disagree with the structs either. Validation lives at the end of the file.
#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <variant>

#include "core/errors.h"

namespace mt {
namespace {

using FieldPtr = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*>;

struct KeyDesc {
  const char* name;  // the dotted key, e.g. "comm.emulate.latency_us"
  FieldPtr (*field)(Config&);
  const char* meaning;
};

// The key is the member path itself, so the YAML name and the struct field are one spelling.
#define MT_KEY(member, meaning) \
  KeyDesc { #member, [](Config& c) -> FieldPtr { return &c.member; }, meaning }

// Keys of one section must stay contiguous (to_yaml opens each section once).
const std::vector<KeyDesc>& key_table() {
  static const std::vector<KeyDesc> table = {
      MT_KEY(model.n_layer, "transformer blocks"),
      MT_KEY(model.n_head, "attention heads per block (must divide d_model and be divisible by tp)"),
      MT_KEY(model.d_model, "channels (embedding width)"),
      MT_KEY(model.seq_len, "tokens per sequence (context length)"),
      MT_KEY(model.vocab_size, "vocabulary size (padded internally for tp; padding never changes the loss)"),
      MT_KEY(model.init_std, "standard deviation of the normal weight init (residual projections scaled by 1/sqrt(2L))"),
      MT_KEY(model.init_from, "\"\" or a safetensors file with GPT-2 Hugging Face names to start from"),
      MT_KEY(parallel.dp, "data-parallel ranks; 0 = world / (tp * pp)"),
      MT_KEY(parallel.tp, "tensor-parallel ranks (Megatron column/row split)"),
      MT_KEY(parallel.pp, "pipeline stages"),
      MT_KEY(parallel.order, "mesh axis order, a permutation of tp, dp, pp joined by '-'; the first varies fastest"),
      MT_KEY(parallel.schedule, "pipeline schedule: 1f1b | gpipe | interleaved | zb1"),
      MT_KEY(parallel.virtual_stages, "model chunks per pipeline rank (> 1 needs schedule interleaved)"),
      MT_KEY(train.global_batch, "sequences per optimizer step (over all dp ranks and micro-batches)"),
      MT_KEY(train.micro_batch, "sequences per micro-batch per dp rank"),
      MT_KEY(train.steps, "optimizer steps to run"),
      MT_KEY(train.seed, "seed of the weight init, synthetic data and shuffling"),
      MT_KEY(train.grad_clip, "clip the global gradient norm to this; 0 = off"),
      MT_KEY(train.eval_every, "evaluate every this many steps; 0 = off"),
      MT_KEY(train.eval_batches, "global batches per evaluation"),
      MT_KEY(train.threads, "compute threads per rank; 0 = OMP_NUM_THREADS if set, else cores / ranks on the node"),
      MT_KEY(optim.lr, "peak learning rate"),
      MT_KEY(optim.min_lr, "learning rate at the end of the decay"),
      MT_KEY(optim.warmup_steps, "linear warm-up steps from 0 to lr"),
      MT_KEY(optim.schedule, "decay after warm-up: cosine | linear | constant"),
      MT_KEY(optim.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)"),
      MT_KEY(optim.beta1, "AdamW beta1"),
      MT_KEY(optim.beta2, "AdamW beta2"),
      MT_KEY(optim.eps, "AdamW epsilon"),
      MT_KEY(optim.zero, "ZeRO stage: 0 = off, 1 = optimizer state sharded over dp"),
      MT_KEY(precision.compute, "compute dtype: fp32 | bf16 | fp16 (master weights stay fp32)"),
      MT_KEY(precision.grad_reduce, "dtype of the data-parallel gradient reduction: fp32 | bf16"),
      MT_KEY(precision.loss_scale, "fp16 loss scale: dynamic | a positive number"),
      MT_KEY(data.source, "synthetic | tokens (uint16 .bin or llm.c shard) | text (UTF-8 bytes)"),
      MT_KEY(data.path, "training data file (required for tokens and text)"),
      MT_KEY(data.val_path, "validation data file; \"\" = hold out the tail (val_fraction)"),
      MT_KEY(data.order, "window order: sequential | shuffle (seeded, independent of the mesh)"),
      MT_KEY(data.synthetic_tokens, "length of the generated synthetic token stream"),
      MT_KEY(data.val_fraction, "fraction of the stream held out for validation when val_path is \"\""),
      MT_KEY(comm.backend, "communication backend: auto | mpi | nccl"),
      MT_KEY(comm.bucket_mb, "size of a data-parallel gradient bucket in MiB"),
      MT_KEY(comm.overlap, "overlap gradient reduction with the backward pass"),
      MT_KEY(comm.timeout_s, "watchdog: abort a communication wait that lasts longer than this (seconds)"),
      MT_KEY(comm.emulate.latency_us, "emulated per-message latency within a node (us); 0 = no emulation"),
      MT_KEY(comm.emulate.bandwidth_gbps, "emulated link bandwidth within a node (GB/s); 0 = unlimited"),
      MT_KEY(comm.emulate.ranks_per_node, "ranks per emulated node; 0 = all ranks on one node"),
      MT_KEY(comm.emulate.inter_latency_us, "emulated latency between nodes (us)"),
      MT_KEY(comm.emulate.inter_bandwidth_gbps, "emulated bandwidth between nodes (GB/s); 0 = unlimited"),
      MT_KEY(run.dir, "output directory; \"\" = runs/<config file stem>"),
      MT_KEY(run.log_every, "log a metrics line to the console every this many steps (metrics.jsonl gets every step)"),
      MT_KEY(run.checkpoint_every, "write a checkpoint every this many steps; 0 = off"),
      MT_KEY(run.resume, "auto (latest checkpoint in dir, if any) | none | a checkpoint path"),
      MT_KEY(run.profile, "write a Chrome trace (trace.json) of every rank"),
      MT_KEY(run.dump_grads, "\"\" or a safetensors path: write the first step's gradients there (parity tests)"),
      MT_KEY(device, "cpu | cuda"),
  };
  return table;
}
#undef MT_KEY

const KeyDesc* find_key(const std::string& name) {
  for (const KeyDesc& k : key_table())
    if (name == k.name) return &k;
  return nullptr;
}

// A section is any proper prefix of a key: "model", "comm", "comm.emulate".
std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const KeyDesc& k : key_table()) {
    std::string n = k.name;
    for (size_t p = n.find('.'); p != std::string::npos; p = n.find('.', p + 1)) {
      std::string s = n.substr(0, p);
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    }
  }
  return out;
}

bool is_section(const std::string& name) {
  auto s = section_names();
  return std::find(s.begin(), s.end(), name) != s.end();
}

// The keys directly or indirectly under a section, without the section prefix ("n_layer, n_head, ...").
std::string keys_under(const std::string& section) {
  std::string out;
  for (const KeyDesc& k : key_table()) {
    std::string n = k.name;
    if (n.compare(0, section.size() + 1, section + ".") != 0) continue;
    if (!out.empty()) out += ", ";
    out += n.substr(section.size() + 1);
  }
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_key(const std::string& name) {
  std::vector<std::string> candidates;
  for (const KeyDesc& k : key_table()) candidates.push_back(k.name);
  for (const std::string& s : section_names()) candidates.push_back(s);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;  // ties: the earlier (table order) wins
  }
  return best;
}

[[noreturn]] void unknown_key(const std::string& name, const std::string& where) {
  input_error("unknown key '{}' in {}; did you mean '{}'?", name, where, nearest_key(name));
}

const char* type_name(const FieldPtr& f) {
  switch (f.index()) {
    case 0: return "an integer";
    case 1: return "an integer";
    case 2: return "a non-negative integer";
    case 3: return "a number";
    case 4: return "a boolean (true/false)";
    default: return "a string";
  }
}

std::string describe(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsMap()) return "a section (map)";
  if (n.IsSequence()) return "a list";
  return "nothing (null)";
}

// Integers: optional sign and decimal digits only, so 3.5, 1e6 and 'four' are errors, never truncated. Accepts
// -max_neg <= value <= max_pos; sets out_of_range when the digits are fine but the value is not.
bool parse_integer(const std::string& s, unsigned long long max_neg, unsigned long long max_pos, bool& out_of_range,
                   unsigned long long& mag, bool& neg) {
  out_of_range = false;
  size_t i = 0;
  neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j)
    if (s[j] < '0' || s[j] > '9') return false;
  errno = 0;
  mag = std::strtoull(s.c_str() + i, nullptr, 10);
  if (errno == ERANGE || mag > (neg ? max_neg : max_pos)) return out_of_range = true, false;
  return true;
}

// Sets the field of `key` from a YAML scalar node; `where` says where the value came from (file:line or --set).
void set_field(Config& cfg, const KeyDesc& key, const YAML::Node& node, const std::string& where) {
  FieldPtr f = key.field(cfg);
  auto bad = [&](const char* extra = "") {
    input_error("{}: expected {}, got {}{} ({})", key.name, type_name(f), describe(node), extra, where);
  };
  if (auto* s = std::get_if<std::string*>(&f)) {
    if (node.IsNull()) { **s = ""; return; }
    if (!node.IsScalar()) bad();
    **s = node.Scalar();
    return;
  }
  if (!node.IsScalar()) bad();
  const std::string v = node.Scalar();
  if (auto* b = std::get_if<bool*>(&f)) {
    if (!YAML::convert<bool>::decode(node, **b)) bad();
    return;
  }
  if (auto* d = std::get_if<double*>(&f)) {
    char* end = nullptr;
    errno = 0;
    double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || std::isspace(static_cast<unsigned char>(v[0]))) bad();
    if (!std::isfinite(x) || errno == ERANGE) bad(" (out of range or not finite)");
    **d = x;
    return;
  }
  bool oor = false, neg = false;
  unsigned long long mag = 0;
  if (auto* i = std::get_if<int*>(&f)) {
    if (!parse_integer(v, 1ULL << 31, INT_MAX, oor, mag, neg)) bad(oor ? " (out of the 32-bit integer range)" : "");
    **i = static_cast<int>(neg ? -static_cast<long long>(mag) : static_cast<long long>(mag));
  } else if (auto* l = std::get_if<int64_t*>(&f)) {
    if (!parse_integer(v, 1ULL << 63, INT64_MAX, oor, mag, neg)) bad(oor ? " (out of the 64-bit integer range)" : "");
    **l = neg ? static_cast<int64_t>(0 - mag) : static_cast<int64_t>(mag);  // two's complement, incl. INT64_MIN
  } else if (auto* u = std::get_if<uint64_t*>(&f)) {
    if (!parse_integer(v, 0, UINT64_MAX, oor, mag, neg)) bad(oor ? " (out of the unsigned 64-bit range)" : "");
    **u = mag;
  }
}

std::string location(const std::string& file, const YAML::Node& node) {
  YAML::Mark m = node.Mark();
  if (m.is_null()) return file;
  return fmt::format("{} line {}, column {}", file, m.line + 1, m.column + 1);
}

// Walks a YAML map whose keys are relative to `prefix`. A key may itself be dotted ("model.n_layer: 4" at the
// top level), so flat and nested files both work.
void load_map(Config& cfg, const YAML::Node& map, const std::string& prefix, const std::string& file) {
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())
      input_error("{}: a key must be a plain name, got {}", location(file, kv.first), describe(kv.first));
    const std::string full = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    if (const KeyDesc* k = find_key(full)) {
      set_field(cfg, *k, kv.second, location(file, kv.second));
    } else if (is_section(full)) {
      if (kv.second.IsMap()) load_map(cfg, kv.second, full, file);
      else if (!kv.second.IsNull())  // an empty section ("comm:") keeps its defaults
        input_error("{} is a section (keys: {}), got {} ({})", full, keys_under(full), describe(kv.second),
                    location(file, kv.second));
    } else {
      unknown_key(full, location(file, kv.first));
    }
  }
}

// The text of a value as to_yaml and --help write it (doubles in shortest round-trip form).
std::string format_value(const FieldPtr& f) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return *p;
        else if constexpr (std::is_same_v<T, double>) {
          std::string s = fmt::format("{}", *p);  // shortest text that reads back to the same double
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 1.0, not 1: a float to any YAML reader
          return s;
        } else return fmt::format("{}", *p);
      },
      f);
}

// --- validation helpers ---

template <typename... Args>
void require(bool ok, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok) throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

void require_one_of(const std::string& key, const std::string& v, const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), v) != names.end()) return;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  input_error("{}='{}' is not one of: {}", key, v, list);
}

}  // namespace

void apply_override(Config& cfg, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    input_error("--set expects KEY=VALUE (e.g. --set optim.lr=3e-4), got '{}'", assignment);
  const std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  const std::string where = "--set " + assignment;
  const KeyDesc* k = find_key(key);
  if (!k) {
    if (is_section(key))
      input_error("'{}' is a section (keys: {}); --set needs one full key such as '{}.{}' ({})", key,
                  keys_under(key), key, keys_under(key).substr(0, keys_under(key).find(',')), where);
    unknown_key(key, where);
  }
  // The value follows the same YAML scalar rules as the file: quotes are stripped, 3e-4 is a number, "" is null.
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    input_error("{}: cannot parse '{}' as a YAML value: {} ({})", key, value, e.msg, where);
  }
  set_field(cfg, *k, node, where);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) input_error("config file '{}' does not exist", path);
  if (fs::is_directory(path, ec)) input_error("config file '{}' is a directory, not a YAML file", path);
  std::ifstream in(path);
  if (!in) input_error("cannot read config file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) input_error("cannot read config file '{}'", path);

  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    input_error("config file '{}' is not valid YAML: line {}, column {}: {}", path, e.mark.line + 1,
                e.mark.column + 1, e.msg);
  }
  if (!root.IsMap())
    input_error("config file '{}': the top level must be a map of sections (model:, train:, ...), got {}", path,
                root.IsNull() ? std::string("an empty document") : describe(root));

  Config cfg;
  cfg.source_path = path;
  load_map(cfg, root, "", path);
  for (const std::string& o : overrides) apply_override(cfg, o);
  if (cfg.run.dir.empty()) cfg.run.dir = "runs/" + fs::path(path).stem().string();
  validate_values(cfg);
  return cfg;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const KeyDesc& k : key_table()) out.push_back(k.name);
  return out;
}

std::string config_value(const Config& cfg, const std::string& key) {
  const KeyDesc* k = find_key(key);
  if (!k) unknown_key(key, "config_value()");
  return format_value(k->field(const_cast<Config&>(cfg)));  // read only
}

std::string to_yaml(const Config& cfg) {
  Config& c = const_cast<Config&>(cfg);  // the accessors are only read here
  YAML::Emitter out;
  out << YAML::Comment("meshtrain resolved config (load it with --config; every key is listed)");
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the section path currently open, e.g. {"comm", "emulate"}
  for (const KeyDesc& k : key_table()) {
    std::vector<std::string> parts;
    std::stringstream ss(k.name);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    const std::string leaf = parts.back();
    parts.pop_back();
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    for (size_t i = open.size(); i > common; --i) out << YAML::EndMap;
    open.resize(common);
    for (size_t i = common; i < parts.size(); ++i) {
      out << YAML::Key << parts[i] << YAML::Value << YAML::BeginMap;
      open.push_back(parts[i]);
    }
    out << YAML::Key << leaf << YAML::Value;
    FieldPtr f = k.field(c);
    if (auto* s = std::get_if<std::string*>(&f)) out << YAML::DoubleQuoted << **s;
    else out << format_value(f);
  }
  for (size_t i = open.size(); i > 0; --i) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string help_text() {
  Config defaults;
  std::string out =
      "Config keys (YAML sections; any key can be overridden with --set section.key=VALUE, the last one wins):\n";
  std::string section = "\x01";
  for (const KeyDesc& k : key_table()) {
    std::string name = k.name;
    size_t dot = name.rfind('.');
    std::string sec = dot == std::string::npos ? "" : name.substr(0, name.find('.'));
    if (sec != section) {
      section = sec;
      out += "\n" + (sec.empty() ? std::string("top level") : sec) + ":\n";
    }
    FieldPtr f = k.field(defaults);
    std::string def = format_value(f);
    if (std::holds_alternative<std::string*>(f)) def = "\"" + def + "\"";
    out += fmt::format("  {:<34} {:<12} {}\n", name, def, k.meaning);
  }
  return out;
}

int resolved_dp(const Config& cfg, int world) {
  const ParallelConfig& p = cfg.parallel;
  require(p.tp >= 1 && p.pp >= 1, "parallel.tp={} and parallel.pp={} must be >= 1", p.tp, p.pp);
  require(world >= 1, "the number of ranks must be >= 1, got {}", world);
  if (p.dp > 0) return p.dp;
  const long long tp_pp = static_cast<long long>(p.tp) * p.pp;
  require(world % tp_pp == 0,
          "parallel.tp*pp={}*{}={} does not divide the {} ranks (parallel.dp=0 means dp = ranks / (tp*pp))", p.tp,
          p.pp, tp_pp, world);
  return static_cast<int>(world / tp_pp);
}

void validate_values(const Config& c) {
  const ModelConfig& m = c.model;
  require(m.n_layer > 0, "model.n_layer must be > 0, got {}", m.n_layer);
  require(m.n_head > 0, "model.n_head must be > 0, got {}", m.n_head);
  require(m.d_model > 0, "model.d_model must be > 0, got {}", m.d_model);
  require(m.seq_len > 0, "model.seq_len must be > 0, got {}", m.seq_len);
  require(m.vocab_size > 0, "model.vocab_size must be > 0, got {}", m.vocab_size);
  require(m.init_std > 0, "model.init_std must be > 0, got {}", m.init_std);
  require(m.d_model % m.n_head == 0, "model.d_model={} is not divisible by model.n_head={}", m.d_model, m.n_head);

  const ParallelConfig& p = c.parallel;
  require(p.dp >= 0, "parallel.dp must be >= 0 (0 = ranks / (tp*pp)), got {}", p.dp);
  require(p.tp >= 1, "parallel.tp must be >= 1, got {}", p.tp);
  require(p.pp >= 1, "parallel.pp must be >= 1, got {}", p.pp);
  require(p.virtual_stages >= 1, "parallel.virtual_stages must be >= 1, got {}", p.virtual_stages);
  {
    std::vector<std::string> axes;
    std::stringstream ss(p.order);
    for (std::string a; std::getline(ss, a, '-');) axes.push_back(a);
    std::vector<std::string> sorted = axes;
    std::sort(sorted.begin(), sorted.end());
    require(sorted == std::vector<std::string>{"dp", "pp", "tp"} && p.order.back() != '-',
            "parallel.order='{}' must be a permutation of tp, dp, pp joined by '-' (e.g. tp-dp-pp)", p.order);
  }
  require_one_of("parallel.schedule", p.schedule, {"1f1b", "gpipe", "interleaved", "zb1"});
  require(p.virtual_stages == 1 || p.schedule == "interleaved",
          "parallel.virtual_stages={} needs parallel.schedule=interleaved, got '{}'", p.virtual_stages, p.schedule);
  require(m.n_head % p.tp == 0, "model.n_head={} is not divisible by parallel.tp={}", m.n_head, p.tp);
  require(m.n_layer % (static_cast<long long>(p.pp) * p.virtual_stages) == 0,
          "model.n_layer={} is not divisible by parallel.pp*virtual_stages={}*{}={}", m.n_layer, p.pp,
          p.virtual_stages, static_cast<long long>(p.pp) * p.virtual_stages);

  const TrainConfig& t = c.train;
  require(t.global_batch > 0, "train.global_batch must be > 0, got {}", t.global_batch);
  require(t.micro_batch > 0, "train.micro_batch must be > 0, got {}", t.micro_batch);
  require(t.steps > 0, "train.steps must be > 0, got {}", t.steps);
  require(t.grad_clip >= 0, "train.grad_clip must be >= 0 (0 = off), got {}", t.grad_clip);
  require(t.eval_every >= 0, "train.eval_every must be >= 0 (0 = off), got {}", t.eval_every);
  require(t.eval_batches >= 1, "train.eval_batches must be >= 1, got {}", t.eval_batches);
  require(t.threads >= 0, "train.threads must be >= 0 (0 = automatic), got {}", t.threads);

  const OptimConfig& o = c.optim;
  require(o.lr > 0, "optim.lr must be > 0, got {}", o.lr);
  require(o.min_lr >= 0, "optim.min_lr must be >= 0, got {}", o.min_lr);
  require(o.min_lr <= o.lr, "optim.min_lr={} is larger than optim.lr={}", o.min_lr, o.lr);
  require(o.warmup_steps >= 0, "optim.warmup_steps must be >= 0, got {}", o.warmup_steps);
  require_one_of("optim.schedule", o.schedule, {"cosine", "linear", "constant"});
  require(o.weight_decay >= 0, "optim.weight_decay must be >= 0, got {}", o.weight_decay);
  require(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 must be in [0, 1), got {}", o.beta1);
  require(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 must be in [0, 1), got {}", o.beta2);
  require(o.eps > 0, "optim.eps must be > 0, got {}", o.eps);
  require(o.zero == 0 || o.zero == 1, "optim.zero must be 0 or 1, got {}", o.zero);

  const PrecisionConfig& pr = c.precision;
  require_one_of("precision.compute", pr.compute, {"fp32", "bf16", "fp16"});
  require_one_of("precision.grad_reduce", pr.grad_reduce, {"fp32", "bf16"});
  if (pr.loss_scale != "dynamic") {
    char* end = nullptr;
    double s = std::strtod(pr.loss_scale.c_str(), &end);
    require(!pr.loss_scale.empty() && end == pr.loss_scale.c_str() + pr.loss_scale.size() && std::isfinite(s) && s > 0,
            "precision.loss_scale='{}' must be 'dynamic' or a positive number", pr.loss_scale);
  }

  const DataConfig& d = c.data;
  require_one_of("data.source", d.source, {"synthetic", "tokens", "text"});
  require_one_of("data.order", d.order, {"sequential", "shuffle"});
  require(d.source == "synthetic" || !d.path.empty(), "data.source={} needs data.path (a file), but it is empty",
          d.source);
  require(d.val_fraction >= 0 && d.val_fraction < 1, "data.val_fraction must be in [0, 1), got {}", d.val_fraction);
  require(d.source != "synthetic" || d.synthetic_tokens > static_cast<int64_t>(m.seq_len) + 1,
          "data.synthetic_tokens={} must be larger than model.seq_len+1={}", d.synthetic_tokens, m.seq_len + 1);

  const CommConfig& cm = c.comm;
  require_one_of("comm.backend", cm.backend, {"auto", "mpi", "nccl"});
  require(cm.bucket_mb > 0, "comm.bucket_mb must be > 0, got {}", cm.bucket_mb);
  require(cm.timeout_s > 0, "comm.timeout_s must be > 0, got {}", cm.timeout_s);
  const EmulateConfig& e = cm.emulate;
  require(e.latency_us >= 0, "comm.emulate.latency_us must be >= 0, got {}", e.latency_us);
  require(e.bandwidth_gbps >= 0, "comm.emulate.bandwidth_gbps must be >= 0 (0 = unlimited), got {}", e.bandwidth_gbps);
  require(e.ranks_per_node >= 0, "comm.emulate.ranks_per_node must be >= 0, got {}", e.ranks_per_node);
  require(e.inter_latency_us >= 0, "comm.emulate.inter_latency_us must be >= 0, got {}", e.inter_latency_us);
  require(e.inter_bandwidth_gbps >= 0, "comm.emulate.inter_bandwidth_gbps must be >= 0 (0 = unlimited), got {}",
          e.inter_bandwidth_gbps);

  const RunConfig& r = c.run;
  require(r.log_every >= 1, "run.log_every must be >= 1, got {}", r.log_every);
  require(!r.resume.empty(), "run.resume must be auto, none or a checkpoint path, got an empty string");
  require(r.checkpoint_every >= 0, "run.checkpoint_every must be >= 0 (0 = off), got {}", r.checkpoint_every);

  require_one_of("device", c.device, {"cpu", "cuda"});
  require(cm.backend != "nccl" || c.device == "cuda", "comm.backend=nccl needs device=cuda, got device={}",
          c.device);
}

void validate(const Config& c, int world_size) {
  validate_values(c);
  const ParallelConfig& p = c.parallel;
  const int dp = resolved_dp(c, world_size);
  const long long mesh = static_cast<long long>(dp) * p.tp * p.pp;
  require(mesh == world_size, "parallel.dp*tp*pp={}*{}*{}={} does not equal the number of ranks ({})", dp, p.tp,
          p.pp, mesh, world_size);
  const long long per_step = static_cast<long long>(dp) * c.train.micro_batch;
  require(c.train.global_batch % per_step == 0,
          "train.global_batch={} is not divisible by dp*micro_batch={}*{}={} (micro-batches per step = "
          "global_batch / (dp*micro_batch) must be whole)",
          c.train.global_batch, dp, c.train.micro_batch, per_step);
}

}  // namespace mt
