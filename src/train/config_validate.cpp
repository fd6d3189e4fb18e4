// Config validation: single values and their combinations, each failure an InputError that names the keys and
// the numbers that disagree (exit status 2).
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "train/config.h"
#include "train/stop_signal.h"
#include "train/link_schedule.h"

namespace mt {
namespace {

template <typename... Args>
void require(bool ok, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok) throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

// The precision keys hold a DType, which a Config built in code may set to one the key does not take (fp64; fp16
// for grad_reduce). Parsing refuses such a name with the same message; the other enum keys take every value.
template <size_t N>
void require_dtype_in(const char* key, DType v, const EnumName<DType> (&names)[N]) {
  for (const EnumName<DType>& n : names)
    if (n.value == v) return;
  input_error("{}='{}' is not one of: {}", key, dtype_name(v), enum_choices(names));
}

// How the transformer blocks split over the virtual pipeline stages. Shared by validate_values and
// layers_per_stage, so a split that validates is the split the model is built with. Needs pp, virtual_stages and
// n_layer >= 1.
void check_stage_split(const Config& c) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const long long stages = static_cast<long long>(p.pp) * p.virtual_stages;
  // These two come before the divisibility check: "not divisible" would hide that no split can work at all.
  require(p.pp <= m.n_layer,
          "parallel.pp={} is larger than model.n_layer={}: every pipeline stage needs at least one transformer block",
          p.pp, m.n_layer);
  require(stages <= m.n_layer,
          "parallel.pp*virtual_stages={}*{}={} virtual stages are more than model.n_layer={}: every virtual stage "
          "needs at least one transformer block",
          p.pp, p.virtual_stages, stages, m.n_layer);
  if (p.stage_layers.empty()) {
    require(m.n_layer % stages == 0,
            "model.n_layer={} is not divisible by parallel.pp*virtual_stages={}*{}={} (set parallel.stage_layers "
            "for an uneven split)",
            m.n_layer, p.pp, p.virtual_stages, stages);
    return;
  }
  const std::string given = "parallel.stage_layers=" + config_value(c, "parallel.stage_layers");
  require(static_cast<long long>(p.stage_layers.size()) == stages,
          "{} needs one entry per virtual stage, parallel.pp*virtual_stages={}*{}={}, but has {}", given, p.pp,
          p.virtual_stages, stages, p.stage_layers.size());
  long long sum = 0;
  for (size_t s = 0; s < p.stage_layers.size(); ++s) {
    require(p.stage_layers[s] >= 1, "{}: entry {} is {}, but every virtual stage needs at least one transformer block",
            given, s + 1, p.stage_layers[s]);
    sum += p.stage_layers[s];
  }
  require(sum == m.n_layer, "{} sums to {} layers, but model.n_layer={}", given, sum, m.n_layer);
}

// optim.staleness > 0: whole replicas apply gradient averages at their own pace, so every rank of a replica must
// hold its whole state and step alone (docs/staleness.md says why each combination is refused).
// parallel.cp > 1: what cannot compose with it yet, or at all.
void check_context_parallel(const Config& c) {
  const int cp = c.parallel.cp;
  if (cp == 1) return;
  // The cp ranks of a replica each compute a share of one gradient: they must sum it every step.
  require(c.optim.sync_every == 0, "parallel.cp={} and optim.sync_every={} (local SGD): the cp ranks of a replica "
          "each hold a share of its gradient and must combine it every step", cp, c.optim.sync_every);
  require(c.optim.staleness == 0, "parallel.cp={} and optim.staleness={}: the cp ranks of a replica each hold a "
          "share of its gradient and must combine it every step", cp, c.optim.staleness);
}

void check_staleness(const Config& c) {
  const OptimConfig& o = c.optim;
  require(o.staleness >= 0, "optim.staleness must be >= 0 (0 = synchronous), got {}", o.staleness);
  if (o.staleness == 0) return;
  const std::string s = fmt::format("optim.staleness={} (stale-synchronous data parallelism)", o.staleness);
  require(c.parallel.tp == 1 && c.parallel.pp == 1,
          "{} works over data parallelism only: parallel.tp={} and parallel.pp={} need every rank of a replica to "
          "apply the same update in the same step; set both to 1", s, c.parallel.tp, c.parallel.pp);
  require(o.zero == 0, "{} needs optim.zero=0: under ZeRO-{} a replica updates only its shard and needs the "
          "others' shards back in the same step", s, o.zero);
  require(o.sync_every == 0, "{} and optim.sync_every={} (local SGD) are two different ways not to wait for the "
          "slowest replica; choose one", s, o.sync_every);
  require(c.comm.compress == CompressMethod::None && c.precision.grad_reduce == DType::F32,
          "{} averages fp32 gradients: set comm.compress=none and precision.grad_reduce=fp32 (got {} and {})", s,
          name_of(c.comm.compress), dtype_name(c.precision.grad_reduce));
  require(c.precision.compute != DType::F16, "{} with precision.compute=fp16: replicas at different steps could scale "
          "their losses differently within one average; use bf16 or fp32", s);
  require(c.device == Device::CPU, "{} runs on device=cpu only so far, got device={}", s, name_of(c.device));
}

// comm.adapt: the limits, and the settings it may move between, each valid for this run.
void check_adapt(const Config& c) {
  const CommConfig& cm = c.comm;
  require(cm.adapt_bucket_mb_min > 0, "comm.adapt_bucket_mb_min must be > 0, got {}", cm.adapt_bucket_mb_min);
  require(cm.adapt_bucket_mb_min <= cm.adapt_bucket_mb_max,
          "comm.adapt_bucket_mb_min={} is larger than comm.adapt_bucket_mb_max={}: the limits contradict each other",
          cm.adapt_bucket_mb_min, cm.adapt_bucket_mb_max);
  require(cm.adapt_every >= 1, "comm.adapt_every must be >= 1, got {}", cm.adapt_every);
  std::vector<CompressMethod> methods;
  std::string bad;
  require(parse_compress_list(cm.adapt_compress, methods, bad), "comm.adapt_compress: '{}' is not a compression "
          "(choices: {})", bad, enum_choices(enum_names(CompressMethod{})));
  require(methods.empty() || std::find(methods.begin(), methods.end(), cm.compress) != methods.end(),
          "comm.adapt_compress='{}' leaves out comm.compress={}, the setting the run starts from: the two contradict "
          "each other", cm.adapt_compress, name_of(cm.compress));
  require(cm.adapt_sync_every_min >= 1, "comm.adapt_sync_every_min must be >= 1, got {}", cm.adapt_sync_every_min);
  require(cm.adapt_sync_every_min <= cm.adapt_sync_every_max,
          "comm.adapt_sync_every_min={} is larger than comm.adapt_sync_every_max={}: the limits contradict each other",
          cm.adapt_sync_every_min, cm.adapt_sync_every_max);
  if (!cm.adapt) return;
  const int h = c.optim.sync_every;
  if (h > 0) {
    // Local SGD has no gradient buckets: the controller picks the period instead.
    require(cm.adapt_sync_every_min <= h && h <= cm.adapt_sync_every_max,
            "comm.adapt_sync_every_min={} and _max={} leave out optim.sync_every={}, the period the run starts "
            "from: the two contradict each other", cm.adapt_sync_every_min, cm.adapt_sync_every_max, h);
    return;
  }
  for (CompressMethod m : methods) {
    // The controller fits one link to the step's all-reduces; int8 and topk all-gather instead, which scales
    // differently with the ranks.
    require(m != CompressMethod::Int8 && m != CompressMethod::TopK, "comm.adapt_compress lists {}: comm.adapt "
            "chooses among none, bf16 and powersgd (all-reduces)", name_of(m));
    const bool plain = m == CompressMethod::None || m == CompressMethod::BF16;
    require(plain || c.precision.grad_reduce == DType::F32,
            "comm.adapt_compress lists {}, which needs precision.grad_reduce=fp32, got {}", name_of(m),
            dtype_name(c.precision.grad_reduce));
    require(plain || c.device == Device::CPU, "comm.adapt_compress lists {}, which is not available with "
            "device=cuda yet (docs/cuda.md)", name_of(m));
  }
  const char* why = "comm.adapt changes the data-parallel buckets of one synchronous gradient reduction";
  require(cm.overlap, "{}, overlapped with the backward pass: set comm.overlap=true", why);
  require(c.optim.zero == 0, "{}; under ZeRO-{} the buckets are the optimizer's shards: set optim.zero=0", why,
          c.optim.zero);
  require(c.parallel.pp == 1, "{} per model; with parallel.pp={} each stage has its own: set parallel.pp=1", why,
          c.parallel.pp);
  require(c.optim.staleness == 0, "{}: not with optim.staleness", why);
}

}  // namespace

