// The step time model (see step_model.h).
#include "plan/step_model.h"

#include <algorithm>
#include <climits>
#include <string>

#include "model/pipeline_chunks.h"
#include "parallel/grad_buckets.h"
#include "plan/schedule_usage.h"
#include "plan/timeline.h"
#include "parallel/sharded_grads.h"
#include "train/grad_reducers.h"
#include "plan/tp_traffic.h"
#include "train/model_config.h"

namespace mt::plan {

namespace {

// Where in a chunk's final gradient pass its gradients become final: (end of the flat range reported, fraction of
// the pass done), in the order GPT::backward / backward_weights call grads_ready. The split of the pass between
// the head, each half block and the embedding is by multiply-adds (the measured pass time is one number).
std::vector<std::pair<int64_t, double>> ready_points(const GPTConfig& g, const ParamTable& t, bool weight_pass) {
  const double C = g.d_model, tp = g.tp, T = g.seq_len, Vp = padded_vocab(g.vocab_size, g.tp);
  std::vector<std::pair<int64_t, double>> pts;
  auto end_of = [&](const std::string& name) {
    const int i = t.index_of(name);
    return i < 0 ? t.total_numel() : t[i].offset + t[i].numel();
  };
  // Multiply-adds per row of each half block: GPT-2's MLP 8 C^2, attention 4 C^2; Llama's SwiGLU 3 C H, attention
  // C (Q + 2 KV) + Q C (q, k, v and o), Q = NH HS and KV = n_kv_head HS.
  const double Q = double(g.n_head) * g.head_size(), KV = double(g.kv_heads()) * g.head_size();
  const double mlp = g.llama() ? 3 * C * g.mlp_hidden() : 8 * C * C;
  const double attn = g.llama() ? C * (2 * Q + 2 * KV) : 4 * C * C;
  double w = 0;
  if (g.last_stage()) {
    w += C * Vp / tp;
    pts.push_back({end_of(g.llama() ? "model.norm.weight" : "ln_f.bias"), w});
  }
  for (int l = g.stage_end() - 1; l >= g.layer_begin; --l) {
    w += mlp / tp;
    pts.push_back({end_of(g.llama() ? llama_layer_name(l, 5) : "h." + std::to_string(l) + ".ln_2.bias"), w});
    w += attn / tp + (weight_pass ? 0 : T * C / tp);
    pts.push_back({end_of(g.llama() ? llama_layer_name(l, 0) : "h." + std::to_string(l) + ".ln_1.bias"), w});
  }
  if (g.first_stage()) w += C;
  pts.push_back({t.total_numel(), w});
  for (auto& p : pts) p.second /= w;
  return pts;
}

}  // namespace

StepPrediction predict_step(const Config& cfg, int world, Calibration& cal, const StepOptions& o) {
  const int dp = resolved_dp(cfg, world), tp = cfg.parallel.tp, p = cfg.parallel.pp;
  const int v = cfg.parallel.virtual_stages, B = cfg.train.micro_batch, T = cfg.model.seq_len;
  const int m = cfg.train.global_batch / (dp * B), S = p * v;
  const std::vector<int> layers = layers_per_stage(cfg);
  GPTConfig base = gpt_config(cfg);
  base.tp = tp;
  base.sequence_parallel = cfg.parallel.sequence_parallel;
  const bool sp = tp > 1 && cfg.parallel.sequence_parallel;
  const DType dt = cfg.precision.compute;
  const bool split = cfg.parallel.schedule == PipelineSchedule::ZB1, zero = cfg.optim.zero >= 1;
  // Local SGD steps without gradient buckets (its parameter average every optim.sync_every steps is not in a
  // typical step's time).
  const bool reducers = (dp > 1 || zero) && cfg.optim.sync_every == 0;
  const NetModel net(cfg, o.net);
  const MeshLinks links = mesh_links(cfg, world);
  const size_t wire = cfg.precision.grad_reduce != DType::F32 || cfg.comm.compress == CompressMethod::BF16 ? 2 : 4;

  StepPrediction out;
  out.ranks.assign(p, {});
  // Ranks that time-share the cores wait for each other at every blocking collective.
  const bool oversubscribed = double(world) * o.threads > o.cores;
  const double sync = oversubscribed ? o.net.oversubscribed_sync_us : 0.0;
  // The step's own collectives (between its phases) follow long stretches of compute, over which time-sliced
  // ranks drift further apart.
  const double step_sync = oversubscribed ? o.net.oversubscribed_step_sync_us : 0.0;
  // The pipeline phase.
  TimelineInput in;
  in.schedule = cfg.parallel.schedule;
  in.p = p;
  in.m = m;
  in.v = v;
  in.ranks_per_stage = dp * tp;
  in.threads = o.threads;
  in.cores = o.cores;
  if (p > 1) in.poll_share.assign(p, o.net.poll_share);
  in.chunks.assign(p, std::vector<ChunkCost>(v));
  std::vector<std::vector<GPTConfig>> stage_cfg(p, std::vector<GPTConfig>(v));
  // Records in flight on each rank (all its chunks): passes run at the speed of their caches' state, which the
  // calibration reproduces. At least 2: between two passes over one record a step always runs something else
  // (other micro-batches, the optimizer); beyond 3 nothing of a micro-batch's forward is left in the caches.
  std::vector<int> inflight(p);
  for (int r = 0; r < p; ++r) {
    const ScheduleUsage u = schedule_usage(cfg.parallel.schedule, p, m, v, r);
    int n = 0;
    for (int k : u.records) n += k;
    inflight[r] = std::min(3, std::max(2, n));
  }
  for (int r = 0; r < p; ++r)
    for (int c = 0; c < v; ++c) {
      const GPTConfig g = stage_config(base, layers, c * p + r);
      stage_cfg[r][c] = g;
      StageShape s;
      s.blocks = g.stage_layers();
      s.first = g.first_stage();
      s.last = g.last_stage();
      s.B = B;
      s.tp = tp;
      s.sp = sp;
      s.dtype = dt;
      s.split = split;
      s.inflight = inflight[r];
      s.recompute = cfg.train.recompute;
      const PassTimes t = cal.stage(s);
      const TpTraffic traffic = tp_traffic(cfg.model, s);
      auto cost = [&](const std::vector<TpOp>& ops, double work_us) {
        PassCost pc;
        pc.work_us = work_us;
        for (const TpOp& op : ops) pc.wall_us += net.op_us(op.kind, op.bytes, tp, links.tp, links.tp_sharers) + sync;
        return pc;
      };
      StepPrediction::RankPasses& rp = out.ranks[r];
      rp.fwd += t.fwd;
      rp.bwd += t.bwd;
      rp.bwd_input += t.bwd_input;
      rp.bwd_weight += t.bwd_weight;
      ChunkCost& cc = in.chunks[r][c];
      cc.fwd = cost(traffic.fwd, t.fwd);
      cc.bwd = cost(traffic.bwd, t.bwd);
      cc.bwd_input = cost(traffic.bwd_input, t.bwd_input);
      cc.bwd_weight = cost(traffic.bwd_weight, t.bwd_weight);
    }
  const int64_t msg = (sp ? int64_t(B) * T / tp : int64_t(B) * T) * cfg.model.d_model * int64_t(dtype_size(dt));
  for (int s = 0; s + 1 < S; ++s) {
    const int r = s % p;
    const bool inter = r + 1 < p ? links.pp[r] : links.emb;  // rank p-1 -> rank 0: the interleaved wrap-around
    in.xfer_us.push_back(net.op_us(CommKind::Send, msg, 2, inter, links.pp_sharers) + o.net.p2p_latency_us + sync);
  }
  const std::vector<TimelineRank> tl = simulate_timeline(in);

  std::vector<double> t(p), exposed(p);
  for (int r = 0; r < p; ++r) {
    out.ranks[r].list_end_ms = tl[r].list_end / 1000.0;
    t[r] = tl[r].span_end;
    exposed[r] = tl[r].tp_wait;
  }
  // The tied embedding's gradient summed between the first and the last stage (Llama's untied head has none).
  const std::string embedding = base.llama() ? "model.embed_tokens.weight" : "wte.weight";
  if (S > 1 && base.tied()) {
    const ParamTable head = gpt_param_table(stage_cfg[p - 1][v - 1]);
    const int64_t wte = head[head.index_of(embedding)].numel();
    const double P = net.op_us(CommKind::AllReduce, wte * 4, 2, links.emb) + step_sync;
    const double late = std::max(t[0], t[p - 1]);
    for (int r : {0, p - 1}) {
      const double done = t[r] >= late ? late + P : std::max(late, t[r] + P);
      exposed[r] += done - t[r];
      t[r] = done;
    }
  }
  // Data-parallel buckets: launched during each chunk's final gradient pass as their gradients become final
  // (the tied wte's only after the sum above, everything after the schedule without comm.overlap), reduced one
  // after another on the dp communicator's thread. ZeRO-2 reducing every micro-batch launches its buckets (cut
  // within blocks) in every gradient pass; without overlap each is waited for in the pass, which the timeline
  // does not model (its time is counted after the schedule).
  std::vector<double> param_numel(p, 0), state_numel(p, 0), gather(p, 0);
  for (int r = 0; r < p; ++r) {
    std::vector<std::pair<double, double>> early, held;  // (launch time, duration)
    for (int c = v - 1; c >= 0; --c) {
      const GPTConfig& g = stage_cfg[r][c];
      const ParamTable table = gpt_param_table(g);
      param_numel[r] += double(table.total_numel());
      if (!reducers) continue;
      const bool sharded = sharded_gradients(cfg);
      const std::vector<Bucket> buckets =
          sharded ? unit_buckets(table, chunk_grad_units(cfg, g, table), 4, cfg.comm.bucket_mb * 1048576.0)
                  : make_buckets(table, table.total_numel(), 4, cfg.comm.bucket_mb * 1048576.0);
      const int wte = table.index_of(embedding);
      const int64_t limit = S > 1 && base.tied() && wte >= 0 ? table[wte].offset : INT64_MAX;
      const auto pts = ready_points(g, table, split);
      std::vector<std::pair<double, double>> passes{{tl[r].final_start[c], tl[r].final_end[c]}};
      if (sharded) passes = tl[r].grad_passes[c];
      for (const Bucket& b : buckets) {
        const double dur = net.op_us(zero ? CommKind::ReduceScatter : CommKind::AllReduce,
                                     b.numel() * int64_t(wire), dp, links.dp, links.dp_sharers);
        if (zero) {
          state_numel[r] += double(shard_range(b.numel(), dp, 0).size());
          gather[r] += net.op_us(CommKind::AllGather, b.numel() * int64_t(dtype_size(dt)), dp, links.dp,
                            links.dp_sharers);
        }
        for (size_t k = 0; k < passes.size(); ++k) {
          double at = -1;
          if (cfg.comm.overlap)
            for (const auto& pt : pts)
              if (std::min(pt.first, limit) >= b.end) {
                at = passes[k].first + pt.second * (passes[k].second - passes[k].first);
                break;
              }
          // A bucket held back (the tied embedding) is reduced once, after the step's sum.
          if (at < 0 && k + 1 < passes.size() && std::min(pts.back().first, limit) < b.end) continue;
          (at >= 0 ? early : held).push_back({at, dur});
        }
      }
    }
    if (!zero) state_numel[r] = param_numel[r];
    if (!reducers) continue;
    std::stable_sort(early.begin(), early.end());
    double free = 0, busy = gather[r];
    for (const auto& op : early) free = std::max(free, op.first) + op.second, busy += op.second;
    for (const auto& op : held) free = std::max(free, t[r]) + op.second, busy += op.second;
    if (zero && dp > 1) gather[r] += step_sync;
    const double done = std::max(t[r], free + (dp > 1 ? step_sync : 0.0));
    exposed[r] += done - t[r];
    t[r] = done;
    out.dp_comm_ms = std::max(out.dp_comm_ms, busy / 1000.0);
  }
  // The loss, summed over the world: every rank waits for the last.
  if (world > 1) {
    const double P = net.op_us(CommKind::AllReduce, 4, world, links.world) + step_sync;
    const double last = *std::max_element(t.begin(), t.end());
    for (int r = 0; r < p; ++r) {
      const double done = std::max(last, t[r] + P);
      exposed[r] += done - t[r];
      t[r] = done;
    }
  }
  // The optimizer: every rank at once (the cores shared by all), with the gradient norm's small all-reduces,
  // then ZeRO's parameter all-gather (its exposed part). The gradient buffer's zeroing at the step's start is counted here too.
  const double rate = shared_rate(world, o.threads, o.cores);
  double norm_ar = 0;
  const bool pp_inter = std::any_of(links.pp.begin(), links.pp.end(), [](bool b) { return b; });
  if (tp > 1) norm_ar += net.op_us(CommKind::AllReduce, 4, tp, links.tp) + step_sync;
  if (zero) norm_ar += net.op_us(CommKind::AllReduce, 4, dp, links.dp) + (dp > 1 ? step_sync : 0.0);
  if (p > 1) norm_ar += net.op_us(CommKind::AllReduce, 4, p, pp_inter) + step_sync;
  double step_us = 0;
  for (int r = 0; r < p; ++r) {
    const double opt =
        (cal.zero_grads_us(int64_t(param_numel[r])) + cal.optimizer_us(int64_t(state_numel[r]), dt)) / rate;
    out.optimizer_ms = std::max(out.optimizer_ms, opt / 1000.0);
    // ZeRO's parameter all-gather runs from the step's start and hides behind the first forward pass, which waits
    // for it bucket by bucket (param_gather.h): what outlasts that pass is exposed.
    const double gather_exposed = std::max(0.0, gather[r] - tl[r].first_forward_end);
    t[r] += opt + norm_ar + gather_exposed;
    exposed[r] += norm_ar + gather_exposed;
    step_us = std::max(step_us, t[r]);
  }
  out.step_ms = step_us / 1000.0;
  out.tokens_per_s = double(cfg.train.global_batch) * T / (step_us * 1e-6);
  double span = 0, min_busy = 1e300;
  for (int r = 0; r < p; ++r) {
    span = std::max(span, tl[r].span_end - tl[r].list_start);
    min_busy = std::min(min_busy, tl[r].busy);
    out.exposed_comm_ms = std::max(out.exposed_comm_ms, exposed[r] / 1000.0);
  }
  out.pipeline_ms = span / 1000.0;
  out.bubble_ms = p > 1 ? std::max(0.0, span - min_busy) / 1000.0 : 0.0;
  out.compute_ms = std::max(0.0, out.step_ms - out.exposed_comm_ms - out.bubble_ms);
  out.core_share = shared_rate(double(world), o.threads, o.cores);
  return out;
}

}  // namespace mt::plan
