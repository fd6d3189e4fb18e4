// The pipeline executor (see pipeline_runner.h).
#include "train/pipeline_runner.h"

#include <algorithm>
#include <map>

#include "comm/flight_recorder.h"

namespace mt {

namespace {

bool is_recv(ActionKind k) { return k == ActionKind::RecvAct || k == ActionKind::RecvGrad; }
bool is_grad_pass(ActionKind k) { return k == ActionKind::Backward || k == ActionKind::BackwardWeight; }

// Trace span names of the compute actions.
const char* pass_name(ActionKind k) {
  switch (k) {
    case ActionKind::Forward: return "forward";
    case ActionKind::Backward: return "backward";
    case ActionKind::BackwardInput: return "backward input";
    case ActionKind::BackwardWeight: return "backward weight";
    case ActionKind::SendAct: return "send activations";
    case ActionKind::RecvAct: return "receive activations";
    case ActionKind::SendGrad: return "send gradients";
    default: return "receive gradients";
  }
}

double ms_between(double t0_us, double t1_us) { return (t1_us - t0_us) / 1000.0; }

}  // namespace

PipelineRunner::PipelineRunner(PipelineChunks& model, Communicator* pp, PipelineSchedule schedule, int m, int B,
                               int T, Profiler& prof)
    : model_(model), pp_(pp), prof_(prof), p_(pp ? pp->size() : 1), v_(model.size()), m_(m), B_(B), T_(T),
      split_(schedule == PipelineSchedule::ZB1), buffers_(model.device()),
      scratch_(model.device(), size_t(16) << 20) {
  CHECK(p_ * v_ == model.num_stages(), "{} pipeline ranks x {} chunks != {} stages", p_, v_, model.num_stages());
  CHECK(p_ == 1 || pp, "a pipeline of {} ranks needs its communicator", p_);
  const int rank = pp ? pp->rank() : 0;
  pool_.resize(v_);
  train_ = make_plan(schedule_fn(schedule)(p_, m, v_, rank));
}

// Tags identify a message by direction, sending chunk and micro-batch (so matching never depends on order);
// they stay within the 32767 every MPI implementation allows.
int PipelineRunner::tag(ActionKind kind, int micro_batch, int sender_chunk) const {
  constexpr int kMaxMicro = 1024;
  CHECK(micro_batch < kMaxMicro && v_ <= 16, "pipeline tags: micro-batch {} or {} chunks out of range", micro_batch,
        v_);
  const int dir = (kind == ActionKind::SendAct || kind == ActionKind::RecvAct) ? 0 : 1;
  return (dir * v_ + sender_chunk) * kMaxMicro + micro_batch;
}

PipelineRunner::Plan PipelineRunner::make_plan(std::vector<Action> actions) {
  Plan plan;
  const int n = static_cast<int>(actions.size());
  plan.recv_buf.resize(n);
  plan.releases.assign(n, false);
  plan.final_grads.assign(n, false);
  std::map<std::pair<int, int>, int> last_use;  // (chunk, mb) -> index of its last action
  std::vector<int> final_grad(v_, -1);
  for (int i = 0; i < n; ++i) {
    const Action& a = actions[i];
    if (is_recv(a.kind)) {
      const GPT& g = model_.chunk(a.chunk);
      plan.recv_buf[i] = buffers_.alloc({g.sharding().rows(int64_t(B_) * T_), g.config().d_model}, model_.dtype());
      continue;
    }
    last_use[{a.chunk, a.micro_batch}] = i;
    if (is_grad_pass(a.kind)) final_grad[a.chunk] = i;
  }
  for (auto& u : last_use) plan.releases[u.second] = true;
  for (int c = 0; c < v_; ++c)
    if (final_grad[c] >= 0) plan.final_grads[final_grad[c]] = true;
  plan.actions = std::move(actions);
  return plan;
}

PipelineRunner::Record& PipelineRunner::acquire(int chunk) {
  auto& pool = pool_[chunk];
  auto sends_done = [](const Record& r) {
    return std::all_of(r.sends.begin(), r.sends.end(), [](const WorkPtr& w) { return w->done(); });
  };
  Record* pick = nullptr;
  for (auto& r : pool)
    if (!r->busy && sends_done(*r)) pick = r.get();
  if (!pick)
    for (auto& r : pool)
      if (!r->busy) pick = r.get();  // its sends are still in flight: wait for them below
  if (!pick) {
    // A new record: sized exactly by the first one of this chunk, so it is one block.
    const GPT& g = model_.chunk(chunk);
    size_t bytes = pool.empty() ? size_t(64) << 20 : pool.front()->arena->high_water_bytes();
    auto rec = std::make_unique<Record>();
    rec->arena = std::make_unique<Arena>(g.device(), bytes);
    rec->acts = g.alloc_activations(*rec->arena, B_, T_, split_);
    if (!g.first_stage()) rec->dinput = rec->arena->alloc(rec->acts.input().shape(), g.dtype());
    pool.push_back(std::move(rec));
    pick = pool.back().get();
  }
  for (auto& w : pick->sends) w->wait();
  pick->sends.clear();
  pick->busy = true;
  return *pick;
}

size_t PipelineRunner::record_bytes(int chunk) const {
  return pool_[chunk].empty() ? 0 : pool_[chunk].front()->arena->high_water_bytes();
}

size_t PipelineRunner::buffer_bytes() const { return buffers_.high_water_bytes(); }

RunStats PipelineRunner::train(const FillFn& fill, double dloss, const Tensor& loss_sum,
                               const std::vector<ChunkReduce>& reduce, bool overlap) {
  return run(train_, fill, dloss, loss_sum, &reduce, overlap);
}

RunStats PipelineRunner::forward_only(int n, const FillFn& fill, const Tensor& loss_sum,
                                      const std::vector<ChunkReduce>& gathers) {
  if (eval_n_ != n) {
    // Forward passes in micro-batch order, each through this rank's chunks in stage order.
    const int rank = pp_ ? pp_->rank() : 0, S = p_ * v_;
    std::vector<Action> list;
    for (int mb = 0; mb < n; ++mb)
      for (int c = 0; c < v_; ++c) {
        const int s = c * p_ + rank;
        if (s > 0) list.push_back({ActionKind::RecvAct, mb, c, s - 1});
        list.push_back({ActionKind::Forward, mb, c, -1});
        if (s < S - 1) list.push_back({ActionKind::SendAct, mb, c, s + 1});
      }
    eval_ = make_plan(std::move(list));
    eval_n_ = n;
  }
  return run(eval_, fill, 0.0, loss_sum, &gathers, false);
}

RunStats PipelineRunner::run(Plan& plan, const FillFn& fill, double dloss, const Tensor& loss_sum,
                             const std::vector<ChunkReduce>* reduce, bool overlap) {
  // The flight recorder's place of each operation the actions issue, cleared when the run ends.
  const int stage = pp_ ? pp_->rank() : 0;
  auto flight_at = [stage](const Action& a) {
    FlightWhere& w = flight_where();
    w.micro_batch = a.micro_batch, w.chunk = a.chunk, w.stage = stage, w.site = pass_name(a.kind), w.site_index = -1;
  };
  struct ClearWhere {
    ~ClearWhere() {
      FlightWhere& w = flight_where();
      w.micro_batch = w.chunk = w.stage = w.site_index = -1;
      w.site = nullptr;
    }
  } clear_where;
  RunStats st;
  const double start_us = trace_clock_us();
  const int n = static_cast<int>(plan.actions.size());
  // Post every receive of the run up front, each into its own buffer.
  std::vector<WorkPtr> recvs(n);
  for (int i = 0; i < n; ++i) {
    const Action& a = plan.actions[i];
    if (!is_recv(a.kind)) continue;
    const int sender_chunk = a.peer_stage / p_;
    flight_at(a);
    recvs[i] = pp_->recv_async(plan.recv_buf[i], a.peer_stage % p_, tag(a.kind, a.micro_batch, sender_chunk));
  }
  // Per (chunk, micro-batch), slot chunk * M + mb: its record while alive, and what was received for it.
  const int M = std::max(m_, eval_n_);
  std::vector<Record*> live(v_ * M, nullptr);
  std::vector<const Tensor*> received_act(v_ * M, nullptr), received_grad(v_ * M, nullptr);
  const Tensor none;

  for (int i = 0; i < n; ++i) {
    const Action& a = plan.actions[i];
    const int k = a.chunk * M + a.micro_batch;
    GPT& model = model_.chunk(a.chunk);
    flight_at(a);
    const bool last_stage = model.last_stage();
    const double t0 = trace_clock_us();
    const bool compute = !is_recv(a.kind) && a.kind != ActionKind::SendAct && a.kind != ActionKind::SendGrad;
    if (compute) stretch_.begin();
    switch (a.kind) {
      case ActionKind::RecvAct:
      case ActionKind::RecvGrad: {
        recvs[i]->wait();
        if (prof_.enabled())
          prof_.wait(a.kind == ActionKind::RecvAct ? "pp recv activations" : "pp recv gradients", t0, trace_clock_us());
        (a.kind == ActionKind::RecvAct ? received_act : received_grad)[k] = &plan.recv_buf[i];
        break;
      }
      case ActionKind::Forward: {
        Record& r = acquire(a.chunk);
        live[k] = &r;
        if (r.acts.tokens.device() == Device::CPU) {
          fill(a.micro_batch, r.acts.tokens.data_as<int32_t>(), r.acts.targets.data_as<int32_t>());
        } else {
          // Copies from pageable memory return once the data is staged, so the vectors can be refilled next.
          tokens_.resize(r.acts.tokens.numel());
          targets_.resize(r.acts.targets.numel());
          fill(a.micro_batch, tokens_.data(), targets_.data());
          copy_convert(r.acts.tokens, Tensor(tokens_.data(), r.acts.tokens.shape(), DType::I32));
          copy_convert(r.acts.targets, Tensor(targets_.data(), r.acts.targets.shape(), DType::I32));
        }
        if (!model.first_stage()) {
          CHECK(received_act[k], "schedule: forward of micro-batch {} chunk {} before its input arrived",
                a.micro_batch, a.chunk);
          copy_convert(r.acts.input(), *received_act[k]);
        }
        // ZeRO-1 and -2: each bucket of the previous step's parameter all-gather is waited for as the pass
        // reaches it. ZeRO-3: each unit is gathered (or its prefetch waited for) as the pass reaches it.
        // Where the model reports its reads (ShardedParams::reader, ParamGather::reader), each read waits for its
        // own bucket, and the trace shows those waits too.
        std::function<void(int64_t)> need;
        std::function<void(double, double)> traced;
        if (prof_.enabled()) traced = [this](double t0, double t1) { prof_.wait("all-gather parameters", t0, t1); };
        const ChunkReduce* cr = reduce && !reduce->empty() ? &(*reduce)[a.chunk] : nullptr;
        if (cr && cr->params) {
          cr->params->begin_pass(PassOrder::Forward);
          cr->params->set_read_wait_observer(traced);
          need = [z = cr->params, traced](int64_t begin) {
            const double w0 = trace_clock_us();
            z->forward_needs(begin);
            if (traced) traced(w0, trace_clock_us());
          };
        } else if (cr && cr->gather && cr->gather->reads_reported()) {
          cr->gather->set_read_wait_observer(traced);
        } else if (cr && cr->gather) {
          need = [g = cr->gather, traced](int64_t begin) {
            const double w0 = trace_clock_us();
            g->wait_from(begin);
            if (traced) traced(w0, trace_clock_us());
          };
        }
        model.forward(r.acts, last_stage ? dloss : 0.0, last_stage ? loss_sum : none, need);
        break;
      }
      case ActionKind::SendAct:
        live[k]->sends.push_back(pp_->send_async(live[k]->acts.output(), a.peer_stage % p_,
                                                 tag(a.kind, a.micro_batch, a.chunk)));
        break;
      case ActionKind::SendGrad:
        live[k]->sends.push_back(pp_->send_async(live[k]->dinput, a.peer_stage % p_,
                                                 tag(a.kind, a.micro_batch, a.chunk)));
        break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
      case ActionKind::BackwardWeight: {
        Record& r = *live[k];
        // The reducer learns that a gradient pass begins (the chunk's final one of the step arms a GradReducer)
        // and, where it asks, its buckets launch as their gradients become final (up to the held-back tied
        // embedding).
        std::function<void(int64_t)> ready;
        ParamsNeeded need;
        if (reduce && !reduce->empty()) {
          const ChunkReduce cr = (*reduce)[a.chunk];
          // ZeRO-3: the units the pass reads, head first, gathered again. The store begins the pass first: it
          // waits for its gathers, and a ring it shares with the gradients then gives them their first slot.
          if (cr.params) {
            cr.params->begin_pass(PassOrder::Backward);
            need = [z = cr.params, this](int64_t begin, int64_t end) {
              const double w0 = trace_clock_us();
              z->backward_needs(begin, end);
              if (prof_.enabled()) prof_.wait("all-gather parameters", w0, trace_clock_us());
            };
          }
          // A straggler's buckets go out as late as its slower compute would issue them.
          if (cr.reducer && cr.reducer->begin_pass(plan.final_grads[i], overlap))
            ready = [cr, this](int64_t end) {
              stretch_.account();
              cr.reducer->grads_ready(std::min(end, cr.ready_limit));
            };
        }
        if (a.kind == ActionKind::BackwardWeight) {
          model.backward_weights(r.acts, ready, need);
        } else {
          scratch_.reset();
          const Tensor* dout = received_grad[k];
          CHECK(last_stage || dout, "schedule: backward of micro-batch {} chunk {} before its gradient arrived",
                a.micro_batch, a.chunk);
          model.backward(r.acts, scratch_, ready,
                         a.kind == ActionKind::Backward ? BackwardPart::All : BackwardPart::InputOnly,
                         dout ? *dout : none, r.dinput, need);
        }
        break;
      }
    }
    if (compute) {
      stretch_.settle();
      const double t1 = trace_clock_us();
      st.busy_ms += ms_between(t0, t1);
      if (plan.final_grads[i]) st.final_backward_ms = std::max(st.final_backward_ms, ms_between(t0, t1));
      if (prof_.enabled()) prof_.compute(pass_name(a.kind), t0, t1);
    }
    if (plan.releases[i]) {
      live[k]->busy = false;  // back to the pool; its sends complete in the background
      live[k] = nullptr;
      received_act[k] = received_grad[k] = nullptr;
    }
  }
  // Sends still in flight complete before the buffers they read are reused (acquire waits for them); the
  // step's end waits for all, so no message outlives the run.
  for (auto& pool : pool_)
    for (auto& r : pool) {
      for (auto& w : r->sends) w->wait();
      r->sends.clear();
    }
  st.span_ms = ms_between(start_us, trace_clock_us());
  return st;
}

}  // namespace mt
