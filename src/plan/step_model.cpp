// The step time model (see step_model.h).
#include "plan/step_model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <string>

#include "model/pipeline_chunks.h"
#include "parallel/grad_buckets.h"
#include "plan/memory_model.h"
#include "plan/param_gathers.h"
#include "plan/schedule_usage.h"
#include "plan/timeline.h"
#include "parallel/sharded_grads.h"
#include "train/grad_reducers.h"
#include "train/model_config.h"

namespace mt::plan {

namespace {

// Where in a chunk's final gradient pass its gradients become final: (end of the flat range reported, fraction of
// the pass done), in the order GPT::backward / backward_weights call grads_ready: after the head, and in each block
// after its MLP's output projection's weight, its MLP half, its attention's output projection and the whole block.
// The split of the pass between them and the embedding is by multiply-adds (the measured pass time is one number).
std::vector<std::pair<int64_t, double>> ready_points(const StageConfig& s, const ParamTable& t, bool weight_pass) {
  const GPTConfig& g = s.model;
  std::vector<std::pair<int64_t, double>> pts;
  auto end_of = [&](const std::string& name) {
    const int i = t.index_of(name);
    return i < 0 ? t.total_numel() : t[i].offset + t[i].numel();
  };
  const StageWork sw = stage_work(s, weight_pass);
  double w = 0;
  if (s.last()) {
    w += sw.head;
    pts.push_back({end_of(g.llama() ? "model.norm.weight" : "ln_f.bias"), w});
  }
  for (int l = s.block_begin() + s.blocks() - 1; l >= s.block_begin(); --l) {
    const std::string h = "h." + std::to_string(l) + ".";
    // The MLP's output projection reports its weight's gradient before computing its input's (half its work, all
    // of it in the weight pass).
    const double mlp_out = weight_pass ? sw.mlp_out : sw.mlp_out / 2;
    w += mlp_out;
    pts.push_back({end_of(g.llama() ? llama_layer_name(l, 8) : h + "mlp.c_proj.bias"), w});
    w += sw.mlp - mlp_out;
    pts.push_back({end_of(g.llama() ? llama_layer_name(l, 5) : h + "ln_2.bias"), w});
    w += sw.attn_out;
    pts.push_back({end_of(g.llama() ? llama_layer_name(l, 4) : h + "attn.c_proj.bias"), w});
    w += sw.attn - sw.attn_out;
    pts.push_back({end_of(g.llama() ? llama_layer_name(l, 0) : h + "ln_1.bias"), w});
  }
  if (s.first()) w += sw.embedding;
  pts.push_back({t.total_numel(), w});
  for (auto& p : pts) p.second /= w;
  return pts;
}

// The token embedding's name in a stage's table (also the tied head's).
std::string embedding_name(const Config& cfg) {
  return cfg.model.arch == ModelArch::Llama ? "model.embed_tokens.weight" : "wte.weight";
}

// What every phase of the step reads: the layout's shapes, the network and the per-rank clocks (t: when the rank
// is done so far; exposed: how long it waited on communication so far), one entry per pipeline rank.
struct StepContext {
  const Config& cfg;
  int world, dp, tp, p, v, S;
  int cp, replicas;  // context parallelism; the ranks that average the gradients (and ZeRO shards over): dp x cp
  DType dt;
  const NetModel& net;
  MeshLinks links;
  double sync, step_sync;  // the waits of time-shared cores: per collective in the passes, per step collective
  double ring_sync;        // and per context-parallel ring message
  double pass_sync;        // and per micro-batch's gradient pass through ZeRO-2/3's ring
  // Where ranks take turns on the cores: the share of each pass's cold extra (Calibration::cold less its warm
  // time: its data refilled from memory) it pays, the share of the ranks' memory the last-level cache cannot hold.
  double cold_share;
  // Whether the ranks' compute threads fill the cores, so that their communication threads' CPU time
  // (NetModel::cpu_us) comes out of the compute's.
  bool cores_full;
  // What a rank's data-parallel communication CPU costs its step per unit (0 where the cores are not full; see
  // dp_reduction_phase).
  double comm_cpu_scale;
  // The speed of each rank's compute while every rank computes (shared_rate: the cores shared, taking turns costed).
  double core_share;
  std::vector<std::vector<StageConfig>> stage_cfg;  // [rank][chunk]
  std::vector<std::vector<PassGathers>> gathers;  // ZeRO-3: [rank][action of its list], each pass's gathers
  std::vector<TimelineRank> tl;
  std::vector<double> t, exposed;
  // A collective of the step between its phases, which rank r starts at t[r] and every rank leaves together: the
  // last to arrive plus its duration. An early rank's wait does not shorten it (when it did, an early rank with the
  // longer optimizer hid part of a step sync, on some machines' timings and not on others').
  void together(double dur, const std::vector<size_t>& ranks) {
    double last = 0;
    for (size_t r : ranks) last = std::max(last, t[r]);
    for (size_t r : ranks) {
      exposed[r] += last + dur - t[r];
      t[r] = last + dur;
    }
  }
  void together(double dur) {
    std::vector<size_t> all(t.size());
    std::iota(all.begin(), all.end(), size_t(0));
    together(dur, all);
  }
};

// ZeRO-3: chunk `g`'s parameter store (plan/param_gathers.h). Each unit's gather is its buckets' all-gathers (the
// gradient shards' buckets, cut within the units) in the compute dtype, one after another, plus the wait for a
// peer time-sliced out when the ranks share cores.
ChunkParamGathers chunk_param_gathers(const StepContext& x, const StageConfig& g) {
  const ParamTable table = gpt_param_table(g.model, g.part);
  const std::vector<GradUnit> units = chunk_param_units(x.cfg, g.model, table);
  const std::vector<Bucket> buckets =
      unit_buckets(table, chunk_grad_units(x.cfg, g.model, table), 4, x.cfg.comm.bucket_mb * 1048576.0);
  const int elem = int(dtype_size(x.dt));
  std::vector<double> unit_us(units.size(), x.replicas > 1 ? x.sync : 0.0), unit_cpu(units.size(), 0.0);
  std::vector<std::vector<GatherBucket>> unit_buckets(units.size());
  for (const Bucket& b : buckets) {
    size_t u = 0;
    while (b.begin >= units[u].end) ++u;
    const double us = x.net.op_us(CommKind::AllGather, b.numel() * elem, x.replicas, x.links.dp, x.links.dp_sharers);
    unit_us[u] += us;
    unit_buckets[u].push_back({b.begin, b.end, us});
    unit_cpu[u] += x.net.cpu_us(CommKind::AllGather, b.numel() * elem, x.replicas);
  }
  const bool shared = sharded_grads_options(x.cfg, x.dp, x.dt, DType::F32).shared_ring;
  // The trainer's forward passes report their reads (ShardedParams::reader): each waits for its bucket alone.
  return ChunkParamGathers(g, table, units, unit_us, elem, shared, unit_cpu, unit_buckets,
                           x.cfg.optim.zero_unit == ZeroUnit::Sublayer);
}

// A pass's measured compute (us at full speed).
double pass_work_us(const PassTimes& pt, ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return pt.fwd;
    case ActionKind::Backward: return pt.bwd;
    case ActionKind::BackwardInput: return pt.bwd_input;
    default: return pt.bwd_weight;
  }
}

bool is_pass(ActionKind k) {
  return k == ActionKind::Forward || k == ActionKind::Backward || k == ActionKind::BackwardInput ||
         k == ActionKind::BackwardWeight;
}

// ZeRO-3: every pass's parameter gathers, each rank's action list walked as its chunks' stores see it over one step
// (no unit resident at its start: the optimizer changed the shards; chunk 0's first two units in flight since the
// step began, as the trainer gathers them after the optimizer). A pass's wait for its gathers goes into the
// timeline's pass; each gather occupies the dp communicator (dp_reduction_phase). That a gather can queue there
// behind the reduce-scatters launched before it is not modeled in the pass's wait.
void param_gathers_in_passes(StepContext& x, const std::vector<std::vector<PassTimes>>& times, TimelineInput& in) {
  const Config& cfg = x.cfg;
  const int m = cfg.train.global_batch / (x.dp * cfg.train.micro_batch);
  x.gathers.assign(x.p, {});
  in.action_wait_us.assign(x.p, {});
  // A gather hides behind its pass's compute in wall time: where the ranks take turns on the cores, the compute runs
  // at their shared speed (every rank computing, to first order). Charged at full speed, ZeRO-3 at dp 4 on 2 cores
  // was predicted 23% slow with the forward pass prefetching one unit ahead (10 ms of waits where the runs exposed
  // 1 ms more than ZeRO-1's).
  auto wall_us = [&](const PassTimes& pt, ActionKind kind) { return pass_work_us(pt, kind) / x.core_share; };
  double head_start = 0;  // before rank r's first forward pass: the earlier stages' first forward passes
  for (int r = 0; r < x.p; ++r) {
    std::vector<ChunkParamGathers> chunks;
    for (int c = 0; c < x.v; ++c) chunks.push_back(chunk_param_gathers(x, x.stage_cfg[r][c]));
    // The trainer gathers each rank's first units after the optimizer, for the next step's first forward pass,
    // which on a later stage starts only when its input arrives.
    chunks[0].prefetch_forward_start(head_start);
    head_start += wall_us(times[r][0], ActionKind::Forward);
    for (const Action& a : schedule_fn(cfg.parallel.schedule)(x.p, m, x.v, r)) {
      PassGathers g;
      if (is_pass(a.kind)) g = chunks[a.chunk].pass(a.kind, wall_us(times[r][a.chunk], a.kind));
      in.action_wait_us[r].push_back(g.wait_us);
      x.gathers[r].push_back(std::move(g));
    }
  }
}

// Context parallelism: what a pass of stage `g` waits for its ring messages (ring_us: their time on the cp link, one
// after another). Each ring step's message travels while the step's attention blocks compute, so cp - 1 of the cp
// steps hide messages: the pass's score work (stage_work's T C / tp multiply-adds per token and block, as a share of
// the pass's) times (cp - 1) / cp. What the messages take beyond that is waited for.
double ring_wait_us(const StageConfig& g, int cp, double ring_us, double work_us, bool weight_pass) {
  if (cp == 1 || ring_us == 0) return 0;
  const StageWork w = stage_work(g, weight_pass);
  const double blocks = g.blocks(), per_token = w.head + blocks * (w.mlp + w.attn) + w.embedding;
  const double scores = blocks * double(g.model.seq_len) * g.model.d_model / g.tp();
  return std::max(0.0, ring_us - work_us * scores / per_token * (cp - 1) / cp);
}

// The passes: the pipeline schedule simulated over each chunk's measured pass times and tensor-parallel traffic
// (and ZeRO-3's parameter gathers).
void passes_phase(StepContext& x, Calibration& cal, const StepOptions& o, StepPrediction& out) {
  const Config& cfg = x.cfg;
  const int p = x.p, v = x.v, tp = x.tp, B = cfg.train.micro_batch, T = cfg.model.seq_len / x.cp;
  const double tp_sync = tp > 1 ? x.sync : 0.0;  // a tp collective waits for its time-sliced peers (net_model.h)
  const int m = cfg.train.global_batch / (x.dp * B);
  const std::vector<int> layers = layers_per_stage(cfg);
  const GPTConfig base = gpt_config(cfg);
  const bool sp = tp > 1 && cfg.parallel.sequence_parallel;
  TimelineInput in;
  in.schedule = cfg.parallel.schedule;
  in.p = p;
  in.m = m;
  in.v = v;
  in.ranks_per_stage = x.replicas * tp;
  in.threads = o.threads;
  in.cores = o.cores;
  in.slicing = o.slicing;
  in.wake_us = o.net.p2p_wake_us;
  if (p > 1) in.poll_share.assign(p, o.net.poll_share);
  in.chunks.assign(p, std::vector<ChunkCost>(v));
  x.stage_cfg.assign(p, std::vector<StageConfig>(v));
  std::vector<std::vector<PassTimes>> times(p, std::vector<PassTimes>(v));
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
      const StageConfig g = stage_config(base, tp, sp, layers, c * p + r);
      x.stage_cfg[r][c] = g;
      StageShape s;
      s.blocks = g.blocks();
      s.first = g.first();
      s.last = g.last();
      s.B = B;
      s.tp = tp;
      s.sp = sp;
      s.dtype = x.dt;
      s.split = cfg.parallel.schedule == PipelineSchedule::ZB1;
      s.inflight = inflight[r];
      s.recompute = cfg.train.recompute;
      s.cp = x.cp;
      const PassTimes pt = cal.stage(s);
      times[r][c] = pt;
      const TpTraffic& traffic = cal.traffic(s);
      auto cost = [&](const std::vector<TpOp>& ops, double work_us, bool weight_pass = false) {
        PassCost pc;
        pc.work_us = work_us;
        double ring_us = 0;
        for (const TpOp& op : ops)
          if (op.kind == CommKind::Send)  // its transfer may hide behind the blocks; its rendezvous does not
            ring_us += x.net.op_us(op.kind, op.bytes, 2, x.links.cp, x.links.cp_sharers), pc.wall_us += x.ring_sync;
          else {
            // With the cores full, its copies and sums and its thread's hand-over run at the shared speed, as the
            // compute does (charged as wall time only, tp layouts ran up to 36% slower than predicted), inside
            // the link's delay (charged on top of it, tp 4 on 8 ranks ran up to 40% faster: docs/planner_log.md).
            const PassCost c =
                blocking_collective(x.net.op_us(op.kind, op.bytes, tp, x.links.tp, x.links.tp_sharers),
                                    x.cores_full ? x.net.cpu_us(op.kind, op.bytes, tp) : 0.0, x.core_share);
            pc.work_us += c.work_us;
            pc.wall_us += c.wall_us + tp_sync;
          }
        pc.wall_us += ring_wait_us(g, x.cp, ring_us, work_us, weight_pass);
        return pc;
      };
      StepPrediction::RankPasses& rp = out.ranks[r];
      rp.fwd += pt.fwd;
      rp.bwd += pt.bwd;
      rp.bwd_input += pt.bwd_input;
      rp.bwd_weight += pt.bwd_weight;
      ChunkCost& cc = in.chunks[r][c];
      cc.fwd = cost(traffic.fwd, pt.fwd);
      cc.bwd = cost(traffic.bwd, pt.bwd);
      cc.bwd_input = cost(traffic.bwd_input, pt.bwd_input);
      cc.bwd_weight = cost(traffic.bwd_weight, pt.bwd_weight, true);
      if (x.cold_share > 0) {
        const PassTimes ct = cal.cold(s);
        auto refill = [&](PassCost& pc, double cold, double warm) {
          if (pc.work_us > 0) pc.work_us += x.cold_share * std::max(0.0, cold - warm);
        };
        refill(cc.fwd, ct.fwd, pt.fwd);
        refill(cc.bwd, ct.bwd, pt.bwd);
        refill(cc.bwd_input, ct.bwd_input, pt.bwd_input);
        refill(cc.bwd_weight, ct.bwd_weight, pt.bwd_weight);
      }
    }
  const int64_t msg = (sp ? int64_t(B) * T / tp : int64_t(B) * T) * cfg.model.d_model * int64_t(dtype_size(x.dt));
  for (int s = 0; s + 1 < x.S; ++s) {
    const int r = s % p;
    const bool inter = r + 1 < p ? x.links.pp[r] : x.links.emb;  // rank p-1 -> rank 0: the interleaved wrap-around
    in.xfer_us.push_back(x.net.op_us(CommKind::Send, msg, 2, inter, x.links.pp_sharers) + o.net.p2p_latency_us +
                         x.sync);
  }
  if (cfg.optim.zero == 3) param_gathers_in_passes(x, times, in);
  x.tl = simulate_timeline(in);
  for (int r = 0; r < p; ++r) {
    out.ranks[r].list_end_ms = x.tl[r].list_end / 1000.0;
    x.t[r] = x.tl[r].span_end;
    x.exposed[r] = x.tl[r].tp_wait;
  }
}

