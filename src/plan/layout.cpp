// Layouts and their enumeration (see layout.h). Validity is the trainer's own validate(), so the planner can
// never list a layout the trainer refuses, or miss one it accepts within the enumerated ranges.
#include "plan/layout.h"

#include <fmt/format.h>

#include <tuple>

#include "core/errors.h"

namespace mt::plan {

namespace {
auto key(const Layout& l) {
  return std::tie(l.dp, l.tp, l.pp, l.schedule, l.virtual_stages, l.micro_batch, l.zero);
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
  c.parallel.cp = 1;  // the planner's layouts have no context parallelism yet
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
  for (int dp = 1; dp <= world; ++dp) {
    if (world % dp) continue;
    for (int tp = 1; tp <= world / dp; ++tp) {
      if ((world / dp) % tp) continue;
      const int pp = world / dp / tp;
      for (const PipelineSchedule sched : layout_schedules()) {
        const int vmax = sched == PipelineSchedule::Interleaved ? std::max(1, base.model.n_layer) : 1;
        for (int v = 1; v <= vmax; ++v)
          for (int mb = 1; mb <= gb; ++mb) {
            if (gb % mb || (gb / mb) % dp) continue;  // global_batch / (dp * mb) whole
            for (int zero = 0; zero <= 3; ++zero) {
              Layout l{dp, tp, pp, sched, v, mb, zero};
              if (layout_valid(base, l, world)) out.push_back(l);
            }
          }
      }
    }
  }
  return out;
}

std::string describe(const Layout& l) {
  return fmt::format("dp{} tp{} pp{} {}{} mb{} zero{}", l.dp, l.tp, l.pp, name_of(l.schedule),
                     l.schedule == PipelineSchedule::Interleaved ? fmt::format(" v{}", l.virtual_stages) : "",
                     l.micro_batch, l.zero);
}

int micro_batches(const Config& base, const Layout& l) {
  return base.train.global_batch / (l.dp * l.micro_batch);
}

}  // namespace mt::plan
