// The planner's pieces (src/plan/): the enumeration of layouts against a hand count and against every candidate
// the trainer's validate() accepts; the byte mirrors of the model's arena allocations against the real
// allocations (exact: the memory model is built from them), and the calibration's count of the tensor-parallel
// collectives against the model's passes; the schedule's record counts against the schedule
// simulator's; ZeRO-3's parameter gathers per pass against a ShardedParams behind the model's passes (exact); the
// timeline simulation against the schedule simulator's makespan with unit costs (exact), plus its sharing of cores;
// the network model's sharing of a node's link; the count of the calibration's neighbours. Whole-program checks
// (memory against run.dir/memory.json, JSON, ZeRO-3's gather traffic per step, exit status) are in
// tests/py/test_planner.py.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "core/arena.h"
#include "core/errors.h"
#include "model/gpt.h"
#include "parallel/schedule.h"
#include "parallel/sharded_params.h"
#include "plan/activation_bytes.h"
#include "plan/layout.h"
#include "plan/neighbours.h"
#include "plan/net_model.h"
#include "plan/null_communicator.h"
#include "plan/param_gathers.h"
#include "plan/schedule_usage.h"
#include "plan/timeline.h"
#include "plan/calibration.h"
#include "train/model_config.h"
#include "train/config.h"
#include "test_support.h"

using namespace mt;
using namespace mt::plan;

