// Building the data-parallel gradient reducers of a rank's model chunks (grad_reducers.h).
#include "train/grad_reducers.h"

#include <spdlog/spdlog.h>

namespace mt {

ChunkReducers make_grad_reducers(const Config& cfg, const PipelineChunks& model, Communicator& dp, int dp_size,
                                 bool log, Communicator* host_dp) {
  ChunkReducers out;
  out.owned.resize(model.size());
  out.hooks.resize(model.size());
  const bool zero = cfg.optim.zero == 1;
  // Local SGD averages parameters instead, and optim.staleness averages whole steps' gradients in the background.
  if ((dp_size == 1 && !zero) || cfg.optim.sync_every > 0 || cfg.optim.staleness > 0) return out;
  CompressOptions compress;  // comm.compress: how the buckets travel (docs/compression.md)
  compress.method = cfg.comm.compress;
  compress.topk_fraction = cfg.comm.topk_fraction;
  compress.powersgd_rank = cfg.comm.powersgd_rank;
  compress.seed = cfg.train.seed;  // PowerSGD's first Q, the same on every rank
  const DType wire = cfg.precision.grad_reduce;
  // Per chunk, buckets over its part of the flat gradient buffer. The tied wte copy is held back from the
  // backward pass's launches until it has been summed between the first and last stage.
  for (int c = 0; c < model.size(); ++c) {
    const GPT& chunk = model.chunk(c);
    out.owned[c] = std::make_unique<GradReducer>(
        dp, chunk.grads(),
        make_buckets(chunk.table(), chunk.table().total_numel(), dtype_size(chunk.grad_dtype()),
                     cfg.comm.bucket_mb * 1048576.0),
        zero, wire, chunk.table(), compress, host_dp);
    out.hooks[c].reducer = out.owned[c].get();
    if (c == model.tied_chunk()) out.hooks[c].ready_limit = chunk.table()[model.tied_param()].offset;
  }
  if (log) {
    int64_t bytes = 0, state = 0;
    for (const auto& r : out.owned) bytes += r->wire_bytes_per_step(), state += r->compress_state_bytes();
    const CompressMethod m = cfg.comm.compress;
    const bool gathered = m == CompressMethod::Int8 || m == CompressMethod::TopK;
    spdlog::info("data parallel: {} gradient buckets of up to {} MiB, {}, overlap {}, compression {}: {:.3f} MiB "
                 "per step from this rank{}",
                 out.owned[0]->buckets().size(), cfg.comm.bucket_mb,
                 zero       ? "reduce-scatter + all-gather (ZeRO-1)"
                 : gathered ? "all-gather of compressed buckets"
                            : "all-reduce",
                 cfg.comm.overlap ? "on" : "off", name_of(m), bytes / 1048576.0,
                 state ? fmt::format(", error-feedback state {:.2f} MiB", state / 1048576.0) : "");
  }
  return out;
}

}  // namespace mt
