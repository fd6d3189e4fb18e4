// The typed config: one table of key descriptors (dotted name, field accessor, meaning) from which YAML parsing,
// `--set` overrides, to_yaml, the --help text and the nearest-key suggestion all derive, so no key list can
// drift from another. Each key's name is the stringized member path (`model.n_layer` -> cfg.model.n_layer), so
// the table cannot disagree with the structs either. Validation lives in config_validate.cpp.
#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>

#include "core/errors.h"
#include "core/input_file.h"

namespace mt {
namespace {

// An enum-valued key, type-erased: the name of its value, setting it from a name (false: not one of `names`).
struct EnumField {
  std::function<std::string()> get;
  std::function<bool(const std::string&)> set;
  std::vector<std::string> names;
};

using FieldPtr =
    std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<int>*, EnumField>;

template <typename E, size_t N>
EnumField enum_field(E* p, const EnumName<E> (&names)[N]) {
  const auto* table = &names;  // a static table
  EnumField f{[p, table] { return std::string(enum_name(*table, *p)); },
              [p, table](const std::string& s) { return enum_from_name(*table, s, *p); },
              {}};
  for (const EnumName<E>& n : names) f.names.push_back(n.name);
  return f;
}

// A member's field: its address, or for an enum its type's names (core/enum_names.h).
template <typename T>
FieldPtr field_of(T* p) {
  if constexpr (std::is_enum_v<T>) return enum_field(p, enum_names(T{}));
  else return p;
}

struct KeyDesc {
  const char* name;  // the dotted key, e.g. "comm.emulate.latency_us"
  FieldPtr (*field)(Config&);
  const char* meaning;
};

// The key is the member path itself, so the YAML name and the struct field are one spelling.
#define MT_KEY(member, meaning) \
  KeyDesc { #member, [](Config& c) -> FieldPtr { return field_of(&c.member); }, meaning }
// An enum key that accepts only some of its type's values (the DType keys), listed in `names`.
#define MT_KEY_IN(member, names, meaning) \
  KeyDesc { #member, [](Config& c) -> FieldPtr { return enum_field(&c.member, names); }, meaning }

// Keys of one section must stay contiguous (to_yaml opens each section once).
const std::vector<KeyDesc>& key_table() {
  static const std::vector<KeyDesc> table = {
      MT_KEY(model.arch, "the block family: gpt2 | llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention)"),
      MT_KEY(model.n_layer, "transformer blocks"),
      MT_KEY(model.n_head, "attention heads per block (must divide d_model and be divisible by tp)"),
      MT_KEY(model.d_model, "channels (embedding width)"),
      MT_KEY(model.seq_len, "tokens per sequence (context length)"),
      MT_KEY(model.vocab_size, "vocabulary size (padded internally for tp; padding never changes the loss)"),
      MT_KEY(model.n_kv_head, "llama: key/value heads (grouped-query attention; must divide n_head); 0 = n_head"),
      MT_KEY(model.ffn_hidden, "llama: SwiGLU hidden size; 0 = 2/3 of 4*d_model rounded up to model.multiple_of"),
      MT_KEY(model.multiple_of, "llama: the SwiGLU hidden size rule's rounding (when ffn_hidden is 0)"),
      MT_KEY(model.norm_eps, "llama: RMSNorm epsilon"),
      MT_KEY(model.rope_theta, "llama: rotary position embedding base"),
      MT_KEY(model.tie_embeddings, "llama: the output head reads the token embedding (GPT-2's always does)"),
      MT_KEY(model.init_std, "standard deviation of the normal weight init (gpt2: residual projections scaled by "
                             "1/sqrt(2L))"),
      MT_KEY(model.init_from, "\"\" or a safetensors file with Hugging Face names (GPT-2 or Llama) to start from"),
      MT_KEY(parallel.dp, "data-parallel ranks; 0 = world / (tp * pp * cp)"),
      MT_KEY(parallel.tp, "tensor-parallel ranks (Megatron column/row split)"),
      MT_KEY(parallel.sequence_parallel, "Megatron sequence parallelism: shard the residual stream and LayerNorms' rows over tp (needs seq_len % tp == 0)"),
      MT_KEY(parallel.pp, "pipeline stages"),
      MT_KEY(parallel.cp, "context-parallel ranks: each sequence split over them (ring attention; seq_len % (2*cp) == 0)"),
      MT_KEY(parallel.order, "mesh axis order, a permutation of tp, dp, pp (and cp, else right after tp) joined by '-'; "
                             "the first varies fastest"),
      MT_KEY(parallel.schedule, "pipeline schedule: 1f1b | gpipe | interleaved | zb1"),
      MT_KEY(parallel.reshard_after_forward, "ZeRO-3: true = gather each block again for every pass; false = keep "
                                             "every block gathered until the step ends (ZeRO-2's traffic); auto = "
                                             "true without pipeline parallelism, false with it"),
      MT_KEY(parallel.virtual_stages, "model chunks per pipeline rank (> 1 needs schedule interleaved)"),
      MT_KEY(parallel.stage_layers, "transformer blocks of each virtual stage s = chunk*pp + rank, contiguous in s "
                                    "(e.g. [3, 5]; pp*virtual_stages entries >= 1 summing to model.n_layer); "
                                    "[] = n_layer / (pp*virtual_stages) each"),
      MT_KEY(train.global_batch, "sequences per optimizer step (over all dp ranks and micro-batches)"),
      MT_KEY(train.micro_batch, "sequences per micro-batch per dp rank"),
      MT_KEY(train.steps, "optimizer steps to run"),
      MT_KEY(train.seed, "seed of the weight init, synthetic data and shuffling"),
      MT_KEY(train.grad_clip, "clip the global gradient norm to this; 0 = off"),
      MT_KEY(train.eval_every, "evaluate every this many steps; 0 = off"),
      MT_KEY(train.eval_batches, "global batches per evaluation"),
      MT_KEY(train.threads, "compute threads per rank; 0 = OMP_NUM_THREADS if set, else cores / ranks on the node"),
      MT_KEY(train.pin_threads, "when ranks x compute threads fill the node's cores: each rank's threads on cores of "
                                "its own, one per compute thread (its communication threads share them); false = "
                                "the OS places every thread"),
      MT_KEY(train.cpu_matmul, "the CPU's fp32 and bf16 matmul library: auto (oneDNN for fp32 from AVX2 on and for "
                               "bf16 on AMX or AMD's AVX512-BF16, where each measured faster; Eigen otherwise) | eigen "
                               "| onednn"),
      MT_KEY(train.skip_nonfinite, "skip (and count) a step whose loss or gradient norm is inf or NaN instead of "
                                   "stopping the run"),
      MT_KEY(train.recompute, "activation recomputation: none | light (the norms' outputs and the MLP's "
                              "activation) | selective (the attention probabilities) | full (each block from its "
                              "input, in its backward)"),
      MT_KEY(train.straggler.ranks, "emulated stragglers: the global ranks slowed down; [] = every rank (when "
                                    "slowdown or delay_ms is set)"),
      MT_KEY(train.straggler.slowdown, "those ranks' forward and backward passes take this many times as long "
                                       "(>= 1; the extra is slept, using no CPU)"),
      MT_KEY(train.straggler.delay_ms, "mean of a random delay (slept) before each step on those ranks; 0 = none"),
      MT_KEY(train.straggler.delay_sigma, "tail of that delay: sigma of a log-normal with that mean, seeded by "
                                          "train.seed, rank and step; 0 = the same delay every step"),
      MT_KEY(optim.lr, "peak learning rate"),
      MT_KEY(optim.min_lr, "learning rate at the end of the decay"),
      MT_KEY(optim.warmup_steps, "linear warm-up steps from 0 to lr"),
      MT_KEY(optim.schedule, "decay after warm-up: cosine | linear | constant"),
      MT_KEY(optim.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)"),
      MT_KEY(optim.beta1, "AdamW beta1"),
      MT_KEY(optim.beta2, "AdamW beta2"),
      MT_KEY(optim.eps, "AdamW epsilon"),
      MT_KEY(optim.zero, "ZeRO stage: 0 = off, 1 = optimizer state sharded over the dp x cp replicas, 2 = "
                         "gradients sharded too, 3 = parameters sharded too (each block gathered before its passes)"),
      MT_KEY(optim.zero_reduce, "ZeRO-2 under gradient accumulation: micro_batch (reduce-scatter after every "
                                "micro-batch: no whole gradient buffer) | step (once, on the last micro-batch: "
                                "a whole gradient buffer, ZeRO-1's memory, 1/m of the traffic)"),
      MT_KEY(optim.zero_unit, "ZeRO-2 and -3's units of gathered parameters and reduced gradients: block (each "
                              "transformer block) | sublayer (each block's attention, MLP input and MLP output "
                              "projection apart: a third of a block's buffers, more and smaller collectives)"),
      MT_KEY(optim.name, "optimizer: adamw | sgd (with momentum)"),
      MT_KEY(optim.momentum, "SGD momentum (optim.name=sgd)"),
      MT_KEY(optim.sync_every, "local SGD: 0 = synchronous (gradients averaged every step); H >= 1 = replicas step "
                               "alone and average their parameters every H steps"),
      MT_KEY(optim.outer, "local SGD outer optimizer on the averaged change: none | nesterov (DiLoCo)"),
      MT_KEY(optim.outer_lr, "local SGD outer learning rate (optim.outer=nesterov)"),
      MT_KEY(optim.outer_momentum, "local SGD outer Nesterov momentum (optim.outer=nesterov)"),
      MT_KEY(optim.staleness, "stale-synchronous data parallelism: 0 = synchronous; S >= 1 = gradient averages "
                              "run in the background, no replica more than S steps ahead of the slowest"),
      MT_KEY(optim.staleness_policy, "with staleness S: newest (apply every average already complete, S steps "
                                     "late at most) | fixed (exactly S steps late: repeats bit for bit)"),
      MT_KEY_IN(precision.compute, compute_dtype_names(),
                "compute dtype: fp32 | bf16 | fp16 (master weights stay fp32)"),
      MT_KEY_IN(precision.grad_reduce, grad_reduce_dtype_names(),
                "dtype of the data-parallel gradient reduction: fp32 | bf16"),
      MT_KEY(precision.loss_scale, "fp16 loss scale: dynamic | a positive number"),
      MT_KEY(data.source, "synthetic | tokens (uint16 .bin or llm.c shard) | text (UTF-8 bytes)"),
      MT_KEY(data.path, "training data file (required for tokens and text)"),
      MT_KEY(data.val_path, "validation data file; \"\" = hold out the tail (val_fraction)"),
      MT_KEY(data.order, "window order: sequential | shuffle (seeded, independent of the mesh)"),
      MT_KEY(data.synthetic_tokens, "length of the generated synthetic token stream"),
      MT_KEY(data.val_fraction, "fraction of the stream held out for validation when val_path is \"\""),
      MT_KEY(comm.backend, "communication backend: auto (shared memory for the ranks of one machine, mpi across "
                            "machines, nccl for GPUs with one each) | shm | mpi | nccl"),
      MT_KEY(comm.bucket_mb, "size of a data-parallel gradient bucket in MiB"),
      MT_KEY(comm.overlap, "overlap gradient reduction with the backward pass"),
      MT_KEY(comm.compress, "data-parallel gradient compression: none | bf16 | int8 | topk | powersgd (int8, topk "
                            "and powersgd keep error feedback)"),
      MT_KEY(comm.topk_fraction, "comm.compress=topk: fraction of each bucket's gradient elements sent"),
      MT_KEY(comm.powersgd_rank, "comm.compress=powersgd: rank of each gradient matrix's approximation"),
      MT_KEY(comm.hierarchical, "data-parallel all-reduce in three phases: reduce-scatter inside each node, "
                                "all-reduce across nodes, all-gather inside"),
      MT_KEY(comm.wait, "how the MPI transport's threads wait for peers: auto (block when the node has a core "
                        "per compute thread, else poll) | poll | block; the shared-memory transport always sleeps"),
      MT_KEY(comm.thread_priority, "real-time priority (SCHED_FIFO 1) for the communication threads that never spin "
                                   "(shared memory, network emulation, hierarchical worker): auto (when the OS "
                                   "permits it) | realtime "
                                   "(refuse to start without it) | normal"),
      MT_KEY(comm.timeout_s, "watchdog: abort a communication wait that lasts longer than this (seconds)"),
      MT_KEY(comm.adapt, "adapt the bucket size (and the compression, see adapt_compress) to the measured link, "
                         "compute and exposed communication while training; under local SGD, the period"),
      MT_KEY(comm.adapt_bucket_mb_min, "comm.adapt: smallest bucket size it may choose (MiB)"),
      MT_KEY(comm.adapt_bucket_mb_max, "comm.adapt: largest bucket size it may choose (MiB)"),
      MT_KEY(comm.adapt_compress, "comm.adapt: the compressions it may choose, comma-separated (e.g. \"none, bf16, "
                                  "powersgd\"); \"\" = keep comm.compress"),
      MT_KEY(comm.adapt_every, "comm.adapt: steps per decision (their figures are averaged)"),
      MT_KEY(comm.adapt_sync_every_min, "comm.adapt under local SGD: shortest period it may choose (steps)"),
      MT_KEY(comm.adapt_sync_every_max, "comm.adapt under local SGD: longest period it may choose (steps)"),
      MT_KEY(comm.emulate.latency_us, "emulated per-message latency within a node (us); 0 = no emulation"),
      MT_KEY(comm.emulate.bandwidth_gbps, "emulated link bandwidth within a node (GB/s); 0 = unlimited"),
      MT_KEY(comm.emulate.ranks_per_node, "ranks per emulated node; 0 = all ranks on one node"),
      MT_KEY(comm.emulate.inter_latency_us, "emulated latency between nodes (us)"),
      MT_KEY(comm.emulate.inter_bandwidth_gbps, "emulated bandwidth between nodes (GB/s); 0 = unlimited"),
      MT_KEY(comm.emulate.schedule, "the link within a node changing during the run: \"STEP:LATENCY_US:BANDWIDTH_GBPS, "
                                    "...\" from each STEP on (needs latency_us or bandwidth_gbps set); \"\" = none"),
      MT_KEY(run.dir, "output directory; \"\" = runs/<config file stem>"),
      MT_KEY(run.log_every, "log a metrics line to the console every this many steps (metrics.jsonl gets every step)"),
      MT_KEY(run.checkpoint_every, "write a checkpoint every this many steps (and at the last); 0 = off"),
      MT_KEY(run.check_copies_every, "compare the weights' copies (dp replicas, tp ranks, the tied embedding) by hash "
                                     "every this many steps; a difference stops the run, exit 1; 0 = at the end only"),
      MT_KEY(run.keep_checkpoints, "keep the newest this many complete checkpoints"),
      MT_KEY(run.resume, "auto (latest checkpoint in dir, if any) | none | a checkpoint path"),
      MT_KEY(run.stop_signals, "signals that stop the run after the step in progress with a checkpoint, exit 0 "
                               "(comma-separated: TERM, INT, HUP, USR1, USR2; \"\" = none); the same signal again "
                               "stops at once"),
      MT_KEY(run.profile, "write a Chrome trace (trace.json) of every rank"),
      MT_KEY(run.flight_recorder, "record each communicator's last operations; dump them to run.dir/flight/rank_N.json "
                                  "on a watchdog timeout, a fatal error or SIGUSR2 (scripts/flight.py reads them)"),
      MT_KEY(run.flight_recorder_ops, "operations the flight recorder keeps per communicator"),
      MT_KEY(run.dump_grads, "\"\" or a safetensors path: write the first step's gradients there (parity tests)"),
      MT_KEY(device, "cpu | cuda"),
  };
  return table;
}
#undef MT_KEY
#undef MT_KEY_IN

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

// Names other trainers (Megatron, nanoGPT, Hugging Face, DeepSpeed) give a key: a near miss by meaning, which
// spelling distance misses (learning_rate is nearer to min_lr than to lr). Matched on the unknown key's last part.
const std::map<std::string, std::string>& key_synonyms() {
  static const std::map<std::string, std::string> synonyms = {
      {"learning_rate", "optim.lr"},         {"max_lr", "optim.lr"},
      {"lr_max", "optim.lr"},                {"lr_min", "optim.min_lr"},
      {"min_learning_rate", "optim.min_lr"}, {"warmup", "optim.warmup_steps"},
      {"warmup_iters", "optim.warmup_steps"}, {"lr_warmup_steps", "optim.warmup_steps"},
      {"lr_schedule", "optim.schedule"},     {"lr_scheduler", "optim.schedule"},
      {"zero_stage", "optim.zero"},          {"optimizer", "optim.name"},
      {"batch_size", "train.global_batch"},  {"global_batch_size", "train.global_batch"},
      {"train_batch_size", "train.global_batch"}, {"micro_batch_size", "train.micro_batch"},
      {"max_steps", "train.steps"},          {"max_iters", "train.steps"},
      {"train_iters", "train.steps"},        {"total_steps", "train.steps"},
      {"num_steps", "train.steps"},          {"iterations", "train.steps"},
      {"grad_clip_norm", "train.grad_clip"}, {"max_grad_norm", "train.grad_clip"},
      {"clip_grad", "train.grad_clip"},      {"gradient_clipping", "train.grad_clip"},
      {"num_layers", "model.n_layer"},       {"n_layers", "model.n_layer"},
      {"num_hidden_layers", "model.n_layer"}, {"hidden_size", "model.d_model"},
      {"n_embd", "model.d_model"},           {"dim", "model.d_model"},
      {"num_heads", "model.n_head"},         {"n_heads", "model.n_head"},
      {"num_attention_heads", "model.n_head"}, {"num_key_value_heads", "model.n_kv_head"},
      {"n_kv_heads", "model.n_kv_head"},     {"intermediate_size", "model.ffn_hidden"},
      {"block_size", "model.seq_len"},       {"seq_length", "model.seq_len"},
      {"max_seq_len", "model.seq_len"},      {"context_length", "model.seq_len"},
      {"max_position_embeddings", "model.seq_len"}, {"tensor_model_parallel_size", "parallel.tp"},
      {"pipeline_model_parallel_size", "parallel.pp"}, {"context_parallel_size", "parallel.cp"},
      {"data_parallel_size", "parallel.dp"}, {"dtype", "precision.compute"},
      {"mixed_precision", "precision.compute"},
  };
  return synonyms;
}

std::string nearest_key(const std::string& name) {
  std::string leaf = name.substr(name.rfind('.') + 1);  // the whole name when it has no dot
  std::transform(leaf.begin(), leaf.end(), leaf.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  const auto synonym = key_synonyms().find(leaf);
  if (synonym != key_synonyms().end()) return synonym->second;
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
    case 5: return "a string";
    case 6: return "a list of integers (e.g. [2, 2])";
    default: return "a string";  // an enum key: the name of one of its values
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

// An int key's text under the rules above, within the 32-bit range.
bool parse_int(const std::string& v, int& out, bool& out_of_range) {
  bool neg = false;
  unsigned long long mag = 0;
  if (!parse_integer(v, 1ULL << 31, INT_MAX, out_of_range, mag, neg)) return false;
  out = static_cast<int>(neg ? -static_cast<long long>(mag) : static_cast<long long>(mag));
  return true;
}

// A list-of-integers key: a YAML sequence (flow [2, 2] or a block list) whose entries follow the int rules; null
// or [] is the empty list. Any other shape is an error naming the key and the offending value.
void set_int_list(std::vector<int>& out, const KeyDesc& key, const YAML::Node& node, const std::string& where) {
  const char* expected = "a list of integers (e.g. [2, 2])";
  if (node.IsNull()) { out.clear(); return; }
  if (!node.IsSequence()) input_error("{}: expected {}, got {} ({})", key.name, expected, describe(node), where);
  std::vector<int> values;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& e = node[i];
    int x = 0;
    bool oor = false;
    if (!e.IsScalar() || !parse_int(e.Scalar(), x, oor))
      input_error("{}: expected {}, got {} as entry {}{} ({})", key.name, expected, describe(e), i + 1,
                  oor ? " (out of the 32-bit integer range)" : "", where);
    values.push_back(x);
  }
  out = values;  // only a fully valid list replaces the old value
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF). yaml-cpp reads
// other bytes as they are, but its emitter writes them as U+FFFD, so to_yaml could not give such a value back.
bool well_formed_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1Fu;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0Fu;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07u;
    else return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char ck = static_cast<unsigned char>(s[i + k]);
      if ((ck & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (ck & 0x3Fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Sets the field of `key` from a YAML scalar node (a sequence for list keys); `where` says where the value came
// from (file:line or --set).
void set_field(Config& cfg, const KeyDesc& key, const YAML::Node& node, const std::string& where) {
  FieldPtr f = key.field(cfg);
  auto bad = [&](const char* extra = "") {
    input_error("{}: expected {}, got {}{} ({})", key.name, type_name(f), describe(node), extra, where);
  };
  if (auto* s = std::get_if<std::string*>(&f)) {
    if (node.IsNull()) { **s = ""; return; }
    if (!node.IsScalar()) bad();
    if (!well_formed_utf8(node.Scalar())) bad(" (not valid UTF-8)");
    **s = node.Scalar();
    return;
  }
  if (auto* e = std::get_if<EnumField>(&f)) {  // read as a string key, then it must be one of the names
    if (!node.IsNull() && !node.IsScalar()) bad();
    const std::string v = node.IsNull() ? "" : node.Scalar();
    if (!well_formed_utf8(v)) bad(" (not valid UTF-8)");
    if (e->set(v)) return;
    std::string list;
    for (const std::string& n : e->names) list += (list.empty() ? "" : ", ") + n;
    input_error("{}='{}' is not one of: {}", key.name, v, list);
  }
  if (auto* list = std::get_if<std::vector<int>*>(&f)) return set_int_list(**list, key, node, where);
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
    if (!parse_int(v, **i, oor)) bad(oor ? " (out of the 32-bit integer range)" : "");
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
  std::map<std::string, int> lines;  // each key's line: YAML parsers keep one of two equal keys without a word
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())
      input_error("{}: a key must be a plain name, got {}", location(file, kv.first), describe(kv.first));
    const std::string full = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    const auto [seen, fresh] = lines.emplace(kv.first.Scalar(), kv.first.Mark().line + 1);
    if (!fresh)
      input_error("config file '{}': {} is given twice, on lines {} and {}", file, full, seen->second,
                  kv.first.Mark().line + 1);
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

template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;

// The text of a value as to_yaml and --help write it (doubles in shortest round-trip form).
std::string format_value(const FieldPtr& f) {
  return std::visit(
      Overloaded{[](const EnumField& e) { return e.get(); }, [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return *p;
        else if constexpr (std::is_same_v<T, std::vector<int>>) {
          std::string s = "[";  // YAML flow form, so --set accepts what to_yaml and --help show
          for (size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + std::to_string((*p)[i]);
          return s + "]";
        }
        else if constexpr (std::is_same_v<T, double>) {
          std::string s = fmt::format("{}", *p);  // shortest text that reads back to the same double
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 1.0, not 1: a float to any YAML reader
          return s;
        } else return fmt::format("{}", *p);
      }},
      f);
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
  require_regular_file(path, "config file");
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

const std::map<std::string, std::string>& config_key_synonyms() { return key_synonyms(); }

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

LRSchedule lr_schedule(const Config& cfg) {
  return LRSchedule{cfg.optim.schedule, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};
}

std::vector<std::string> config_choices(const std::string& key) {
  const KeyDesc* k = find_key(key);
  if (!k) unknown_key(key, "config_choices()");
  Config scratch;
  const FieldPtr f = k->field(scratch);
  const auto* e = std::get_if<EnumField>(&f);
  return e ? e->names : std::vector<std::string>{};
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
    if (auto* s = std::get_if<std::string*>(&f)) {
      out << YAML::DoubleQuoted << **s;
    } else if (auto* e = std::get_if<EnumField>(&f)) {
      out << YAML::DoubleQuoted << e->get();  // quoted like the string it was, so config.yaml stays the same
    } else if (auto* list = std::get_if<std::vector<int>*>(&f)) {
      out << YAML::Flow << YAML::BeginSeq;  // "[2, 2]": a plain string would be quoted and read back as text
      for (int x : **list) out << x;
      out << YAML::EndSeq;
    } else {
      out << format_value(f);
    }
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
    if (std::holds_alternative<std::string*>(f) || std::holds_alternative<EnumField>(f)) def = "\"" + def + "\"";
    out += fmt::format("  {:<34} {:<12} {}\n", name, def, k.meaning);
  }
  return out;
}

}  // namespace mt
