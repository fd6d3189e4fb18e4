// Layouts and their enumeration (see layout.h). Validity is the trainer's own validate(), so the planner can
// never list a layout the trainer refuses, or miss one it accepts within the enumerated ranges.
#include "plan/layout.h"

#include <fmt/format.h>

#include <array>
#include <tuple>

#include "core/errors.h"

namespace mt::plan {

namespace {
auto key(const Layout& l) {
  return std::tie(l.dp, l.cp, l.tp, l.pp, l.schedule, l.virtual_stages, l.micro_batch, l.zero);
}
}  // namespace

bool Layout::operator==(const Layout& o) const { return key(*this) == key(o); }
bool Layout::operator<(const Layout& o) const { return key(*this) < key(o); }

const std::vector<PipelineSchedule>& layout_schedules() {
  static const std::vector<PipelineSchedule> schedules = {PipelineSchedule::OneFOneB, PipelineSchedule::GPipe,
                                                          PipelineSchedule::Interleaved, PipelineSchedule::ZB1};
  return schedules;
}

Config apply_layout(const Config& base, const Layout& l) {
  Config c = base;
  c.parallel.dp = l.dp;
  c.parallel.tp = l.tp;
  c.parallel.pp = l.pp;
  c.parallel.cp = l.cp;
  c.parallel.schedule = l.schedule;
  c.parallel.virtual_stages = l.virtual_stages;
  c.train.micro_batch = l.micro_batch;
  c.optim.zero = l.zero;
  return c;
}

bool layout_valid(const Config& base, const Layout& l, int world, std::string* why) {
  try {
    validate(apply_layout(base, l), world);
    return true;
  } catch (const InputError& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::vector<Layout> enumerate_layouts(const Config& base, int world) {
  if (world < 1) input_error("--world must be >= 1, got {}", world);
  std::vector<Layout> out;
  const int gb = base.train.global_batch;
  // Every dp x cp x tp x pp = world; cp only where the ring's zigzag split of seq_len into 2 cp chunks is whole.
  std::vector<std::array<int, 4>> meshes;
  for (int dp = 1; dp <= world; ++dp)
    for (int cp = 1; dp * cp <= world; ++cp)
      for (int tp = 1; dp * cp * tp <= world; ++tp)
        if (world % (dp * cp * tp) == 0 && base.model.seq_len % (2 * cp) == 0)
          meshes.push_back({dp, cp, tp, world / (dp * cp * tp)});
  for (const auto& [dp, cp, tp, pp] : meshes)
    for (const PipelineSchedule sched : layout_schedules()) {
      const int vmax = sched == PipelineSchedule::Interleaved ? std::max(1, base.model.n_layer) : 1;
      for (int v = 1; v <= vmax; ++v)
        for (int mb = 1; mb <= gb; ++mb) {
          if (gb % mb || (gb / mb) % dp) continue;  // global_batch / (dp * mb) whole
          // With one micro-batch every rank's gpipe list is its 1f1b list (its forward, then its backward): the same
          // run, listed once, as 1f1b.
          if (sched == PipelineSchedule::GPipe && gb / (dp * mb) == 1) continue;
          // ZeRO shards over the dp x cp replicas: with one replica a stage above 0 shards nothing, yet its
          // gathers and reduce-scatters still run (measured up to 1.35x zero 0's step), so it is never a candidate.
          const int zero_max = dp * cp > 1 ? 3 : 0;
          for (int zero = 0; zero <= zero_max; ++zero) {
            Layout l{dp, tp, pp, sched, v, mb, zero, cp};
            if (layout_valid(base, l, world)) out.push_back(l);
          }
        }
    }
  return out;
}

std::vector<std::string> layout_overrides(const Config& base, const Layout& l, int world) {
  std::vector<std::string> out;
  const ParallelConfig& p = base.parallel;
  int dp = p.dp;
  if (dp == 0 && world % (l.tp * l.pp * l.cp) == 0) dp = world / (l.tp * l.pp * l.cp);  // what dp = 0 gives
  if (dp != l.dp) out.push_back(fmt::format("parallel.dp={}", l.dp));
  if (p.tp != l.tp) out.push_back(fmt::format("parallel.tp={}", l.tp));
  if (p.pp != l.pp) out.push_back(fmt::format("parallel.pp={}", l.pp));
  if (p.cp != l.cp) out.push_back(fmt::format("parallel.cp={}", l.cp));
  if (p.schedule != l.schedule) out.push_back(fmt::format("parallel.schedule={}", name_of(l.schedule)));
  if (p.virtual_stages != l.virtual_stages) out.push_back(fmt::format("parallel.virtual_stages={}", l.virtual_stages));
  if (base.train.micro_batch != l.micro_batch) out.push_back(fmt::format("train.micro_batch={}", l.micro_batch));
  if (base.optim.zero != l.zero) out.push_back(fmt::format("optim.zero={}", l.zero));
  return out;
}

std::string describe(const Layout& l) {
  return fmt::format("dp{}{} tp{} pp{} {}{} mb{} zero{}", l.dp, l.cp > 1 ? fmt::format(" cp{}", l.cp) : "", l.tp,
                     l.pp, name_of(l.schedule),
                     l.schedule == PipelineSchedule::Interleaved ? fmt::format(" v{}", l.virtual_stages) : "",
                     l.micro_batch, l.zero);
}

int micro_batches(const Config& base, const Layout& l) {
  return base.train.global_batch / (l.dp * l.micro_batch);
}

}  // namespace mt::plan