namespace {

// configs/tiny.yaml's values: 2 blocks, 2 heads, global batch 4.
Config tiny() {
  return load_config(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/tiny.yaml", {});
}

}  // namespace

TEST_CASE("enumeration: the count of layouts equals a hand count", "[planner]") {
  const Config c = tiny();  // n_layer 2, n_head 2, d_model 32, global_batch 4
  // world 1: micro_batch 1, 2, 4 x schedules 1f1b, gpipe, zb1 (interleaved needs pp >= 2), less gpipe where the
  // micro-batch is the whole batch (one micro-batch: 1f1b's run), zero 0 only: with one dp x cp replica ZeRO shards
  // nothing.
  CHECK(enumerate_layouts(c, 1).size() == 3 * 3 - 1);
  // Below, each mesh with dp x cp > 1 counts zero 0 to 3 (x 4), every other zero 0 alone; each micro-batch size
  // that makes one micro-batch per replica has no gpipe row (- 1).
  // world 2: dp2 (mb 1, 2: 2 x 3 - 1 = 5), cp2 (seq_len 16 in 4 chunks; mb 1, 2, 4: 8); tp2 (mb 1, 2, 4: 8), pp2
  // (1f1b, gpipe, zb1 at mb 1, 2, 4: 8, plus interleaved v1 where m = 4/mb is a multiple of 2, mb 1, 2: 2; v2 needs
  // 4 stages of 2 blocks: none).
  CHECK(enumerate_layouts(c, 2).size() == 4 * (5 + 8) + (8 + 8 + 2));
  // world 4: dp4 (mb 1: 2), dp2 x tp2 (mb 1, 2: 5), dp2 x pp2 (mb 1, 2: 5, interleaved v1 at mb 1: 1), with cp:
  // dp2 x cp2 (as dp2 x tp2: 5), cp2 x tp2 (8), cp2 x pp2 (as tp2 x pp2: 10), cp4 (8 chunks of 2 tokens: 8); and
  // tp2 x pp2 (mb 1, 2, 4: 8, interleaved v1 at mb 1, 2: 2). tp4 (n_head 2) and pp4 (2 blocks) are invalid.
  CHECK(enumerate_layouts(c, 4).size() == 4 * (2 + 5 + 6 + 5 + 8 + 10 + 8) + 10);
  // optim.zero_reduce=step is ZeRO-2's alone: the trainer refuses it with ZeRO-3, so the planner lists no ZeRO-3.
  Config step = c;
  step.optim.zero_reduce = ZeroReduce::Step;
  CHECK(enumerate_layouts(step, 2).size() == 3 * (5 + 8) + (8 + 8 + 2));
  // seq_len 12 cuts into 4 chunks but not 8: cp2 is listed on 4 ranks, cp4 is not.
  Config twelve = c;
  twelve.model.seq_len = 12;
  int cp2 = 0, cp4 = 0;
  for (const Layout& l : enumerate_layouts(twelve, 4)) cp2 += l.cp == 2, cp4 += l.cp == 4;
  CHECK(cp2 == 4 * (5 + 8 + 10));
  CHECK(cp4 == 0);
  // world 3: dp3 does not divide global_batch 4, tp3 not n_head 2, pp3 exceeds 2 blocks.
  CHECK(enumerate_layouts(c, 3).empty());
  CHECK_THROWS_AS(enumerate_layouts(c, 0), InputError);
}

TEST_CASE("enumeration: every listed layout validates and none is missing", "[planner]") {
  Config c = tiny();
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.train.global_batch = 8;
  for (int world : {1, 2, 4, 6, 8}) {
    const std::vector<Layout> listed = enumerate_layouts(c, world);
    const std::set<Layout> got(listed.begin(), listed.end());
    CHECK(got.size() == listed.size());  // no duplicates
    CHECK(std::is_sorted(listed.begin(), listed.end()));
    // A superset of candidates: every size up to world whose product is world (validate requires it), every
    // schedule, v up to n_layer + 1, every micro-batch up to global_batch + 1, and ZeRO 0 to 3 (0 alone without
    // dp x cp replicas to shard over). A ZeRO stage only adds refusals (compression, local SGD, staleness,
    // comm.adapt: none set here), so the stages above 0 are tried where ZeRO 0 validates.
    std::set<Layout> want;
    auto valid = [&](const Layout& l) {
      try {
        validate(apply_layout(c, l), world);
      } catch (const InputError&) {
        return false;
      }
      return true;
    };
    for (int dp = 1; dp <= world; ++dp)
      for (int tp = 1; tp <= world; ++tp)
        for (int pp = 1; pp <= world; ++pp)
        for (int cp = 1; cp <= world; ++cp)
          if (dp * tp * pp * cp == world)
          for (const PipelineSchedule s : layout_schedules())
            for (int v = 1; v <= c.model.n_layer + 1; ++v)
              for (int mb = 1; mb <= c.train.global_batch + 1; ++mb) {
                Layout l{dp, tp, pp, s, v, mb, 0, cp};
                if (!valid(l)) continue;
                if (s == PipelineSchedule::GPipe && micro_batches(c, l) == 1) continue;  // 1f1b's run (listed so)
                for (l.zero = 0; l.zero <= (dp * cp > 1 ? 3 : 0); ++l.zero)
                  if (valid(l)) want.insert(l);
              }
    INFO("world " << world);
    CHECK(got == want);
    CHECK(listed.empty() == (world == 6));  // 6 = 2 x 3: no size divides into 4 heads, 4 blocks and batch 8
  }
}

TEST_CASE("activation and scratch bytes, counted, equal the model's arena allocations", "[planner]") {
  struct Case {
    int tp;
    bool sp;
    int begin, end, n_layer;
    DType dt;
    bool split;
    int B;
  };
  const Case cases[] = {
      {1, false, 0, 2, 2, DType::F32, false, 2},  {1, false, 0, 1, 3, DType::F32, true, 3},
      {1, false, 1, 2, 3, DType::BF16, false, 2}, {1, false, 2, 3, 3, DType::F32, true, 1},
      {2, false, 0, 2, 2, DType::F32, false, 2},  {2, true, 0, 1, 2, DType::F32, true, 2},
      {2, true, 1, 2, 2, DType::F16, false, 4},   {4, true, 1, 3, 4, DType::BF16, true, 2},
      {4, false, 1, 2, 3, DType::F32, true, 1},
  };
  for (const Case& k : cases)
  for (const ModelArch arch : {ModelArch::GPT2, ModelArch::Llama})
  for (const Recompute rc : {Recompute::None, Recompute::Light, Recompute::Selective, Recompute::Full})
  for (const int cp : {1, 2}) {  // cp 2: a rank's half of each sequence, the ring's record
    if (rc == Recompute::Full && k.split) continue;  // refused (config validation)
    GPTConfig g;
    g.arch = arch;
    g.recompute = rc;
    g.n_layer = k.n_layer;
    g.n_head = 4;
    g.d_model = 32;
    g.seq_len = 8;
    g.vocab_size = 70;  // padded per tp
    if (arch == ModelArch::Llama) {
      g.n_kv_head = 2;  // grouped-query attention; at tp 4 each kv head on two ranks
      g.ffn_hidden = 40;
    }
    const StageConfig stage{g, {BlockSlice{k.begin, k.end}, {k.tp, 0, k.sp}}};
    INFO(fmt::format("{} recompute {}: tp {} sp {} stage [{}, {}) of {} {} split {} B {} cp {}", name_of(arch),
                     name_of(rc), k.tp, k.sp, k.begin, k.end, k.n_layer, dtype_name(k.dt), k.split, k.B, cp));
    GPT model(g, stage.part, k.dt);
    NullCommunicator null(k.tp, 0), cp_null(cp, 0);
    if (k.tp > 1) model.set_tp_comm(&null);
    if (cp > 1) model.set_cp_comm(&cp_null);
    const int T = g.seq_len / cp;
    Arena rec, scratch;
    Activations a = model.alloc_activations(rec, k.B, T, k.split);
    Tensor dinput;
    if (!model.first_stage()) dinput = rec.alloc(a.input().shape(), k.dt);  // as PipelineRunner::acquire
    CHECK(int64_t(rec.high_water_bytes()) == record_bytes(stage, k.B, T, k.dt, k.split, cp));
    CHECK(recv_buffer_bytes(stage, k.B, T, k.dt) == arena_bytes(a.input().numel(), k.dt));
    // One backward pass's scratch (values are irrelevant; tokens must be in range).
    for (int64_t i = 0; i < a.tokens.numel(); ++i) {
      a.tokens.data_as<int32_t>()[i] = int32_t(i % g.vocab_size);
      a.targets.data_as<int32_t>()[i] = int32_t((i + 1) % g.vocab_size);
    }
    Tensor dout, loss = Tensor::zeros({1}, DType::F32);
    if (!model.last_stage()) dout = Tensor::zeros(a.output().shape(), k.dt);
    // What the passes allocate beyond records and scratch for their time (the ring's temporaries under cp; nothing
    // with cp 1): the planner's attention_temp_bytes, the larger of the two passes'.
    const int64_t held = int64_t(host_tensor_bytes());
    reset_peak_host_tensor_bytes();
    model.forward(a, model.last_stage() ? 1.0 : 0.0, model.last_stage() ? loss : Tensor());
    const int64_t forward_temp = int64_t(peak_host_tensor_bytes()) - held;
    reset_peak_host_tensor_bytes();
    model.backward(a, scratch, {}, k.split ? BackwardPart::InputOnly : BackwardPart::All, dout, dinput);
    const int64_t backward_temp = int64_t(peak_host_tensor_bytes()) - held - int64_t(scratch.high_water_bytes());
    CHECK(int64_t(scratch.high_water_bytes()) == backward_scratch_bytes(stage, k.B, T, k.dt, k.split, cp));
    CHECK(std::max(forward_temp, backward_temp) == attention_temp_bytes(stage, k.B, T, k.dt, cp));
    CHECK((cp == 1) == (attention_temp_bytes(stage, k.B, T, k.dt, cp) == 0));
  }
}

namespace {
std::vector<TpOp> sorted(std::vector<TpOp> ops) {
  std::sort(ops.begin(), ops.end());
  return ops;
}
}  // namespace

// The planner's tp traffic is what the calibration counted while it timed the passes. Checked against the passes of
// the whole stage counted directly: the calibration times two of its three blocks and adds a middle block's
// collectives for the third, and the file it writes gives the same lists back.
TEST_CASE("tp traffic: the calibration's count of the passes' collectives, extrapolated and saved", "[planner]") {
  const std::string file = test::tmp_path("planner", "calibration_traffic.txt");
  for (const ModelArch arch : {ModelArch::GPT2, ModelArch::Llama})
  for (const bool sp : {false, true})
  for (const bool split : {false, true})
  for (const Recompute rc : {Recompute::None, Recompute::Full}) {
    if (rc == Recompute::Full && split) continue;  // refused (config validation)
    INFO(fmt::format("{} sp {} split {} recompute {}", name_of(arch), sp, split, name_of(rc)));
    ModelConfig m;
    m.arch = arch;
    m.n_layer = 3;
    m.n_head = 4;
    m.n_kv_head = arch == ModelArch::Llama ? 1 : 0;  // one kv head over tp 2: its gradient copies summed
    m.ffn_hidden = 40;
    m.d_model = 32;
    m.seq_len = 8;
    m.vocab_size = 70;
    StageShape s;
    s.blocks = 3;
    s.B = 2;
    s.tp = 2;
    s.sp = sp;
    s.split = split;
    s.recompute = rc;
    CalibrationOptions opts;
    opts.reps = 1;
    opts.max_timed_blocks = 2;
    Calibration cal(m, opts);
    const TpTraffic t = cal.traffic(s);

    GPTConfig g = gpt_config(m);
    g.recompute = rc;
    GPT model(g, ModelPart{BlockSlice{}, {2, 0, sp}}, DType::F32);
    model.init(1, 0.02);
    CountingCommunicator tp(2, 0);
    model.set_tp_comm(&tp);
    Arena rec, scratch;
    Activations a = model.alloc_activations(rec, s.B, g.seq_len, split);
    for (int64_t i = 0; i < a.tokens.numel(); ++i) {
      a.tokens.data_as<int32_t>()[i] = int32_t(i % m.vocab_size);
      a.targets.data_as<int32_t>()[i] = int32_t((i + 1) % m.vocab_size);
    }
    model.forward(a, 1.0, Tensor::zeros({1}, DType::F32));
    CHECK(sorted(tp.ops) == sorted(t.fwd));
    tp.ops.clear();
    model.backward(a, scratch, {}, split ? BackwardPart::InputOnly : BackwardPart::All);
    CHECK(sorted(tp.ops) == sorted(split ? t.bwd_input : t.bwd));
    CHECK((split ? t.bwd : t.bwd_input).empty());
    tp.ops.clear();
    if (split) model.backward_weights(a);
    CHECK(sorted(tp.ops) == sorted(t.bwd_weight));

    cal.save(file);
    Calibration loaded(m, opts);
    CHECK(loaded.load(file) > 0);
    const TpTraffic& back = loaded.traffic(s);
    CHECK((back.fwd == t.fwd && back.bwd == t.bwd && back.bwd_input == t.bwd_input && back.bwd_weight == t.bwd_weight));
    CHECK(loaded.measurements() == 0);  // nothing measured again
    // Another round times the shapes measured here (the timed 2 blocks and the middle stage), not loaded ones, and
    // keeps the traffic; a slicing measured for 4 ranks is saved and read back.
    CHECK(loaded.retime() == 0);
    CHECK(cal.retime() == 2);
    CHECK(cal.measurements() == 4);
    const TpTraffic& again = cal.traffic(s);
    CHECK((again.fwd == t.fwd && again.bwd == t.bwd && again.bwd_weight == t.bwd_weight));
    CHECK(cal.stage(s).fwd > 0);
    cal.set_slicing(4, 0.125);
    cal.save(file);
    Calibration reloaded(m, opts);
    reloaded.load(file);
    CHECK(reloaded.slicing(4) == Approx(0.125));
    CHECK(reloaded.slicing(8) == -1);
  }
}

TEST_CASE("ZeRO-3 gathers: the mirror gathers what ShardedParams gathers in the model's passes", "[planner]") {
  // The step model charges each pass the gathers plan/param_gathers.h predicts. Here a real store (over a
  // do-nothing communicator of 2 ranks) sits behind the model's passes and counts what it issues, pass by pass,
  // over two steps of two micro-batches: every kind of stage, both backward splits, the weight pass reading (light
  // recomputation) or not, tied and untied heads, both parallel.reshard_after_forward settings, and whole-block or
  // sub-block units (optim.zero_unit; the store following the reads, the mirror one request per unit).
  struct Case {
    ModelArch arch;
    bool tied;
    int begin, end, n_layer;
    bool split;
    Recompute rc;
  };
  const Case cases[] = {
      {ModelArch::GPT2, true, 0, 3, 3, false, Recompute::None},    // one stage: the tied embedding pinned
      {ModelArch::GPT2, true, 0, 2, 4, false, Recompute::None},    // a first stage
      {ModelArch::GPT2, true, 1, 3, 4, false, Recompute::None},    // a middle stage: blocks only
      {ModelArch::GPT2, true, 2, 4, 4, true, Recompute::Light},    // a last stage with the tied head; W reads
      {ModelArch::GPT2, true, 0, 2, 2, true, Recompute::None},     // split, the weight pass reading nothing
      {ModelArch::Llama, false, 0, 2, 3, false, Recompute::None},  // untied first stage: the embedding unpinned
      {ModelArch::Llama, false, 1, 3, 3, true, Recompute::Light},  // untied last stage: the head in the first unit
      {ModelArch::Llama, true, 0, 2, 2, false, Recompute::Full},   // tied, one stage
  };
  // Resharding with a ring of its own or shared with the gradients (written over the parameters), and keeping
  // every unit.
  enum Mode { Keep, OwnRing, SharedRing };
  for (const Case& k : cases)
    for (const Mode mode : {OwnRing, SharedRing, Keep})
      for (const bool sublayers : {false, true}) {  // optim.zero_unit: block, sublayer (read-driven)
        // The trainer refuses sub-block units with recomputation that reads parameters, and with zb1's split.
        if (sublayers && (k.split || k.rc == Recompute::Light || k.rc == Recompute::Full)) continue;
        const bool reshard = mode != Keep, shared = mode == SharedRing;
        GPTConfig g;
        g.arch = k.arch;
        g.tie_embeddings = k.tied;
        g.recompute = k.rc;
        g.n_layer = k.n_layer;
        g.n_head = 2;
        g.d_model = 16;
        g.seq_len = 8;
        g.vocab_size = 40;
        if (k.arch == ModelArch::Llama) {
          g.n_kv_head = 1;
          g.ffn_hidden = 24;
        }
        INFO(fmt::format("{} tied {} stage [{}, {}) of {} split {} recompute {} reshard {} shared ring {} sublayers {}",
                         name_of(k.arch), k.tied, k.begin, k.end, k.n_layer, k.split, name_of(k.rc), reshard, shared,
                         sublayers));
        const StageConfig stage{g, {BlockSlice{k.begin, k.end}, {}}};
        GPT model(g, stage.part, DType::F32);
        const ParamTable& t = model.table();
        // chunk_param_units: the embedding pinned where it holds the tied head, every unit without resharding.
        const bool embedding = t.index_of(k.arch == ModelArch::Llama ? "model.embed_tokens.weight" : "wte.weight") >= 0;
        const std::vector<GradUnit> units = grad_units(t, g.tied() && embedding, !reshard, sublayers);
        NullCommunicator dp(2, 0);
        // A ring shared with the gradients is never used under the split backward (sharded_grads_options).
        if (shared && k.split) continue;
        const Tensor ring = shared ? Tensor::zeros({2 * ring_slot_numel(units)}, DType::F32) : Tensor();
        const std::vector<Bucket> buckets = unit_buckets(t, units, 4, 4.0 * 200);
        ShardedParams store(dp, t, units, buckets, DType::F32, Device::CPU, {}, ring);
        model.set_param_views(store.param_views());
        model.set_param_read_hook(store.reader());  // the trainer's: reads wait bucket by bucket
        if (sublayers) store.set_read_driven();
        if (shared) {  // the ring units' gradients written over their parameters, the pinned units' apart
          std::vector<Tensor> grads = store.param_views();
          for (int p = 0; p < t.size(); ++p) {
            size_t u = 0;
            while (t[p].offset >= units[u].end) ++u;
            if (units[u].pinned) grads[p] = model.grads().slice(t[p].offset, t[p].shape);
          }
          model.set_grad_views(grads);
          model.set_grads_over_params(true);
        }
        // Each unit's gather takes 1 us, spread over its buckets; `whole` is the same store waiting unit by unit.
        std::vector<std::vector<GatherBucket>> per_unit(units.size());
        for (const Bucket& b : buckets) {
          size_t u = 0;
          while (b.begin >= units[u].end) ++u;
          per_unit[u].push_back({b.begin, b.end, 1.0 * double(b.numel()) / double(units[u].end - units[u].begin)});
        }
        ChunkParamGathers mirror(stage, t, units, std::vector<double>(units.size(), 1.0), 4, shared, {}, per_unit,
                                 sublayers);
        ChunkParamGathers whole(stage, t, units, std::vector<double>(units.size(), 1.0), 4, shared, {}, {}, sublayers);
        double waited = 0, waited_whole = 0;  // the forward passes' waits
        Arena rec, scratch;
        Activations a = model.alloc_activations(rec, 1, g.seq_len, k.split);
        for (int64_t i = 0; i < a.tokens.numel(); ++i) {
          a.tokens.data_as<int32_t>()[i] = int32_t(i % g.vocab_size);
          a.targets.data_as<int32_t>()[i] = int32_t((i + 1) % g.vocab_size);
        }
        Tensor dout, dinput, loss = Tensor::zeros({1}, DType::F32);
        if (!model.last_stage()) dout = Tensor::zeros(a.output().shape(), DType::F32);
        if (!model.first_stage()) dinput = rec.alloc(a.input().shape(), DType::F32);
        const auto need = [&](int64_t lo, int64_t hi) { store.backward_needs(lo, hi); };
        int64_t step_gathers = 0, early = 0;  // early: issued by prefetch_forward_start, counted in the next pass
        auto pass = [&](ActionKind kind, const std::function<void()>& run) {
          const int64_t issued = store.gathers_issued() - early, missed = store.gathers_not_prefetched();
          const int64_t early_pass = early;  // the mirror issues them at the pass's start
          early = 0;
          store.begin_pass(kind == ActionKind::Forward ? PassOrder::Forward : PassOrder::Backward);
          run();
          const PassGathers p = mirror.pass(kind, 100.0), w = whole.pass(kind, 100.0);
          INFO(action_kind_name(kind));
          CHECK(p.units == w.units);  // the same gathers; a pass waits less, or as long
          CHECK(p.wait_us <= w.wait_us + 1e-9);
          waited += p.wait_us, waited_whole += w.wait_us;
          if (early_pass) CHECK(std::count(p.issued.begin(), p.issued.end(), 0.0) >= early_pass);
          CHECK(store.gathers_issued() - issued == int64_t(p.units.size()));
          CHECK(store.gathers_not_prefetched() - missed == p.not_prefetched);
          step_gathers += int64_t(p.units.size());
        };
        for (int step = 0; step < 2; ++step) {
          store.begin_step();
          mirror.begin_step();
          whole.begin_step();
          step_gathers = 0;
          if (step == 1) {  // the trainer's gathers after the optimizer, for the next step's first forward pass
            const int64_t before = store.gathers_issued();
            store.prefetch_forward_start();
            mirror.prefetch_forward_start(0.0);
            whole.prefetch_forward_start(0.0);
            early = store.gathers_issued() - before;
            // Every unit when the passes keep them all (nothing waits for a ring slot), else the first two.
            CHECK(early == (reshard ? std::min<int64_t>(2, units.size()) : int64_t(units.size())));
          }
          for (int mb = 0; mb < 2; ++mb) {
            pass(ActionKind::Forward, [&] {
              model.forward(a, model.last_stage() ? 1.0 : 0.0, model.last_stage() ? loss : Tensor(),
                            [&](int64_t begin) { store.forward_needs(begin); });
            });
            scratch.reset();
            if (!k.split) {
              pass(ActionKind::Backward,
                   [&] { model.backward(a, scratch, {}, BackwardPart::All, dout, dinput, need); });
              continue;
            }
            pass(ActionKind::BackwardInput,
                 [&] { model.backward(a, scratch, {}, BackwardPart::InputOnly, dout, dinput, need); });
            pass(ActionKind::BackwardWeight, [&] { model.backward_weights(a, {}, need); });
          }
          // Without resharding every unit is gathered once per step, in the first forward pass.
          if (!reshard) CHECK(step_gathers == int64_t(units.size()));
        }
        // The step's first forward pass gathers its first units itself: a unit of several buckets is waited for only
        // as far as each read needs it.
        CHECK(waited < waited_whole);
      }
}

TEST_CASE("record counts per chunk match the schedules' activation bounds", "[planner]") {
  for (int p : {2, 4})
    for (int m : {1, 3, 8}) {
      for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZB1}) {
        const SimResult sim = simulate(schedule_fn(s), p, m, 1);
        for (int r = 0; r < p; ++r) {
          INFO(name_of(s) << " p=" << p << " m=" << m << " rank=" << r);
          const ScheduleUsage u = schedule_usage(s, p, m, 1, r);
          REQUIRE(u.records.size() == 1);
          CHECK(u.records[0] == sim.ranks[r].peak_held);
          // Receives: activations for every micro-batch past stage 0, gradients for every one before the last.
          CHECK(u.recv_actions == (r > 0 ? m : 0) + (r < p - 1 ? m : 0));
          CHECK(u.eval_recvs == (r > 0 ? m : 0));
        }
      }
    }
  // Interleaved, p = 2, v = 2: a pool per chunk, 6 and 4 records in all (docs/performance.md, pipeline section).
  for (int m : {4, 8}) {
    const ScheduleUsage u0 = schedule_usage(PipelineSchedule::Interleaved, 2, m, 2, 0),
                        u1 = schedule_usage(PipelineSchedule::Interleaved, 2, m, 2, 1);
    CHECK(u0.records[0] + u0.records[1] == 6);
    CHECK(u1.records[0] + u1.records[1] == 4);
    CHECK(u0.eval_recvs == m);      // chunk 1 of rank 0 is stage 2
    CHECK(u1.eval_recvs == 2 * m);  // stages 1 and 3
  }
  // One stage: every schedule's list on p = 1.
  CHECK(schedule_usage(PipelineSchedule::OneFOneB, 1, 4, 1, 0).records[0] == 1);
  CHECK(schedule_usage(PipelineSchedule::GPipe, 1, 4, 1, 0).records[0] == 4);
  CHECK(schedule_usage(PipelineSchedule::OneFOneB, 1, 4, 1, 0).recv_actions == 0);
}