// The tied embedding's gradient summed between the first and the last stage (Llama's untied head has none).
void tied_sum_phase(StepContext& x) {
  if (x.S == 1 || !x.stage_cfg[0][0].model.tied()) return;
  const int p = x.p;
  const StageConfig& last = x.stage_cfg[p - 1][x.v - 1];
  const ParamTable head = gpt_param_table(last.model, last.part);
  const int64_t wte = head[head.index_of(embedding_name(x.cfg))].numel();
  x.together(x.net.op_us(CommKind::AllReduce, wte * 4, 2, x.links.emb) + x.step_sync, {0, size_t(p - 1)});
}

// ZeRO-3: rank r's parameter gathers as operations on its dp communicator, (launch time, duration): each issued
// at its share of its pass's span in the timeline.
std::vector<std::pair<double, double>> param_gather_ops(const StepContext& x, int r) {
  std::vector<std::pair<double, double>> ops;
  if (x.gathers.empty()) return ops;
  for (size_t i = 0; i < x.gathers[r].size(); ++i) {
    const PassGathers& g = x.gathers[r][i];
    const auto [start, end] = x.tl[r].action_spans[i];
    for (size_t k = 0; k < g.units.size(); ++k) ops.push_back({start + g.issued[k] * (end - start), g.busy_us[k]});
  }
  return ops;
}

