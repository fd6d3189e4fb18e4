// Generating from a trained model (see sampler.h).
#include "train/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "comm/agree_on_setup.h"
#include "comm/make_communicator.h"
#include "core/arena.h"
#include "core/errors.h"
#include "model/gpt.h"
#include "model/pipeline_chunks.h"
#include "train/model_config.h"

namespace mt {

namespace {
// The run's config on a mesh of tp x pp ranks and nothing else: what the trainer would check of it, so a model
// that does not split (heads, layers) is refused with its message.
Config on_mesh(Config c, int tp, int pp) {
  ParallelConfig& p = c.parallel;
  p.dp = 1, p.tp = tp, p.pp = pp, p.cp = 1, p.virtual_stages = 1, p.sequence_parallel = false;
  p.schedule = PipelineSchedule::OneFOneB;
  p.stage_layers.clear();
  c.optim.zero = 0, c.optim.sync_every = 0, c.optim.staleness = 0;
  c.comm.compress = CompressMethod::None;
  c.train.micro_batch = 1, c.train.global_batch = pp;
  validate(c, tp * pp);
  return c;
}
}  // namespace

Sampler::Sampler(const Config& cfg, const std::string& weights, int tp, int pp) : cfg_(cfg) {
  const GPTConfig g = gpt_config(cfg.model);
  ModelPart part;
  if (tp * pp > 1) {
    cfg_ = on_mesh(cfg, tp, pp);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != tp * pp)
      input_error("--tp {} x --pp {} needs {} ranks (mpirun -np {}), not {}", tp, pp, tp * pp, tp * pp, world);
    mesh_ = std::make_unique<DeviceMesh>(1, tp, pp, "tp-dp-pp", world, rank);
    CommOptions o;
    o.timeout_s = 600;
    comms_ = make_mesh_comms(*mesh_, MPI_COMM_WORLD,
                             [&](MPI_Comm c, const std::string& name) { return make_communicator(c, name, o); });
    part.sharding = {tp, mesh_->tp_rank(), false};
    part.blocks = stage_blocks(layers_per_stage(cfg_), mesh_->pp_rank());
  }
  model_ = std::make_unique<GPT>(g, part, DType::F32);
  if (comms_.tp) model_->set_tp_comm(comms_.tp.get());
  // The weights file may be unreadable on some hosts only: every rank learns whether any failed to load it.
  agreed_setup([&] { model_->load_safetensors(weights); }, mesh_ ? MPI_COMM_WORLD : MPI_COMM_NULL);
}

Sampler::~Sampler() = default;

int32_t Sampler::next(const std::vector<int32_t>& context, const SampleOptions& opts, std::mt19937_64& rng) {
  const int T = int(std::min<size_t>(context.size(), size_t(cfg_.model.seq_len)));
  Arena arena;
  Activations a = model_->alloc_activations(arena, 1, T);
  std::copy(context.end() - T, context.end(), a.tokens.data_as<int32_t>());
  std::fill_n(a.targets.data_as<int32_t>(), T, 0);  // dloss = 0: the loss is computed and the logits kept
  const int pp = mesh_ ? mesh_->pp() : 1, stage = mesh_ ? mesh_->pp_rank() : 0;
  if (stage > 0) comms_.pp->recv(a.input(), stage - 1, 0);
  model_->forward(a, 0.0, Tensor());
  if (stage + 1 < pp) comms_.pp->send(a.output(), stage + 1, 0);
  // The last stage draws; with pp > 1 every rank then learns the token (ids are exact in fp32: < 2^24).
  Tensor token = Tensor::zeros({1}, DType::F32);
  token.data_as<float>()[0] = stage + 1 < pp ? -1.0f : float(draw(last_row(a), opts, rng));
  if (pp > 1) comms_.world->all_reduce(token, ReduceOp::Max);
  return int32_t(token.data_as<float>()[0]);
}

Tensor Sampler::last_row(const Activations& a) const {
  const int64_t shard = a.logits.dim(1);  // Vp / tp columns of this rank's vocabulary shard
  const Tensor mine = a.logits.slice((a.logits.dim(0) - 1) * shard, {shard});
  if (!comms_.tp || comms_.tp->size() == 1) return mine;
  Tensor row = Tensor::zeros({shard * comms_.tp->size()}, DType::F32);  // the shards in tp rank order
  comms_.tp->all_gather(mine, row);
  return row;
}

int32_t Sampler::draw(const Tensor& logits, const SampleOptions& opts, std::mt19937_64& rng) const {
  const int V = int(opts.vocab_limit > 0 ? std::min<int64_t>(opts.vocab_limit, cfg_.model.vocab_size)
                                         : cfg_.model.vocab_size);
  const float* row = logits.data_as<float>();  // the padded row's first V
  if (opts.temperature <= 0) return int32_t(std::max_element(row, row + V) - row);
  // The k most likely ids (all with top_k 0), then a draw from their softmax at the temperature.
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  const int k = opts.top_k > 0 ? std::min(opts.top_k, V) : V;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t x, int32_t y) { return row[x] > row[y] || (row[x] == row[y] && x < y); });
  std::vector<double> w(k);
  for (int i = 0; i < k; ++i) w[i] = std::exp((double(row[ids[i]]) - row[ids[0]]) / opts.temperature);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  return ids[pick(rng)];
}

std::vector<int32_t> Sampler::generate(const std::vector<int32_t>& prompt, const SampleOptions& opts) {
  if (prompt.empty()) input_error("the prompt is empty: give at least one token");
  for (int32_t t : prompt)
    if (t < 0 || t >= cfg_.model.vocab_size)
      input_error("prompt token {} is outside the vocabulary [0, {})", t, cfg_.model.vocab_size);
  std::mt19937_64 rng(opts.seed);
  std::vector<int32_t> out = prompt;
  for (int i = 0; i < opts.tokens; ++i) out.push_back(next(out, opts, rng));
  return out;
}

std::string decode_bytes(const std::vector<int32_t>& ids) {
  std::string bytes;
  for (int32_t t : ids) bytes.push_back(char(t & 0xff));
  return valid_utf8(bytes);
}

std::string valid_utf8(const std::string& bytes) {
  std::string out;
  const std::string replacement = "\xEF\xBF\xBD";
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char c = bytes[i];
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= bytes.size();
    for (int j = 1; ok && j < n; ++j) ok = (static_cast<unsigned char>(bytes[i + j]) >> 6) == 0x2;
    // Overlong forms and surrogates are not UTF-8 either.
    if (ok && n == 2) ok = c >= 0xC2;
    if (ok && n == 3) {
      const unsigned char d = bytes[i + 1];
      ok = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d >= 0xA0);
    }
    if (ok && n == 4) {
      const unsigned char d = bytes[i + 1];
      ok = c <= 0xF4 && !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d >= 0x90);
    }
    if (ok) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += replacement;
      ++i;
    }
  }
  return out;
}

}  // namespace mt