TEST_CASE("timeline: unit costs and free messages give the schedule simulator's makespan", "[planner]") {
  // With F = 1, B = 2 (zb1: B = W = 1), no collectives, instant messages and a core per rank, the timeline is
  // exactly parallel/schedule.h's simulate(): the same lists run in the same dependency order.
  for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved,
                             PipelineSchedule::ZB1})
    for (int p : {1, 2, 4})
      for (int m : {1, 4, 8}) {
        const int v = s == PipelineSchedule::Interleaved ? 2 : 1;
        if (v > 1 && (p < 2 || m % p)) continue;
        TimelineInput in;
        in.schedule = s;
        in.p = p;
        in.m = m;
        in.v = v;
        ChunkCost unit;
        unit.fwd.work_us = 1;
        unit.bwd.work_us = 2;
        unit.bwd_input.work_us = 1;
        unit.bwd_weight.work_us = 1;
        in.chunks.assign(p, std::vector<ChunkCost>(v, unit));
        in.xfer_us.assign(p * v - 1, 0.0);
        in.cores = p;
        const std::vector<TimelineRank> t = simulate_timeline(in);
        const SimResult sim = simulate(schedule_fn(s), p, m, v);
        double end = 0;
        for (int r = 0; r < p; ++r) {
          end = std::max(end, t[r].list_end);
          INFO(name_of(s) << " p=" << p << " m=" << m << " rank " << r);
          CHECK(t[r].busy == Approx(sim.ranks[r].busy).margin(1e-9));
        }
        INFO(name_of(s) << " p=" << p << " m=" << m);
        CHECK(end == Approx(sim.makespan).margin(1e-9));
      }
}

