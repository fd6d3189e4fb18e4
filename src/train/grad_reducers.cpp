// Building the data-parallel gradient reducers of a rank's model chunks (grad_reducers.h).
#include "train/grad_reducers.h"

#include <spdlog/spdlog.h>

namespace mt {

bool sharded_gradients(const Config& cfg) {
  return cfg.optim.zero == 3 || (cfg.optim.zero == 2 && cfg.optim.zero_reduce == ZeroReduce::MicroBatch);
}

namespace {
// Whether the chunk's embedding unit holds the tied head (the unit ZeRO-2 and -3 pin).
bool holds_tied_embedding(const GPTConfig& g, const ParamTable& table) {
  return g.tied() && table.index_of(g.llama() ? "model.embed_tokens.weight" : "wte.weight") >= 0;
}
}  // namespace

CompressOptions compress_options(const Config& cfg) {
  CompressOptions o;
  o.method = cfg.comm.compress;
  o.topk_fraction = cfg.comm.topk_fraction;
  o.powersgd_rank = cfg.comm.powersgd_rank;
  o.seed = cfg.train.seed;  // PowerSGD's first Q, the same on every rank
  o.tp_copies_apart = cfg.parallel.tp > 1;
  return o;
}

int tied_copy_param(const Config& cfg, const GPTConfig& g, const ParamTable& table) {
  if (cfg.parallel.pp * cfg.parallel.virtual_stages == 1 || !holds_tied_embedding(g, table)) return -1;
  return table.index_of(g.llama() ? "model.embed_tokens.weight" : "wte.weight");
}

// The tied copy's two stages see the same summed gradient, but the compressors encode whole buckets (int8's blocks,
// topk's k largest), and the other parameters in a bucket differ between the stages.
std::vector<Bucket> chunk_buckets(const Config& cfg, const ParamTable& table, size_t elem_bytes, int tied) {
  std::vector<Bucket> b = make_buckets(table, table.total_numel(), elem_bytes, cfg.comm.bucket_mb * 1048576.0);
  if (tied < 0 || !compress_with_feedback(cfg.comm.compress)) return b;
  const int64_t end = tied + 1 < table.size() ? table[tied + 1].offset : table.total_numel();
  return cut_buckets(b, {table[tied].offset, end});
}

std::vector<GradUnit> chunk_grad_units(const Config& cfg, const GPTConfig& g, const ParamTable& table) {
  return grad_units(table, holds_tied_embedding(g, table), cfg.parallel.schedule == PipelineSchedule::ZB1,
                    cfg.optim.zero_unit == ZeroUnit::Sublayer);
}

bool reshards_after_forward(const Config& cfg) {
  const Reshard r = cfg.parallel.reshard_after_forward;
  return r == Reshard::Yes || (r == Reshard::Auto && cfg.parallel.pp == 1);
}

std::vector<GradUnit> chunk_param_units(const Config& cfg, const GPTConfig& g, const ParamTable& table) {
  return grad_units(table, holds_tied_embedding(g, table), !reshards_after_forward(cfg),
                    cfg.optim.zero_unit == ZeroUnit::Sublayer);
}

ShardedGradsOptions sharded_grads_options(const Config& cfg, int dp, DType compute, DType grads) {
  ShardedGradsOptions o;
  o.shared_ring = cfg.optim.zero == 3 && reshards_after_forward(cfg) &&
                  cfg.parallel.schedule != PipelineSchedule::ZB1 && compute == grads;
  o.reduces_once = cfg.train.global_batch == dp * cfg.train.micro_batch;
  return o;
}

namespace {

// ZeRO-2 and -3: per chunk, its gradient units and buckets within them (sharded_grads.h).
ChunkReducers make_sharded(const Config& cfg, const PipelineChunks& model, Communicator& dp, bool log) {
  ChunkReducers out;
  out.owned.resize(model.size());
  out.sharded.resize(model.size());
  out.gathers.resize(model.size());
  out.hooks.resize(model.size());
  const bool split = cfg.parallel.schedule == PipelineSchedule::ZB1;
  const DType wire = cfg.comm.compress == CompressMethod::BF16 ? DType::BF16 : cfg.precision.grad_reduce;
  int64_t pass_bytes = 0, held = 0;
  size_t buckets = 0;
  std::vector<std::vector<GradUnit>> units(model.size());
  std::vector<std::vector<Bucket>> cut(model.size());
  std::vector<int64_t> at(model.size()), count(model.size());  // chunk c's shards in the packed buffer
  int64_t shards = 0;
  for (int c = model.size() - 1; c >= 0; --c) {
    const GPT& chunk = model.chunk(c);
    units[c] = chunk_grad_units(cfg, chunk.config(), chunk.table());
    cut[c] = unit_buckets(chunk.table(), units[c], dtype_size(chunk.grad_dtype()), cfg.comm.bucket_mb * 1048576.0);
    at[c] = shards;
    count[c] = sharded_grads_size(units[c], cut[c], dp.size(), dp.rank()).shard;
    shards += count[c];
  }
  const DType acc = model.chunk(0).grad_dtype();
  const ShardedGradsOptions opts = sharded_grads_options(cfg, dp.size() / cfg.parallel.cp, model.dtype(), acc);
  out.shard_grads = Tensor::zeros({std::max<int64_t>(1, shards)}, acc, model.device());
  for (int c = 0; c < model.size(); ++c) {
    const GPT& chunk = model.chunk(c);
    buckets += cut[c].size();
    for (const GradUnit& u : units[c]) held += u.pinned ? (u.end - u.begin) * int64_t(dtype_size(acc)) : 0;
    out.sharded[c] = std::make_unique<ShardedGrads>(dp, chunk.table(), std::move(units[c]), std::move(cut[c]), acc,
                                                    wire, chunk.device(),
                                                    out.shard_grads.slice(at[c], {count[c]}), opts);
    pass_bytes += chunk.table().total_numel() * int64_t(dtype_size(out.sharded[c]->wire_dtype()));
    out.hooks[c].reducer = out.sharded[c].get();
    if (c == model.tied_chunk()) out.hooks[c].ready_limit = chunk.table()[model.tied_param()].offset;
    // ZeRO-3 gathers its parameters unit by unit (ShardedParams); this gather serves only the export there.
    out.gathers[c] = std::make_unique<ParamGather>(dp, out.sharded[c]->buckets());
    if (cfg.optim.zero == 2) out.hooks[c].gather = out.gathers[c].get();
  }
  if (log) {
    int64_t bytes = int64_t(out.shard_grads.nbytes());
    for (const auto& s : out.sharded) bytes += s->bytes();
    const bool thirds = cfg.optim.zero_unit == ZeroUnit::Sublayer;
    spdlog::info("data parallel: ZeRO-{}, {} gradient buckets of up to {} MiB within {}, reduce-scatter after "
                 "every micro-batch ({:.3f} MiB from this rank per micro-batch), overlap {}; gradient buffers {:.2f} "
                 "MiB ({}' in turn{}{}, and this rank's shards)",
                 cfg.optim.zero, buckets, cfg.comm.bucket_mb,
                 thirds ? "thirds of blocks (optim.zero_unit=sublayer)" : "blocks", pass_bytes / 1048576.0,
                 cfg.comm.overlap ? "on" : "off", bytes / 1048576.0, thirds ? "two units" : "two blocks",
                 opts.shared_ring ? ", written over the gathered parameters" : "",
                 held ? fmt::format(", {:.2f} MiB kept for the step ({})", held / 1048576.0,
                                    split ? "zb1: every unit" : "the tied embedding")
                      : "");
  }
  return out;
}

}  // namespace

ChunkReducers make_grad_reducers(const Config& cfg, const PipelineChunks& model, Communicator& dp, int dp_size,
                                 bool log, Communicator* host_dp) {
  ChunkReducers out;
  out.owned.resize(model.size());
  out.sharded.resize(model.size());
  out.gathers.resize(model.size());
  out.hooks.resize(model.size());
  const bool zero = cfg.optim.zero >= 1;
  // Local SGD averages parameters instead, and optim.staleness averages whole steps' gradients in the background.
  if ((dp_size == 1 && !zero) || cfg.optim.sync_every > 0 || cfg.optim.staleness > 0) return out;
  if (sharded_gradients(cfg)) return make_sharded(cfg, model, dp, log);
  const CompressOptions compress = compress_options(cfg);  // comm.compress: how the buckets travel
  const DType wire = cfg.precision.grad_reduce;
  // Per chunk, buckets over its part of the flat gradient buffer. The tied wte copy is held back from the
  // backward pass's launches until it has been summed between the first and last stage.
  for (int c = 0; c < model.size(); ++c) {
    const GPT& chunk = model.chunk(c);
    const ParamTable& table = chunk.table();
    out.owned[c] = std::make_unique<GradReducer>(
        dp, chunk.grads(),
        chunk_buckets(cfg, table, dtype_size(chunk.grad_dtype()), c == model.tied_chunk() ? model.tied_param() : -1),
        zero, wire, table, compress, host_dp);
    out.hooks[c].reducer = out.owned[c].get();
    if (c == model.tied_chunk()) out.hooks[c].ready_limit = table[model.tied_param()].offset;
    if (zero) {
      out.gathers[c] = std::make_unique<ParamGather>(dp, out.owned[c]->buckets());
      out.hooks[c].gather = out.gathers[c].get();
    }
  }
  if (log) {
    int64_t bytes = 0, state = 0;
    for (const auto& r : out.owned) bytes += r->wire_bytes_per_step(), state += r->compress_state_bytes();
    const CompressMethod m = cfg.comm.compress;
    const bool gathered = m == CompressMethod::Int8 || m == CompressMethod::TopK;
    spdlog::info("data parallel: {} gradient buckets of up to {} MiB, {}, overlap {}, compression {}: {:.3f} MiB "
                 "per step from this rank{}",
                 out.owned[0]->buckets().size(), cfg.comm.bucket_mb,
                 zero       ? fmt::format("reduce-scatter + all-gather (ZeRO-{}{})", cfg.optim.zero,
                                          cfg.optim.zero == 2 ? ", optim.zero_reduce=step: once per step" : "")
                 : gathered ? std::string("all-gather of compressed buckets")
                            : std::string("all-reduce"),
                 cfg.comm.overlap ? "on" : "off", name_of(m), bytes / 1048576.0,
                 state ? fmt::format(", error-feedback state {:.2f} MiB", state / 1048576.0) : "");
  }
  return out;
}

void finish_reductions(ChunkReducers& r) {
  for (int c = static_cast<int>(r.owned.size()) - 1; c >= 0; --c) {
    if (r.owned[c]) r.owned[c]->finish();
    if (r.sharded[c]) r.sharded[c]->finish();
  }
}

void reset_feedback(ChunkReducers& r) {
  for (auto& red : r.owned)
    if (red) red->reset_feedback();
}

void all_gather_params(ChunkReducers& r, const PipelineChunks& model, const Tensor& flat) {
  for (int c = 0; c < model.size(); ++c) {
    r.gathers[c]->launch(model.chunk_view(flat, c));
    r.gathers[c]->wait_all();
  }
}

void launch_param_gathers(ChunkReducers& r, const PipelineChunks& model) {
  for (int c = 0; c < model.size(); ++c)
    if (r.gathers[c]) r.gathers[c]->launch(model.chunk(c).params());
}

void wait_param_gathers(ChunkReducers& r) {
  for (auto& g : r.gathers)
    if (g) g->wait_all();
}

int64_t gradient_bytes(const ChunkReducers& r, const PipelineChunks& model) {
  if (model.grads().defined()) return int64_t(model.grads().nbytes());
  int64_t bytes = int64_t(r.shard_grads.nbytes());
  for (const auto& s : r.sharded) bytes += s ? s->bytes() : 0;
  return bytes;
}

}  // namespace mt