// What each rank's optimizer steps over, and ZeRO-1/2's parameter all-gather (us, from the step's start).
struct RankState {
  std::vector<double> param_numel, state_numel, gather;
};

// The data-parallel strategy's reductions (train/data_parallel.h): the synchronous strategy's buckets, launched
// during each chunk's final gradient pass as their gradients become final (the tied wte's only after the sum
// above, everything after the schedule without comm.overlap), reduced one after another on the dp
// communicator's thread. ZeRO-2 reducing every micro-batch (and ZeRO-3) launches its buckets (cut within blocks)
// in every gradient pass; without overlap each is waited for in the pass, which the timeline does not model (its
// time is counted after the schedule). ZeRO-3's parameter gathers share that thread, in the passes that issue them.
// Local SGD reduces nothing here (its parameter average is the update's: update_phase).
RankState dp_reduction_phase(StepContext& x, StepPrediction& out) {
  const Config& cfg = x.cfg;
  const int p = x.p, dp = x.replicas;
  const bool split = cfg.parallel.schedule == PipelineSchedule::ZB1, zero = cfg.optim.zero >= 1;
  // ZeRO-1 and -2 gather the updated parameters after the optimizer; ZeRO-3 gathers them in the passes instead.
  const bool gather_after_step = zero && cfg.optim.zero <= 2;
  const bool reducers = (dp > 1 || zero) && cfg.optim.sync_every == 0;
  const bool sharded = sharded_gradients(cfg);
  const size_t wire = cfg.precision.grad_reduce != DType::F32 || cfg.comm.compress == CompressMethod::BF16 ? 2 : 4;
  const std::string embedding = embedding_name(cfg);
  RankState st{std::vector<double>(p, 0), std::vector<double>(p, 0), std::vector<double>(p, 0)};
  for (int r = 0; r < p; ++r) {
    std::vector<std::pair<double, double>> early, held;  // (launch time, duration)
    double overlapped_cpu = 0;  // the communication thread's CPU time while the rank computes
    size_t ring_passes = 0;     // micro-batches whose gradient passes go through a sharded gradient ring
    for (int c = x.v - 1; c >= 0; --c) {
      const StageConfig& g = x.stage_cfg[r][c];
      const ParamTable table = gpt_param_table(g.model, g.part);
      st.param_numel[r] += double(table.total_numel());
      if (!reducers) continue;
      const std::vector<Bucket> buckets =
          sharded ? unit_buckets(table, chunk_grad_units(cfg, g.model, table), 4, cfg.comm.bucket_mb * 1048576.0)
                  : make_buckets(table, table.total_numel(), 4, cfg.comm.bucket_mb * 1048576.0);
      const int wte = table.index_of(embedding);
      const int64_t limit = x.S > 1 && g.model.tied() && wte >= 0 ? table[wte].offset : INT64_MAX;
      const auto pts = ready_points(g, table, split);
      std::vector<std::pair<double, double>> passes{{x.tl[r].final_start[c], x.tl[r].final_end[c]}};
      if (sharded) {
        passes = x.tl[r].grad_passes[c];
        ring_passes = std::max(ring_passes, passes.size());  // an interleaved micro-batch's chunks count once
      }
      for (const Bucket& b : buckets) {
        const double dur = x.net.op_us(zero ? CommKind::ReduceScatter : CommKind::AllReduce,
                                       b.numel() * int64_t(wire), dp, x.links.dp, x.links.dp_sharers);
        if (zero) st.state_numel[r] += double(shard_range(b.numel(), dp, 0).size());
        if (gather_after_step) {  // behind the next step's first forward pass
          const int64_t bytes = b.numel() * int64_t(dtype_size(x.dt));
          st.gather[r] += x.net.op_us(CommKind::AllGather, bytes, dp, x.links.dp, x.links.dp_sharers);
          overlapped_cpu += x.net.cpu_us(CommKind::AllGather, bytes, dp);
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
          if (at >= 0)
            overlapped_cpu += x.net.cpu_us(zero ? CommKind::ReduceScatter : CommKind::AllReduce,
                                           b.numel() * int64_t(wire), dp);
        }
      }
    }
    if (!zero) st.state_numel[r] = st.param_numel[r];
    if (!reducers) continue;
    for (const auto& op : param_gather_ops(x, r)) early.push_back(op);
    if (!x.gathers.empty())
      for (const PassGathers& g : x.gathers[r]) overlapped_cpu += g.cpu_us;
    // The passes ran longer by what the communication thread took from their cores, spread evenly over them: each
    // launch moves later by its share, and the reductions run against the longer passes (on a link slower than the
    // passes the stretch takes the place of a wait). Every rank's thread takes from the cores all ranks share, so
    // where they take turns on them it costs more than its own time, yet less than their slowdown: charged at the
    // square root of the threads per core. At the full slowdown (2x at dp 4 on 2 cores) ZeRO-3 was predicted 14%
    // slow, presumably because the ranks' waits leave the cores slack for it; at 1x, dp 8 ran 13-23% slower than
    // predicted, its communication threads copying twice what dp 4's do (docs/planner_log.md, "The communication
    // thread's CPU").
    const double cpu = overlapped_cpu * x.comm_cpu_scale, passes_end = x.t[r];
    if (passes_end > 0)
      for (auto& op : early) op.first += cpu * std::min(1.0, op.first / passes_end);
    const double t = passes_end + cpu + x.pass_sync * double(ring_passes);
    std::stable_sort(early.begin(), early.end());
    double free = 0, busy = st.gather[r];
    for (const auto& op : early) free = std::max(free, op.first) + op.second, busy += op.second;
    for (const auto& op : held) free = std::max(free, t) + op.second, busy += op.second;
    if (gather_after_step && dp > 1) st.gather[r] += x.step_sync;
    const double done = std::max(t, free + (dp > 1 ? x.step_sync : 0.0));
    x.exposed[r] += done - t;
    x.t[r] = done;
    out.dp_comm_ms = std::max(out.dp_comm_ms, busy / 1000.0);
  }
  return st;
}