TEST_CASE("timeline: ranks beyond the cores share them", "[planner]") {
  TimelineInput in;
  in.schedule = PipelineSchedule::OneFOneB;
  in.p = 1;
  in.m = 2;
  ChunkCost c;
  c.fwd = {10, 0};
  c.bwd = {20, 5};  // 5 us of a blocking collective in each backward
  in.chunks = {{c}};
  in.ranks_per_stage = 4;  // dp 4
  in.threads = 1;
  in.cores = 2;
  std::vector<TimelineRank> t = simulate_timeline(in);
  // 4 ranks want a core each on 2 cores, computing or spinning in a collective: speed 1/2, so a forward lasts
  // 20 us and a backward 40 + 5 us.
  CHECK(t[0].list_end == Approx(2 * (20 + 45)));
  CHECK(t[0].tp_wait == Approx(10));
  // 2 compute threads per rank while computing, 1 spinning while waiting, on 4 cores. Forward: 8 threads, speed
  // 1/2, 20 us. Backward: on average (2 * 20/r + 5) / (20/r + 5) threads per rank, so r = 4 / (4 * that), i.e.
  // r^2 + 7 r - 4 = 0, r = (sqrt(65) - 7) / 2, lasting 20/r + 5.
  in.threads = 2;
  in.cores = 4;
  t = simulate_timeline(in);
  const double r = (std::sqrt(65.0) - 7) / 2;
  CHECK(t[0].list_end == Approx(2 * (20 + 20 / r + 5)));
  in.cores = 8;  // a core per thread: full speed
  t = simulate_timeline(in);
  CHECK(t[0].list_end == Approx(2 * (30 + 5)));
  // Polling communication threads take their share: 4 ranks x 1 thread + 4 x 0.5 on 4 cores: speed 2/3.
  in.threads = 1;
  in.cores = 4;
  in.poll_share = {0.5};
  c.bwd = {20, 0};
  in.chunks = {{c}};
  t = simulate_timeline(in);
  CHECK(t[0].list_end == Approx(2 * 30 * 1.5));
  in.poll_share = {};
  c.bwd = {20, 5};
  // Two stages, one message of 7 us between them: stage 1 starts its forward at 10 + 7.
  in.threads = 1;
  in.p = 2;
  in.cores = 100;
  in.ranks_per_stage = 1;
  in.m = 1;
  in.chunks = {{c}, {c}};
  in.xfer_us = {7};
  t = simulate_timeline(in);
  CHECK(t[1].list_end == Approx(10 + 7 + 10 + 25));
  CHECK(t[0].list_end == Approx(10 + 7 + 10 + 25 + 7 + 25));
  CHECK(shared_rate(3, 2, 4) == Approx(4.0 / 6));
  CHECK(shared_rate(1, 8, 2) == Approx(1.0));  // one rank's own oversubscription is in its measured time
  // Taking turns costs `slicing` more time per thread beyond one per core, and nothing while the threads fit.
  CHECK(shared_rate(4, 1, 2, 0, 0.2) == Approx(0.5 / 1.2));
  CHECK(shared_rate(8, 1, 2, 0, 0.2) == Approx(0.25 / 1.6));
  CHECK(shared_rate(2, 1, 2, 0, 0.2) == Approx(1.0));
}