std::vector<int> layers_per_stage(const Config& c) {
  const ParallelConfig& p = c.parallel;
  require(p.pp >= 1 && p.virtual_stages >= 1 && c.model.n_layer >= 1,
          "parallel.pp={}, parallel.virtual_stages={} and model.n_layer={} must be >= 1", p.pp, p.virtual_stages,
          c.model.n_layer);
  check_stage_split(c);
  if (!p.stage_layers.empty()) return p.stage_layers;
  const int stages = p.pp * p.virtual_stages;  // <= n_layer, checked above
  return std::vector<int>(stages, c.model.n_layer / stages);
}

int resolved_dp(const Config& cfg, int world) {
  const ParallelConfig& p = cfg.parallel;
  require(p.tp >= 1 && p.pp >= 1 && p.cp >= 1, "parallel.tp={}, parallel.pp={} and parallel.cp={} must be >= 1", p.tp,
          p.pp, p.cp);
  require(world >= 1, "the number of ranks must be >= 1, got {}", world);
  if (p.dp > 0) return p.dp;
  const long long others = static_cast<long long>(p.tp) * p.pp * p.cp;
  if (p.cp == 1)  // the message names cp only where it is used
    require(world % others == 0,
            "parallel.tp*pp={}*{}={} does not divide the {} ranks (parallel.dp=0 means dp = ranks / (tp*pp))", p.tp,
            p.pp, others, world);
  else
    require(world % others == 0,
            "parallel.tp*pp*cp={}*{}*{}={} does not divide the {} ranks (parallel.dp=0 means dp = ranks / (tp*pp*cp))",
            p.tp, p.pp, p.cp, others, world);
  return static_cast<int>(world / others);
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
  const bool llama = m.arch == ModelArch::Llama;
  if (!llama) {
    const ModelConfig d;
    require(m.n_kv_head == d.n_kv_head && m.ffn_hidden == d.ffn_hidden && m.multiple_of == d.multiple_of &&
                m.norm_eps == d.norm_eps && m.rope_theta == d.rope_theta && m.tie_embeddings == d.tie_embeddings,
            "model.n_kv_head, ffn_hidden, multiple_of, norm_eps, rope_theta and tie_embeddings apply to "
            "model.arch=llama; this model is gpt2");
  }
  require(m.n_kv_head >= 0, "model.n_kv_head must be >= 0 (0 = n_head), got {}", m.n_kv_head);
  const int kv = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  require(m.n_head % kv == 0, "model.n_kv_head={} does not divide model.n_head={}", m.n_kv_head, m.n_head);
  require(!llama || (m.d_model / m.n_head) % 2 == 0,
          "model.arch=llama: rotary embeddings need an even head size, got d_model/n_head={}/{}={}", m.d_model,
          m.n_head, m.d_model / m.n_head);
  require(m.ffn_hidden >= 0, "model.ffn_hidden must be >= 0 (0 = the multiple_of rule), got {}", m.ffn_hidden);
  require(m.multiple_of >= 1, "model.multiple_of must be >= 1, got {}", m.multiple_of);
  require(m.norm_eps > 0, "model.norm_eps must be > 0, got {}", m.norm_eps);
  require(m.rope_theta > 0, "model.rope_theta must be > 0, got {}", m.rope_theta);

  const ParallelConfig& p = c.parallel;
  require(p.dp >= 0, "parallel.dp must be >= 0 (0 = ranks / (tp*pp)), got {}", p.dp);
  require(p.tp >= 1, "parallel.tp must be >= 1, got {}", p.tp);
  require(p.pp >= 1, "parallel.pp must be >= 1, got {}", p.pp);
  require(p.cp >= 1, "parallel.cp must be >= 1, got {}", p.cp);
  require(p.virtual_stages >= 1, "parallel.virtual_stages must be >= 1, got {}", p.virtual_stages);
  {
    std::vector<std::string> axes;
    std::stringstream ss(p.order);
    for (std::string a; std::getline(ss, a, '-');) axes.push_back(a);
    std::vector<std::string> sorted = axes;
    std::sort(sorted.begin(), sorted.end());
    require((sorted == std::vector<std::string>{"dp", "pp", "tp"} ||
             sorted == std::vector<std::string>{"cp", "dp", "pp", "tp"}) && p.order.back() != '-',
            "parallel.order='{}' must be a permutation of tp, dp, pp, optionally with cp, joined by '-' (e.g. tp-dp-pp, "
            "tp-cp-dp-pp; without cp, cp comes right after tp)", p.order);
  }
  require(p.virtual_stages == 1 || p.schedule == PipelineSchedule::Interleaved,
          "parallel.virtual_stages={} needs parallel.schedule=interleaved, got '{}'", p.virtual_stages,
          name_of(p.schedule));
  require(p.schedule != PipelineSchedule::Interleaved || p.pp >= 2,
          "parallel.schedule=interleaved needs parallel.pp >= 2, got {}", p.pp);
  // Column-parallel c_fc / row-parallel c_proj split the MLP width over tp. (n_head % tp == 0 with
  // d_model % n_head == 0 implies it, so this one answers first when both fail, naming the MLP.)
  require(4LL * m.d_model % p.tp == 0, "the MLP width 4*model.d_model=4*{}={} is not divisible by parallel.tp={}",
          m.d_model, 4LL * m.d_model, p.tp);
  require(m.n_head % p.tp == 0, "model.n_head={} is not divisible by parallel.tp={}", m.n_head, p.tp);
  if (llama) {
    const int hidden = llama_mlp_hidden(m.d_model, m.ffn_hidden, m.multiple_of);
    require(hidden % p.tp == 0, "the SwiGLU hidden size {} (model.ffn_hidden, or the multiple_of rule) is not "
            "divisible by parallel.tp={}", hidden, p.tp);
    // Each tp rank holds whole kv heads: kv / tp of them, or with fewer kv heads than ranks one, shared by tp / kv
    // ranks.
    require(kv % p.tp == 0 || p.tp % kv == 0, "model.n_kv_head={} and parallel.tp={}: one must divide the other "
            "(each tensor-parallel rank holds whole key/value heads)", kv, p.tp);
  }
  // Context parallelism: rank r holds chunks r and 2cp-1-r of every sequence's 2 cp equal chunks.
  require(p.cp == 1 || m.seq_len % (2LL * p.cp) == 0,
          "parallel.cp={}: model.seq_len={} must be divisible by 2*cp={} (each sequence is cut into 2*cp equal "
          "chunks)", p.cp, m.seq_len, 2LL * p.cp);
  // Sequence parallelism splits the flattened batch x sequence rows into tp contiguous blocks of whole rows (a cp
  // rank's rows: seq_len / cp per sequence).
  if (p.cp == 1)
    require(!p.sequence_parallel || p.tp == 1 || m.seq_len % p.tp == 0,
            "parallel.sequence_parallel: model.seq_len={} is not divisible by parallel.tp={}", m.seq_len, p.tp);
  else
    require(!p.sequence_parallel || p.tp == 1 || (m.seq_len / p.cp) % p.tp == 0,
            "parallel.sequence_parallel: a cp rank's model.seq_len/parallel.cp={}/{}={} tokens are not divisible by "
            "parallel.tp={}", m.seq_len, p.cp, m.seq_len / p.cp, p.tp);
  check_context_parallel(c);
  check_stage_split(c);

  const TrainConfig& t = c.train;
  // The zero-bubble weight pass reads every block's inputs after the input pass of all of them: full
  // recomputation would have to run each block's forward a third time.
  require(t.recompute != Recompute::Full || p.schedule != PipelineSchedule::ZB1,
          "train.recompute=full with parallel.schedule=zb1: the split backward's weight pass needs every block's "
          "inputs after all input passes; use selective, or another schedule");
  require(t.global_batch > 0, "train.global_batch must be > 0, got {}", t.global_batch);
  require(t.micro_batch > 0, "train.micro_batch must be > 0, got {}", t.micro_batch);
  require(t.steps > 0, "train.steps must be > 0, got {}", t.steps);
  require(t.grad_clip >= 0, "train.grad_clip must be >= 0 (0 = off), got {}", t.grad_clip);
  require(t.eval_every >= 0, "train.eval_every must be >= 0 (0 = off), got {}", t.eval_every);
  require(t.eval_batches >= 1, "train.eval_batches must be >= 1, got {}", t.eval_batches);
  require(t.threads >= 0, "train.threads must be >= 0 (0 = automatic), got {}", t.threads);
  const StragglerSettings& st = t.straggler;
  require(st.slowdown >= 1, "train.straggler.slowdown must be >= 1 (1 = off), got {}", st.slowdown);
  require(st.delay_ms >= 0, "train.straggler.delay_ms must be >= 0 (0 = off), got {}", st.delay_ms);
  // A log-normal's tail grows as exp(sigma * z): beyond 3 a rare step would sleep for hours.
  require(st.delay_sigma >= 0 && st.delay_sigma <= 3, "train.straggler.delay_sigma must be in [0, 3], got {}",
          st.delay_sigma);
  for (size_t i = 0; i < st.ranks.size(); ++i) {
    require(st.ranks[i] >= 0, "train.straggler.ranks: rank {} is negative", st.ranks[i]);
    require(std::count(st.ranks.begin(), st.ranks.end(), st.ranks[i]) == 1,
            "train.straggler.ranks: rank {} is listed twice", st.ranks[i]);
  }

  const OptimConfig& o = c.optim;
  require(o.lr > 0, "optim.lr must be > 0, got {}", o.lr);
  require(o.min_lr >= 0, "optim.min_lr must be >= 0, got {}", o.min_lr);
  require(o.min_lr <= o.lr, "optim.min_lr={} is larger than optim.lr={}", o.min_lr, o.lr);
  require(o.warmup_steps >= 0, "optim.warmup_steps must be >= 0, got {}", o.warmup_steps);
  require(o.weight_decay >= 0, "optim.weight_decay must be >= 0, got {}", o.weight_decay);
  require(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 must be in [0, 1), got {}", o.beta1);
  require(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 must be in [0, 1), got {}", o.beta2);
  require(o.eps > 0, "optim.eps must be > 0, got {}", o.eps);
  require(o.zero >= 0 && o.zero <= 3, "optim.zero must be 0, 1, 2 or 3, got {}", o.zero);
  require(o.zero != 3 || o.zero_reduce == ZeroReduce::MicroBatch,
          "optim.zero_reduce=step needs optim.zero=2: under optim.zero=3 no rank holds a whole gradient buffer to "
          "accumulate into, so the gradients are reduce-scattered after every micro-batch");
  // ZeRO-3's sub-block units are gathered as the pass first reads each one, in order; a recomputed forward inside the
  // backward pass reads a block's three units again before its backward reads them in reverse.
  require(o.zero != 3 || o.zero_unit == ZeroUnit::Block ||
              (c.train.recompute != Recompute::Full && c.train.recompute != Recompute::Light),
          "optim.zero_unit=sublayer with train.recompute={} under optim.zero=3: the recomputation reads a block's "
          "attention and MLP weights again at the start of its backward pass, when two ring slots hold only two of "
          "its three units; use train.recompute=none or selective, or optim.zero_unit=block",
          name_of(c.train.recompute));
  require(o.zero != 3 || o.zero_unit == ZeroUnit::Block || c.parallel.schedule != PipelineSchedule::ZB1,
          "optim.zero_unit=sublayer with parallel.schedule=zb1 under optim.zero=3: the weight pass walks each block "
          "again after the input pass has left it, and would gather its units a second time; use "
          "optim.zero_unit=block, or another schedule");
  require(o.momentum >= 0 && o.momentum < 1, "optim.momentum must be in [0, 1), got {}", o.momentum);
  require(o.sync_every >= 0, "optim.sync_every must be >= 0 (0 = synchronous), got {}", o.sync_every);
  require(o.outer_lr > 0, "optim.outer_lr must be > 0, got {}", o.outer_lr);
  require(o.outer_momentum >= 0 && o.outer_momentum < 1, "optim.outer_momentum must be in [0, 1), got {}",
          o.outer_momentum);
  check_staleness(c);
  check_adapt(c);
  // Local SGD keeps a whole optimizer state per replica and averages parameters, not gradients.
  require(o.sync_every == 0 || o.zero == 0, "optim.sync_every={} (local SGD) needs optim.zero=0: each replica keeps "
          "its whole optimizer state", o.sync_every);
  require(o.sync_every == 0 || c.comm.compress == CompressMethod::None,
          "optim.sync_every={} (local SGD) averages parameters, not gradients: comm.compress={} does not apply; set "
          "comm.compress=none", o.sync_every, name_of(c.comm.compress));

  {
    kernels::cpu::MatmulBackends backends;
    std::string why;
    require(kernels::cpu::resolve_matmul_backends(c.train.cpu_matmul, backends, why), "train.cpu_matmul=onednn: {}",
            why);
  }

  const PrecisionConfig& pr = c.precision;
  require_dtype_in("precision.compute", pr.compute, compute_dtype_names());
  require_dtype_in("precision.grad_reduce", pr.grad_reduce, grad_reduce_dtype_names());
  if (pr.loss_scale != "dynamic") {
    char* end = nullptr;
    double s = std::strtod(pr.loss_scale.c_str(), &end);
    require(!pr.loss_scale.empty() && end == pr.loss_scale.c_str() + pr.loss_scale.size() && std::isfinite(s) && s > 0,
            "precision.loss_scale='{}' must be 'dynamic' or a positive number", pr.loss_scale);
  }

  const DataConfig& d = c.data;
  require(d.source == DataSource::Synthetic || !d.path.empty(),
          "data.source={} needs data.path (a file), but it is empty", name_of(d.source));
  require(d.val_fraction >= 0 && d.val_fraction < 1, "data.val_fraction must be in [0, 1), got {}", d.val_fraction);
  require(d.source != DataSource::Synthetic || d.synthetic_tokens > static_cast<int64_t>(m.seq_len) + 1,
          "data.synthetic_tokens={} must be larger than model.seq_len+1={}", d.synthetic_tokens,
          static_cast<int64_t>(m.seq_len) + 1);  // 64-bit: seq_len may be INT_MAX

  const CommConfig& cm = c.comm;
  require(cm.bucket_mb > 0, "comm.bucket_mb must be > 0, got {}", cm.bucket_mb);
  require(cm.timeout_s > 0, "comm.timeout_s must be > 0, got {}", cm.timeout_s);
  require(cm.topk_fraction > 0 && cm.topk_fraction <= 1, "comm.topk_fraction must be in (0, 1], got {}",
          cm.topk_fraction);
  require(cm.powersgd_rank >= 1, "comm.powersgd_rank must be >= 1, got {}", cm.powersgd_rank);
  const bool plain_reduce = cm.compress == CompressMethod::None || cm.compress == CompressMethod::BF16;
  require(plain_reduce || c.precision.grad_reduce == DType::F32,
          "comm.compress={} needs precision.grad_reduce=fp32 (it compresses the fp32 gradients itself), got {}",
          name_of(cm.compress), dtype_name(c.precision.grad_reduce));
  // ZeRO-1 reduce-scatters the buckets; only the bf16 wire has a reduce-scatter form.
  require(c.optim.zero == 0 || plain_reduce,
          "comm.compress={} needs optim.zero=0 (under ZeRO-{} only none and bf16 apply)", name_of(cm.compress),
          c.optim.zero);
  const EmulateConfig& e = cm.emulate;
  require(e.latency_us >= 0, "comm.emulate.latency_us must be >= 0, got {}", e.latency_us);
  require(e.bandwidth_gbps >= 0, "comm.emulate.bandwidth_gbps must be >= 0 (0 = unlimited), got {}", e.bandwidth_gbps);
  require(e.ranks_per_node >= 0, "comm.emulate.ranks_per_node must be >= 0, got {}", e.ranks_per_node);
  // The schedule changes the link of the emulation wrappers, which exist only when a link is emulated from the start.
  require(parse_link_schedule(e.schedule).empty() || e.latency_us > 0 || e.bandwidth_gbps > 0,
          "comm.emulate.schedule needs an emulated link from the first step: set comm.emulate.latency_us or "
          "comm.emulate.bandwidth_gbps");
  require(e.inter_latency_us >= 0, "comm.emulate.inter_latency_us must be >= 0, got {}", e.inter_latency_us);
  require(e.inter_bandwidth_gbps >= 0, "comm.emulate.inter_bandwidth_gbps must be >= 0 (0 = unlimited), got {}",
          e.inter_bandwidth_gbps);

  const RunConfig& r = c.run;
  require(r.log_every >= 1, "run.log_every must be >= 1, got {}", r.log_every);
  require(!r.resume.empty(), "run.resume must be auto, none or a checkpoint path, got an empty string");
  require(r.checkpoint_every >= 0, "run.checkpoint_every must be >= 0 (0 = off), got {}", r.checkpoint_every);
  require(r.check_copies_every >= 0, "run.check_copies_every must be >= 0 (0 = at the end only), got {}",
          r.check_copies_every);
  require(r.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1, got {}", r.keep_checkpoints);
  require(r.flight_recorder_ops >= 1, "run.flight_recorder_ops must be >= 1, got {}", r.flight_recorder_ops);
  std::vector<int> signals;
  std::string bad_signal;
  require(parse_stop_signals(r.stop_signals, signals, bad_signal), "run.stop_signals: '{}' is not one of TERM, INT, "
          "HUP, USR1, USR2 (comma-separated, \"\" for none)", bad_signal);

  require(cm.backend != CommBackend::Nccl || c.device == Device::CUDA,
          "comm.backend=nccl needs device=cuda, got device={}", name_of(c.device));
  require(cm.backend != CommBackend::Shm || c.device == Device::CPU, "comm.backend=shm moves host tensors only, got "
          "device={} (use auto, mpi or nccl)", name_of(c.device));
  // The three-phase all-reduce chains on the host transports' threads, not on NCCL's streams (docs/cuda.md).
  require(!cm.hierarchical || cm.backend != CommBackend::Nccl, "comm.hierarchical with comm.backend=nccl is not "
          "available yet (docs/cuda.md): set comm.backend=mpi");
}

void validate(const Config& c, int world_size) {
  validate_values(c);
  require(!c.comm.adapt || resolved_dp(c, world_size) > 1,
          "comm.adapt needs data parallelism: with dp=1 there is no gradient reduction to adapt");
  for (int r : c.train.straggler.ranks)
    require(r < world_size, "train.straggler.ranks: rank {} is outside the {} ranks of this run (0 .. {})", r,
            world_size, world_size - 1);
  const ParallelConfig& p = c.parallel;
  const int dp = resolved_dp(c, world_size);
  // Four factors below 2^31 each: their product may not fit 64 bits (dp = tp = pp = 2^30 passes validate_values).
  const __int128 mesh = static_cast<__int128>(dp) * p.tp * p.pp * p.cp;
  if (p.cp == 1)
    require(mesh == world_size, "parallel.dp*tp*pp={}*{}*{}={} does not equal the number of ranks ({})", dp, p.tp,
            p.pp, mesh, world_size);
  else
    require(mesh == world_size, "parallel.dp*tp*pp*cp={}*{}*{}*{}={} does not equal the number of ranks ({})", dp,
            p.tp, p.pp, p.cp, mesh, world_size);
  const long long per_step = static_cast<long long>(dp) * c.train.micro_batch;
  if (c.train.global_batch % per_step != 0) {
    // What would work: the micro-batch sizes that divide global_batch / dp, or the nearest global batches.
    std::string micro;
    if (c.train.global_batch % dp == 0)
      for (long long mb = 1; mb <= c.train.global_batch / dp; ++mb)
        if ((c.train.global_batch / dp) % mb == 0) micro += fmt::format("{}{}", micro.empty() ? "" : ", ", mb);
    const long long below = c.train.global_batch / per_step * per_step, above = below + per_step;
    input_error("train.global_batch={} is not divisible by dp*micro_batch={}*{}={} (micro-batches per step = "
                "global_batch / (dp*micro_batch) must be whole): use {}train.global_batch={}{}",
                c.train.global_batch, dp, c.train.micro_batch, per_step,
                micro.empty() ? "" : fmt::format("train.micro_batch={} (with global_batch {}), or ", micro,
                                                 c.train.global_batch),
                below > 0 ? fmt::format("{} or ", below) : "", above);
  }
  // Interleaved 1F1B sends the micro-batches through the pp ranks in groups of pp (parallel/schedule.h).
  const long long micro_batches = c.train.global_batch / per_step;
  require(p.schedule != PipelineSchedule::Interleaved || micro_batches % p.pp == 0,
          "parallel.schedule=interleaved needs the micro-batches per step, m = train.global_batch / "
          "(parallel.dp*train.micro_batch) = {} / ({}*{}) = {}, to be a multiple of parallel.pp={}",
          c.train.global_batch, dp, c.train.micro_batch, micro_batches, p.pp);
}

}  // namespace mt