// The optimizer's phase (train_step.h's optimizer_update): the loss summed over the world (every rank waits for
// the last; under local SGD over the pipeline alone), then every rank's optimizer at once (the cores shared by all)
// with the gradient norm's small all-reduces, then ZeRO-1/2's parameter all-gather (its exposed part; ZeRO-3 has
// none after the optimizer), or local SGD's parameter average. The gradient buffer's zeroing at the step's start
// (the strategy's begin_step) is counted here too.
void update_phase(StepContext& x, Calibration& cal, const RankState& st, StepPrediction& out) {
  const Config& cfg = x.cfg;
  const int period = cfg.optim.sync_every;  // local SGD's; 0: synchronous
  const bool pp_inter = std::any_of(x.links.pp.begin(), x.links.pp.end(), [](bool b) { return b; });
  if (period == 0 && x.world > 1)
    x.together(x.net.op_us(CommKind::AllReduce, 4, x.world, x.links.world) + x.step_sync);
  if (period > 0 && x.p > 1) x.together(x.net.op_us(CommKind::AllReduce, 4, x.p, pp_inter) + x.step_sync);
  // The gradient norm's all-reduces (tp, the replicas, the pipeline) run back to back after its local sum
  // (Optimizer::step): the first waits for the ranks' drift like the step's other collectives, the rest find them
  // together and wait as a collective in the passes does. A step sync each predicted layouts with two or three of
  // them 10-24% slow (docs/planner_log.md, "ZeRO-2 and -3's ring on every mesh, and the gradient norm's all-reduces").
  double norm_ar = 0, norm_wait = x.step_sync;
  auto norm_all_reduce = [&](int ranks, bool inter) {
    norm_ar += x.net.op_us(CommKind::AllReduce, 4, ranks, inter);
    if (ranks > 1) norm_ar += std::exchange(norm_wait, x.sync);
  };
  if (x.tp > 1) norm_all_reduce(x.tp, x.links.tp);
  if (cfg.optim.zero >= 1) norm_all_reduce(x.replicas, x.links.dp);
  if (x.p > 1) norm_all_reduce(x.p, pp_inter);
  for (int r = 0; r < x.p; ++r) {
    const double opt = (cal.zero_grads_us(int64_t(st.param_numel[r])) +
                        cal.optimizer_us(int64_t(st.state_numel[r]), x.dt)) / x.core_share;
    out.optimizer_ms = std::max(out.optimizer_ms, opt / 1000.0);
    // ZeRO-1/2's parameter all-gather runs from the step's start and hides behind the first forward pass, which waits
    // for it bucket by bucket (param_gather.h): what outlasts that pass is exposed.
    const double gather_exposed = std::max(0.0, st.gather[r] - x.tl[r].first_forward_end);
    // Local SGD: the replicas average their fp32 parameters every `period` steps, meeting there after that many
    // steps apart; the step is the mean step, which carries that share of it.
    const double average = period > 0 && x.dp > 1
                               ? (x.net.op_us(CommKind::AllReduce, int64_t(st.param_numel[r]) * 4, x.dp, x.links.dp,
                                              x.links.dp_sharers) + x.step_sync) / period
                               : 0.0;
    out.dp_comm_ms = std::max(out.dp_comm_ms, average / 1000.0);
    x.t[r] += opt + norm_ar + gather_exposed + average;
    x.exposed[r] += norm_ar + gather_exposed + average;
  }
}