TEST_CASE("timeline: a blocking collective's copies run inside its emulated link", "[planner]") {
  // 4 ranks of one thread on 2 cores: speed 1/2. A backward of 20 us of compute with one collective whose emulated
  // link takes 30 us: the pass lasts 40 us of compute plus what the link takes beyond its copies at that speed.
  TimelineInput in;
  in.p = 1;
  in.m = 1;
  in.ranks_per_stage = 4;
  in.cores = 2;
  auto backward_us = [&](double copies_us) {
    const PassCost coll = blocking_collective(30, copies_us, 0.5);
    ChunkCost c;
    c.fwd = {10, 0};
    c.bwd = {20 + coll.work_us, coll.wall_us};
    in.chunks = {{c}};
    return simulate_timeline(in)[0].list_end - 20;
  };
  CHECK(backward_us(0) == Approx(40 + 30));
  CHECK(backward_us(5) == Approx(40 + 30));   // 10 us of copies at half speed: inside the link's 30
  CHECK(backward_us(20) == Approx(40 + 40));  // 40 us of copies: longer than the link, which then adds nothing
  CHECK(blocking_collective(30, 20, 1).wall_us == Approx(10));
}

TEST_CASE("timeline: a rank blocked on a message waits to be woken while the others take the cores",
          "[planner]") {
  // GPipe on 2 stages of 1 rank, 2 micro-batches, one core: F = 10, B = 20, messages of 7 us, waking 50 us.
  TimelineInput in;
  in.schedule = PipelineSchedule::GPipe;
  in.p = 2;
  in.m = 2;
  ChunkCost c;
  c.fwd = {10, 0};
  c.bwd = {20, 0};
  in.chunks = {{c}, {c}};
  in.xfer_us = {7};
  in.cores = 1;
  in.wake_us = 50;
  std::vector<TimelineRank> t = simulate_timeline(in);
  // Stage 1's first activation arrives at 17 while stage 0 computes its second forward (10-20): stage 1 is woken
  // at 67. Its second activation (arrived at 27) is there when it asks: no charge. Its forwards and backwards run
  // 67-127, alone on the core; its first gradient arrives at 114 while it computes, so stage 0 is woken at 164;
  // the second (134) is there when asked. Nothing ever shares the core.
  CHECK(t[1].list_end == Approx(127));
  CHECK(t[0].list_end == Approx(204));
  // A core each: nobody takes the receiver's core, so waking costs nothing and the timeline is as without it.
  in.cores = 2;
  t = simulate_timeline(in);
  const double with_cores = t[0].list_end;
  in.wake_us = 0;
  t = simulate_timeline(in);
  CHECK(with_cores == Approx(t[0].list_end));
  CHECK(t[0].list_end == Approx(104));  // stage 1: 17-77; its gradients arrive at 64 and 84; stage 0's B: 64-104
}

TEST_CASE("neighbours: the other ranks that compute at once on cores of their own", "[planner]") {
  CHECK(plan::neighbour_count(4, 1, 2) == 1);   // 4 ranks on 2 cores: 2 compute at any moment
  CHECK(plan::neighbour_count(8, 1, 2) == 1);
  CHECK(plan::neighbour_count(2, 1, 2) == 1);
  CHECK(plan::neighbour_count(1, 2, 2) == 0);   // one rank: alone
  CHECK(plan::neighbour_count(2, 1, 1) == 0);   // one core: the ranks take turns, never at once
  CHECK(plan::neighbour_count(4, 4, 16) == 3);
  CHECK(plan::neighbour_count(2, 8, 16) == 1);
  CHECK(plan::neighbour_count(8, 3, 16) == 4);  // 16 / 3: 5 ranks at once
  CHECK(plan::neighbour_count(2, 4, 2) == 0);   // threads beyond the cores: still one rank at a time
}

TEST_CASE("a layout applies its keys and describes itself", "[planner]") {
  const Config c = tiny();
  const Layout l{2, 1, 2, PipelineSchedule::Interleaved, 1, 1, 1};
  const Config a = apply_layout(c, l);
  CHECK(a.parallel.dp == 2);
  CHECK(a.parallel.pp == 2);
  CHECK(a.parallel.schedule == PipelineSchedule::Interleaved);
  CHECK(a.train.micro_batch == 1);
  CHECK(a.optim.zero == 1);
  CHECK(a.model.n_layer == c.model.n_layer);
  CHECK(describe(l) == "dp2 tp1 pp2 interleaved v1 mb1 zero1");
  const Layout ring{1, 2, 1, PipelineSchedule::OneFOneB, 1, 2, 3, 2};
  CHECK(apply_layout(c, ring).parallel.cp == 2);
  CHECK(apply_layout(c, l).parallel.cp == 1);
  CHECK(describe(ring) == "dp1 cp2 tp2 pp1 1f1b mb2 zero3");
  CHECK(micro_batches(c, l) == 2);
  std::string why;
  CHECK_FALSE(layout_valid(c, Layout{3, 1, 1, PipelineSchedule::OneFOneB, 1, 1, 0}, 3, &why));
  CHECK(why.find("global_batch") != std::string::npos);
}