// ZeRO-3: the most any pipeline rank gathers per step and waits for its gathers (StepPrediction::param_gathers).
void summarise_param_gathers(const StepContext& x, StepPrediction& out) {
  for (const std::vector<PassGathers>& rank : x.gathers) {
    int count = 0;
    double bytes = 0, wait = 0;
    for (const PassGathers& g : rank) {
      count += int(g.units.size());
      bytes += double(g.bytes);
      wait += g.wait_us;
    }
    out.param_gathers = std::max(out.param_gathers, count);
    out.param_gather_bytes = std::max(out.param_gather_bytes, bytes);
    out.param_gather_wait_ms = std::max(out.param_gather_wait_ms, wait / 1000.0);
  }
}

// The share of what the passes touch that the last-level cache cannot hold, and so of each pass's cold extra that
// it pays: 1 - cache / (the training memory of every rank on the machine, as the memory model predicts it), at
// least 0. Measured on a Zen 5 VM with 32 MiB (docs/planner.md, "The last-level cache"): four ranks of
// configs/gpt.yaml's whole model (about 50 MB together at one sequence) took 1.4-1.5x their share of the cores per
// forward and backward pass, four of one or two blocks (fitting the cache) 1.07-1.10x; steeper shares (all of the
// extra from the cache's size up) predicted dp right and pipelines up to 80% slow.
double llc_miss(const Config& cfg, int world, double llc_bytes) {
  if (llc_bytes <= 0) return 0;
  const MemoryPrediction mem = predict_memory(cfg, world);
  double node = 0;
  for (const StageMemory& s : mem.stages) node += s.training() * double(world) / double(mem.stages.size());
  return std::max(0.0, 1.0 - llc_bytes / node);
}

}  // namespace