TEST_CASE("network model: a node's link is shared by the groups that cross it at once", "[planner]") {
  CHECK(node_link_sharers(0, 1) == 1);  // no nodes
  CHECK(node_link_sharers(2, 2) == 1);  // dp 4 over 2 x 2: one group, two of its ranks on each node
  CHECK(node_link_sharers(2, 1) == 2);  // dp 2 across next to tp 2 inside: two groups cross each node's link
  CHECK(node_link_sharers(8, 2) == 4);
  const LinkModel l = shared_link(LinkModel{50, 0.04}, 2);
  CHECK(l.alpha_us == 50);  // the latency is not shared, the bandwidth is
  CHECK(l.beta_us_per_byte == Approx(0.08));

  // 4 ranks, 2 per node (the layouts of bench/bench_network_model.py; order tp-dp-pp).
  Config c = tiny();
  c.comm.emulate.ranks_per_node = 2;
  auto links = [&](int dp, int tp, int pp) {
    Config a = c;
    a.parallel.dp = dp, a.parallel.tp = tp, a.parallel.pp = pp;
    return mesh_links(a, 4);
  };
  const MeshLinks dp4 = links(4, 1, 1), tp2dp2 = links(2, 2, 1), pp2dp2 = links(2, 1, 2);
  CHECK((dp4.dp && dp4.dp_sharers == 1));
  CHECK((!tp2dp2.tp && tp2dp2.dp && tp2dp2.dp_sharers == 2));
  CHECK((!pp2dp2.dp && pp2dp2.pp[0] && pp2dp2.pp_sharers == 2));
  // The planner's cost of the shared dp all-reduce: the bandwidth term doubles, the latency does not.
  c.comm.emulate.inter_latency_us = 100, c.comm.emulate.inter_bandwidth_gbps = 0.025;
  const NetModel net(c, NetOptions{});
  const double alone = net.op_us(CommKind::AllReduce, 1 << 20, 2, true, 1);
  const double shared = net.op_us(CommKind::AllReduce, 1 << 20, 2, true, 2);
  CHECK(shared - alone == Approx(double(1 << 20) * 1e6 / 0.025e9));  // 2 (p-1) n/p beta more, p = 2
}