// The phases in the trainer's order (train_step.h): the passes (with ZeRO-3's parameter gathers), the tied
// embedding's sum, the data-parallel strategy's reductions, then its update.
StepPrediction predict_step(const Config& cfg, int world, Calibration& cal, const StepOptions& o) {
  const NetModel net(cfg, o.net);
  const int p = cfg.parallel.pp, v = cfg.parallel.virtual_stages;
  // Ranks that time-share the cores wait for each other at every blocking collective and message; the step's own
  // collectives (between its phases) follow long stretches of compute, over which time-sliced ranks drift
  // further apart. Each wait is charged per thread taking turns on a core: a peer is one of that many.
  const bool oversubscribed = double(world) * o.threads > o.cores, cores_full = double(world) * o.threads >= o.cores;
  const double per_core = oversubscribed ? double(world) * o.threads / o.cores : 0.0;
  const int dp = resolved_dp(cfg, world), cp = cfg.parallel.cp;
  // Except where data parallelism is all there is: a rank that reaches a step collective early sleeps (shared
  // memory's waits never spin, MPI's polled ones only for their first millisecond) and its core goes to the ranks
  // still computing, so the drift costs nothing; the step is the ranks' work shared over the cores. Where the passes
  // are chained (pipeline messages, cp's ring), a late rank holds the chain up. Measured: dp 4 on 2 cores 28.7-30.7
  // ms, predicted 37 with the charge and 31-33 without; dp 8 36.7-41.0 ms, predicted 48 and 36-40 (docs/planner_log.md,
  // "Data parallelism alone"). Tensor parallelism alone does not chain them either: a tp group meets at every
  // collective of its passes, so it reaches the step's collectives together, and the groups are replicas as dp's
  // are. Charged as a chain, dp x tp layouts ran 11% (4 ranks) and 19% (8 ranks) faster than predicted on average
  // over 22 samples, and 2 x 2 at micro-batch 8 measured what the model without the charge predicts, with and
  // without an emulated link (docs/planner_log.md, "Tensor parallelism does not chain the step").
  // ZeRO-2 and -3 chain the replicas (dp x cp) once per micro-batch's gradient pass, on every mesh: a unit's
  // gradients wait for the ring slot of the unit two back, whose reduction completes when the slowest replica has
  // computed it. The wait grows with the replicas to wait for: log2(replicas) / 2 step syncs, one at 4 replicas.
  // Measured against ZeRO-1 on 2 cores, per micro-batch in step syncs: 0.46-1.05 at 2 replicas, 0.6-1.6 at 4,
  // 1.4-1.5 at 8; an interleaved micro-batch's two chunk passes together cost what one pass costs elsewhere
  // (docs/planner_log.md, "ZeRO-2 and -3's ring on every mesh").
  const bool chained = p > 1 || cp > 1;
  const double drift = per_core * o.net.oversubscribed_step_sync_us;
  const double cold_share = oversubscribed ? llc_miss(cfg, world, o.llc_bytes) : 0.0;
  StepContext x{cfg, world, dp, cfg.parallel.tp, p, v, p * v, cp, dp * cp, cfg.precision.compute, net,
                mesh_links(cfg, world), per_core * o.net.oversubscribed_sync_us, chained ? drift : 0.0,
                per_core * o.net.oversubscribed_ring_us,
                sharded_gradients(cfg) && dp * cp > 1 ? drift * std::log2(double(dp * cp)) / 2 : 0.0,
                cold_share, cores_full,
                cores_full ? std::max(1.0, std::sqrt(per_core)) : 0.0,
                shared_rate(double(world), o.threads, o.cores, 0, o.slicing), {}, {}, {},
                std::vector<double>(p, 0),
                std::vector<double>(p, 0)};
  StepPrediction out;
  out.ranks.assign(p, {});
  passes_phase(x, cal, o, out);
  tied_sum_phase(x);
  const RankState st = dp_reduction_phase(x, out);
  update_phase(x, cal, st, out);

  const double step_us = *std::max_element(x.t.begin(), x.t.end());
  out.step_ms = step_us / 1000.0;
  out.tokens_per_s = double(cfg.train.global_batch) * cfg.model.seq_len / (step_us * 1e-6);
  double span = 0, min_busy = 1e300;
  for (int r = 0; r < p; ++r) {
    span = std::max(span, x.tl[r].span_end - x.tl[r].list_start);
    min_busy = std::min(min_busy, x.tl[r].busy);
    out.exposed_comm_ms = std::max(out.exposed_comm_ms, x.exposed[r] / 1000.0);
  }
  out.pipeline_ms = span / 1000.0;
  out.bubble_ms = p > 1 ? std::max(0.0, span - min_busy) / 1000.0 : 0.0;
  out.compute_ms = std::max(0.0, out.step_ms - out.exposed_comm_ms - out.bubble_ms);
  out.core_share = x.core_share;
  summarise_param_gathers(x, out);
  return out;
}

}  // namespace mt::plan
