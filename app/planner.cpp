// build/planner: every valid layout (dp x cp x tp x pp, schedule, virtual stages, micro-batch, ZeRO) of a config on N
// ranks, ranked by predicted step time, with predicted per-rank peak memory. docs/planner.md explains the models.
//   build/planner --config FILE --world N [--set KEY=VALUE]... [--json] [--memory-limit-mb MB] [--top K]
// Exit status: 0 success; 2 a bad flag, config or world size (the message says which); 1 a failure while running.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/errors.h"
#include "core/threads.h"
#include "kernels/cpu/matmul_backend.h"
#include "plan/neighbours.h"
#include "plan/planner.h"
#include "plan/runtime_fit.h"
#include "plan/time_sharing.h"
#include "train/config.h"

namespace {

const char* kUsage =
    "usage: planner --config FILE --world N [--set KEY=VALUE]... [--json] [--memory-limit-mb MB] [--top K]\n"
    "\n"
    "Lists every layout of the config on N ranks that the trainer accepts (parallel.dp/tp/pp, parallel.schedule,\n"
    "parallel.virtual_stages, train.micro_batch, optim.zero 0-3; every other key, parallel.reshard_after_forward\n"
    "included, comes from the config and --set), ranked by predicted step time, with each layout's predicted peak\n"
    "tensor memory per rank (the largest over ranks, as run.dir/memory.json's peak_tensor_bytes counts it). Step\n"
    "times come from timing the model's passes on this machine at each layout's shapes (with the compute threads a\n"
    "rank of the layout gets; ranks beyond the cores share them), the alpha-beta model of comm.emulate for every\n"
    "collective and message, and a simulation of the pipeline schedule. See docs/planner.md.\n"
    "\n"
    "  --config FILE        YAML config (as the trainer's)\n"
    "  --world N            number of ranks (mpirun -np N)\n"
    "  --set KEY=VALUE      override a config key (repeatable; the last one wins)\n"
    "  --json               print a JSON list of objects (dp, cp, tp, pp, schedule, virtual_stages, micro_batch,\n"
    "                       zero, step_ms, tokens_per_s, memory_mb, the time breakdown and memory parts, command and\n"
    "                       sweep_command, mesh_best: the first row of its mesh, as the table shows by default; ZeRO-3\n"
    "                       rows also param_gathers: the unit gathers per step) instead of a table\n"
    "  --memory-limit-mb MB leave out layouts whose predicted peak memory per rank exceeds MB MiB (the table also\n"
    "                       counts the ZeRO-2/3 layouts that optim.zero_unit=sublayer would fit)\n"
    "  --top K              table rows to print (default 20; 0 = all); the JSON always lists all\n"
    "  --every-layout       the table lists every layout; by default only the fastest of each mesh (dp x cp x tp\n"
    "                       x pp), its schedule, micro-batch and ZeRO stage being the finer choice. Each row is\n"
    "                       followed by the trainer command that runs it (the JSON adds that and the sweep point)\n"
    "  --memory-only        skip the time model (no timing runs); layouts in enumeration order\n"
    "  --reps N             timed repetitions per measured shape, at least (the median counts;\n"
    "                       default 5)\n"
    "  --progress-every S   where stderr is not a terminal, a progress line (shapes timed, seconds) each S s of\n"
    "                       timing (default 15; 0: none); on a terminal one line is kept up to date instead\n"
    "  --rounds N           time every shape this many times, in rounds over all shapes, and count each pass's\n"
    "                       median over them (default 3): on a machine whose speed changes over seconds, one\n"
    "                       round makes the shapes timed in a slow moment look slow\n"
    "  --neighbours K|auto  processes that run the same passes on the other cores while the passes are timed, as\n"
    "                       a layout's other ranks do (auto: min(N, cores / threads) - 1; default 0: timed alone;\n"
    "                       an experiment, docs/planner_log.md \"Neighbours\")\n"
    "  --calibration FILE   reuse the timings in FILE (when they are of this model, thread and neighbour count) and\n"
    "                       save them there, so repeated plans agree and skip the timing runs\n"
    "  --overhead-us US     cost of one communication operation beyond the network model (default 10)\n"
    "  --runtime FILE       the eight constants below, and the run-to-run spread, as scripts/validate_planner.py\n"
    "                       --fit saved them for this machine (the flags below still override them)\n"
    "  The communication runtime's costs beyond the network (the defaults are an older fit on other 2-core VMs;\n"
    "  without --runtime the planner says so on stderr):\n"
    "  --p2p-latency-us US  extra delay of a pipeline message (default 2000)\n"
    "  --p2p-wake-us US     what a rank blocked on a pipeline message waits beyond its arrival when the other\n"
    "                       ranks' compute threads take every core (default 0)\n"
    "  --llc-mb MB          the last-level cache the ranks share (default: the machine's, from\n"
    "                       /sys/devices/system/cpu/cpu0/cache): where ranks x threads exceed the cores, the passes\n"
    "                       are also timed with cold caches, and each pays its cold extra by the share of the\n"
    "                       ranks' memory beyond the cache (0 = none)\n"
    "  --poll-share S       core share a pipeline rank's communication thread takes from its compute (default 0.15)\n"
    "  --sync-latency-us US extra wait per collective or message in the pipeline phase when ranks x threads\n"
    "                       exceed the cores, charged per thread per core (ranks x threads / cores; default 75)\n"
    "  --step-sync-us US    the same for the step's collectives between its phases, where pp or cp chain the ranks\n"
    "                       (default 1000; and log2(replicas) / 2 times per micro-batch of ZeRO-2/3's ring)\n"
    "  --ring-sync-us US    the same for each message of the context-parallel ring (default 200)\n"
    "  --comm-cpu-op-us US  CPU time a data-parallel or tensor-parallel collective costs its communication\n"
    "                       thread, which the ranks' compute loses when they fill the cores (default 80; a\n"
    "                       data-parallel one's times sqrt(threads per core) where they take turns on them)\n"
    "  --comm-cpu-ns-per-byte NS  the same per byte the collective's ring moves per rank (default 0.7)\n"
    "  --time-slicing S     what taking turns on a core costs beyond the share, per thread beyond one per core\n"
    "                       (default: measured once when ranks x threads exceed the cores, by N processes running\n"
    "                       the passes at once against one alone, or 1 + K with --neighbours K, and kept in\n"
    "                       --calibration's file; 0 = none)\n"

    "  --verbose            print every timing measurement to stderr\n"
    "  --help, -h           this text\n"
    "Exit status: 0 success, 2 a bad flag, config or world size, 1 a failure while running.\n";

struct Args {
  std::string config, runtime;
  int world = 0;
  std::vector<std::string> sets;
  bool json = false, memory_only = false, verbose = false, help = false, every_layout = false;
  double memory_limit_mb = 0;
  mt::plan::NetOptions net;
  // The runtime constants given as flags (they override --runtime's).
  std::optional<double> p2p_latency_us, p2p_wake_us, poll_share, sync_latency_us, step_sync_us;
  std::optional<double> ring_sync_us;
  std::optional<double> comm_cpu_op_us, comm_cpu_ns_per_byte;
  std::optional<double> time_slicing, llc_mb;
  std::string calibration;
  int top = 20, reps = 5, rounds = 3;
  double progress_every_s = 15;
  int time_sharing_child = 0;  // > 0: run as the time-sharing probe's child at this micro-batch (time_sharing.h)
  bool neighbour_child = false;  // run as one of the calibration's neighbours (neighbours.h)
  int neighbours = 0;  // -1: auto
};

long long parse_int(const std::string& flag, const std::string& v, long long lo) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > 1 << 30)
    mt::input_error("{} expects an integer >= {}, got '{}'", flag, lo, v);
  return x;
}

double parse_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x >= 0) || x > 1e15)
    mt::input_error("{} expects a number >= 0, got '{}'", flag, v);
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  bool have_world = false;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i], value;
    const size_t eq = f.find('=');
    const bool inline_value = f.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = f.substr(eq + 1);
      f = f.substr(0, eq);
    }
    auto next = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) mt::input_error("{} needs a value\n{}", f, kUsage);
      return argv[++i];
    };
    if (f == "--help" || f == "-h") a.help = true;
    else if (f == "--config") a.config = next();
    else if (f == "--world") a.world = int(parse_int("--world", next(), 1)), have_world = true;
    else if (f == "--set") {
      const std::string s = next();
      if (s.find('=') == std::string::npos || s[0] == '=') mt::input_error("--set expects KEY=VALUE, got '{}'", s);
      a.sets.push_back(s);
    } else if (f == "--json") a.json = true;
    else if (f == "--memory-only") a.memory_only = true;
    else if (f == "--every-layout") a.every_layout = true;
    else if (f == "--verbose") a.verbose = true;
    else if (f == "--memory-limit-mb") a.memory_limit_mb = parse_double("--memory-limit-mb", next());
    else if (f == "--top") a.top = int(parse_int("--top", next(), 0));
    else if (f == "--reps") a.reps = int(parse_int("--reps", next(), 1));
    else if (f == "--progress-every") a.progress_every_s = parse_double(f, next());
    else if (f == "--rounds") a.rounds = int(parse_int("--rounds", next(), 1));
    else if (f == "--overhead-us") a.net.op_overhead_us = parse_double("--overhead-us", next());
    else if (f == "--p2p-latency-us") a.p2p_latency_us = parse_double("--p2p-latency-us", next());
    else if (f == "--p2p-wake-us") a.p2p_wake_us = parse_double("--p2p-wake-us", next());
    else if (f == "--llc-mb") a.llc_mb = parse_double(f, next());
    else if (f == "--poll-share") a.poll_share = parse_double("--poll-share", next());
    else if (f == "--sync-latency-us") a.sync_latency_us = parse_double("--sync-latency-us", next());
    else if (f == "--step-sync-us") a.step_sync_us = parse_double("--step-sync-us", next());
    else if (f == "--ring-sync-us") a.ring_sync_us = parse_double("--ring-sync-us", next());
    else if (f == "--comm-cpu-op-us") a.comm_cpu_op_us = parse_double("--comm-cpu-op-us", next());
    else if (f == "--comm-cpu-ns-per-byte") a.comm_cpu_ns_per_byte = parse_double("--comm-cpu-ns-per-byte", next());
    else if (f == "--time-slicing") a.time_slicing = parse_double("--time-slicing", next());
    else if (f == "--time-sharing-child") a.time_sharing_child = int(parse_int(f, next(), 1));
    else if (f == "--neighbour-child") a.neighbour_child = true;
    else if (f == "--neighbours") {
      const std::string v = next();
      a.neighbours = v == "auto" ? -1 : int(parse_int(f, v, 0));
    }
    else if (f == "--runtime") a.runtime = next();
    else if (f == "--calibration") a.calibration = next();
    else mt::input_error("unknown argument '{}'\n{}", argv[i], kUsage);
  }
  if (a.help) return a;
  if (a.config.empty()) mt::input_error("missing --config FILE\n{}", kUsage);
  if (!have_world) mt::input_error("missing --world N (the number of ranks to plan for)\n{}", kUsage);
  return a;
}

// This program started again with its own arguments and `extra`: the time-sharing probe's child, a neighbour.
std::vector<std::string> self_command(int argc, char** argv, const std::vector<std::string>& extra) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe to start the planner's child processes");
  std::vector<std::string> command = {std::string(buf, size_t(n))};
  for (int i = 1; i < argc; ++i) command.push_back(argv[i]);
  command.insert(command.end(), extra.begin(), extra.end());
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const mt::Config base = mt::load_config(a.config, a.sets);
    mt::plan::PlanOptions o;
    o.world = a.world;
    o.memory_limit_mb = a.memory_limit_mb;
    o.time = !a.memory_only;
    o.step.threads = base.train.threads > 0 ? base.train.threads : mt::default_compute_threads(a.world);
    o.step.cores = omp_get_num_procs();
    // The runtime constants: the defaults, then --runtime's, then the flags.
    mt::plan::RuntimeFit fit;
    if (!a.runtime.empty()) fit = mt::plan::load_runtime_fit(a.runtime);
    // The constants move from machine to machine (and day to day on one VM), and the defaults are no fit of this
    // one: say so where they shape the answer rather than let a ranking mislead without a word.
    if (a.runtime.empty() && o.time && a.world > 1 && a.time_sharing_child == 0)
      std::fprintf(stderr,
                   "planner: the runtime constants are the defaults, not fit on this machine (on the 2-core Intel Xeon "
                   "of docs/planner.md they put the mean error at 35-58%% over six samples, refit 6-13%%): fit them "
                   "once, /usr/bin/python3 scripts/validate_planner.py --fit runtime.json (about 5 minutes), and "
                   "plan with --runtime runtime.json\n");
    o.step.net = fit.net;
    o.step.net.op_overhead_us = a.net.op_overhead_us;
    if (a.p2p_latency_us) o.step.net.p2p_latency_us = *a.p2p_latency_us;
    if (a.p2p_wake_us) o.step.net.p2p_wake_us = *a.p2p_wake_us;
    o.step.llc_bytes = a.llc_mb ? *a.llc_mb * 1048576.0 : double(mt::last_level_cache_bytes());
    if (a.poll_share) o.step.net.poll_share = *a.poll_share;
    if (a.sync_latency_us) o.step.net.oversubscribed_sync_us = *a.sync_latency_us;
    if (a.step_sync_us) o.step.net.oversubscribed_step_sync_us = *a.step_sync_us;
    if (a.ring_sync_us) o.step.net.oversubscribed_ring_us = *a.ring_sync_us;
    if (a.comm_cpu_op_us) o.step.net.comm_cpu_op_us = *a.comm_cpu_op_us;
    if (a.comm_cpu_ns_per_byte) o.step.net.comm_cpu_ns_per_byte = *a.comm_cpu_ns_per_byte;
    // The passes are timed on the matmul libraries the trainer would use (train.cpu_matmul).
    mt::kernels::cpu::MatmulBackends libs;
    std::string unused;  // load_config refused a choice this build cannot run
    mt::kernels::cpu::resolve_matmul_backends(base.train.cpu_matmul, libs, unused);
    mt::kernels::cpu::set_matmul_backends(libs);
    // The time-sharing probe's child (started by the probe below with this process's own arguments): the model's
    // passes at the micro-batch it is given.
    mt::plan::StageShape probe;
    probe.blocks = std::min(base.model.n_layer, 4);
    const int per_rank = std::max(1, std::min(base.train.micro_batch, base.train.global_batch / a.world));
    probe.B = a.time_sharing_child > 0 ? a.time_sharing_child : per_rank;
    probe.dtype = base.precision.compute;
    probe.inflight = 2;
    if (a.time_sharing_child > 0)
      return mt::plan::time_sharing_child(base.model, probe, o.step.threads, mt::plan::kTimeSharingRoundSeconds);
    if (a.neighbour_child) return mt::plan::neighbour_child(base.model, o.step.threads);
    mt::plan::CalibrationOptions co;
    co.threads = o.step.threads;
    co.reps = a.reps;
    co.verbose = a.verbose;
    co.progress = !a.verbose && isatty(fileno(stderr));  // a line rewritten in place: for a terminal only
    if (!a.verbose && !co.progress) co.progress_every_s = a.progress_every_s;  // into a log: a line now and then
    // Ranks taking turns on the cores find their data gone from the caches: the step model asks for their passes'
    // cold times there (and only there), timed after writing twice the cache.
    co.evict_bytes = int64_t(2 * o.step.llc_bytes);
    // --neighbours: the passes timed with the other cores doing the same, as a layout's ranks compute at once on
    // every core (started at the first timing, after the time-sharing probe below, which needs the cores to itself).
    co.neighbours =
        a.neighbours >= 0 ? a.neighbours : mt::plan::neighbour_count(a.world, o.step.threads, o.step.cores);
    std::unique_ptr<mt::plan::Neighbours> neighbours;
    if (o.time && co.neighbours > 0) {
      neighbours = std::make_unique<mt::plan::Neighbours>(self_command(argc, argv, {"--neighbour-child"}),
                                                          co.neighbours, probe, a.verbose);
      co.beside = [&neighbours](const mt::plan::StageShape* s) {
        if (neighbours) neighbours->run(s);
      };
    }
    mt::plan::Calibration cal(base.model, co);
    const int loaded = a.calibration.empty() ? 0 : cal.load(a.calibration);
    if (loaded == 0 && o.time && !a.calibration.empty() && std::ifstream(a.calibration).peek() != EOF)
      std::fprintf(stderr, "planner: note: %s holds timings of another model, thread count, neighbour count or matmul "
                           "library (its first line says which); timing afresh, and the file will be overwritten\n",
                   a.calibration.c_str());

    const std::vector<mt::plan::Layout> all = mt::plan::enumerate_layouts(base, a.world);
    if (all.empty()) {
      // Say why the config's own layout (or the plainest one) does not run on N ranks.
      std::string why;
      mt::plan::Layout plain;
      plain.dp = a.world;
      plain.micro_batch = base.train.micro_batch;
      mt::plan::layout_valid(base, plain, a.world, &why);
      mt::input_error("no layout of {} runs on {} ranks (e.g. {}: {})", a.config, a.world, mt::plan::describe(plain),
                      why);
    }
    // Ranks beyond the cores take turns: what that costs is measured once per rank count (kept with the timings).
    std::string slicing_source = "none: the threads fit the cores";
    if (o.time && a.world * o.step.threads > o.step.cores) {
      if (a.time_slicing) {
        o.step.slicing = *a.time_slicing;
        slicing_source = "--time-slicing";
      } else if (cal.slicing(a.world) >= 0) {
        o.step.slicing = cal.slicing(a.world);
        slicing_source = "from " + a.calibration;
      } else {
        const std::vector<std::string> child =
            self_command(argc, argv, {"--time-sharing-child", std::to_string(probe.B)});
        mt::plan::TimeSharing ts;
        try {
          ts = mt::plan::measure_time_sharing(child, a.world, 1 + co.neighbours, o.step.threads, o.step.cores);
        } catch (const std::runtime_error& e) {  // a plan without the term beats no plan
          std::fprintf(stderr, "planner: warning: %s; planning without its cost (time slicing 0)\n", e.what());
          ts.slicing = -1;
        }
        if (ts.slicing >= 0) {
          cal.set_slicing(a.world, ts.slicing);
          o.step.slicing = cal.slicing(a.world);  // as the file keeps it
          slicing_source = "measured";
          const std::string baseline =
              ts.full_copies == 1 ? "alone" : fmt::format("with {} at once (as the passes are timed)", ts.full_copies);
          std::fprintf(stderr, "planner: %d ranks taking turns on %g cores: a forward and backward pass "
                               "(micro-batch %d) took %.1f ms %s and %.1f ms with all at once, %.2fx the cores' "
                               "share: time slicing %.3f\n", a.world, o.step.cores, probe.B, ts.full_us / 1000,
                       baseline.c_str(), ts.shared_us / 1000, ts.ratio, ts.slicing);
        } else {
          slicing_source = "the probe failed";
        }
      }
    }

    // What the time model leaves out: said once, on stderr, so that the JSON stays clean.
    if (o.time) {
      if (base.comm.compress != mt::CompressMethod::None && base.comm.compress != mt::CompressMethod::BF16)
        std::fprintf(stderr, "planner: note: comm.compress=%s: bucket reductions are timed as uncompressed fp32 "
                             "(the encoding's cost and smaller messages are not modeled)\n",
                     mt::name_of(base.comm.compress));
      if (base.comm.hierarchical)
        std::fprintf(stderr, "planner: note: comm.hierarchical: the data-parallel all-reduce is timed as one flat "
                             "ring over its slowest link\n");
      if (base.optim.sync_every > 0)
        std::fprintf(stderr, "planner: note: optim.sync_every=%d: steps are timed without gradient reduction; "
                             "step_ms is the mean step, with 1/%d of the parameter average%s\n",
                     base.optim.sync_every, base.optim.sync_every,
                     base.comm.adapt ? " (comm.adapt's own choice of the period is not modeled)" : "");
    }
    std::vector<mt::plan::PlanRow> rows = mt::plan::plan_layouts(base, o, cal);
    // The shapes timed above again, in rounds over all of them; then the plan with their medians.
    if (o.time && cal.measurements() > 0 && a.rounds > 1) {
      for (int r = 1; r < a.rounds; ++r) cal.retime();
      rows = mt::plan::plan_layouts(base, o, cal);
    }
    neighbours.reset();  // the timing is done
    if (cal.measurements() > 0 && co.progress) std::fputc('\n', stderr);  // ends the progress line
    if (!a.calibration.empty() && o.time) cal.save(a.calibration);
    const mt::plan::RunContext run{a.config, a.world, a.sets};
    if (a.json) {
      std::fputs(mt::plan::format_json(rows, base, run, fit.spread).c_str(), stdout);
    } else {
      const mt::EmulateConfig& e = base.comm.emulate;
      std::string network = "not emulated (shared memory)";
      if (e.latency_us > 0 || e.bandwidth_gbps > 0 || e.inter_latency_us > 0 || e.inter_bandwidth_gbps > 0)
        network = fmt::format("{} us / {} GB/s", e.latency_us, e.bandwidth_gbps) +
                  (e.ranks_per_node > 0 ? fmt::format(", {} ranks per node, between nodes {} us / {} GB/s",
                                                      e.ranks_per_node, e.inter_latency_us, e.inter_bandwidth_gbps)
                                        : "");
      const std::string within =
          a.memory_limit_mb > 0 ? fmt::format(", {} within {} MiB", rows.size(), a.memory_limit_mb) : "";
      std::printf("%s", fmt::format("planner: {} on {} ranks: {} valid layouts{}; {} compute thread{} per rank, {} "
                                    "cores; network {}\n",
                                    a.config, a.world, all.size(), within, o.step.threads,
                                    o.step.threads == 1 ? "" : "s", o.step.cores, network)
                            .c_str());
      if (o.time)
        std::printf("%s", fmt::format("compute timed in {:.1f} s ({} measurements{}{}); step_ms is predicted, "
                                      "memory_mb the largest rank's peak tensor memory\n",
                                      cal.seconds(), cal.measurements(),
                                      cal.measurements() > 0 ? fmt::format(" in {} rounds", a.rounds) : "",
                                      loaded ? fmt::format(", {} more from {}", loaded, a.calibration) : "")
                              .c_str());
      const std::vector<mt::plan::PlanRow> shown = a.every_layout ? rows : mt::plan::best_per_mesh(rows);
      if (o.time)
        std::printf("%s", fmt::format("runtime constants {}: p2p latency {:g} us, p2p wake {:g} us, last-level "
                                      "cache {}, poll share {:g}, "
                                      "sync latency {:g} us, step sync {:g} us, ring sync {:g} us (the last three per "
                                      "thread per core), time slicing {:.3f} ({}); '=' marks rows within {:.0f}% of "
                                      "the first (a tie: runs of one layout differ by that much{})\n",
                                      a.runtime.empty() ? "(defaults)" : "from " + a.runtime,
                                      o.step.net.p2p_latency_us, o.step.net.p2p_wake_us,
                                      o.step.llc_bytes > 0 ? fmt::format("{:g} MiB", o.step.llc_bytes / 1048576.0)
                                                           : std::string("unknown or 0: no cold passes"),
                                      o.step.net.poll_share,
                                      o.step.net.oversubscribed_sync_us, o.step.net.oversubscribed_step_sync_us,
                                      o.step.net.oversubscribed_ring_us, o.step.slicing, slicing_source,
                                      100 * fit.spread, a.runtime.empty() ? ", the default; --runtime gives the "
                                                                            "measured spread" : "")
                              .c_str());
      std::fputs(mt::plan::format_table(shown, a.top, base, run, rows.size() - shown.size(), fit.spread).c_str(),
                 stdout);
      if (rows.empty()) std::printf("no layout fits within %g MiB per rank\n", a.memory_limit_mb);
      // The limit left out ZeRO-2/3 layouts that sub-block units would fit: say so (the planner does not search
      // optim.zero_unit; it comes from the config).
      if (a.memory_limit_mb > 0 && base.optim.zero_unit == mt::ZeroUnit::Block) {
        mt::Config thirds = base;
        thirds.optim.zero_unit = mt::ZeroUnit::Sublayer;
        mt::plan::PlanOptions mo = o;
        mo.time = false;
        int more = 0;
        for (const mt::plan::PlanRow& r : mt::plan::plan_layouts(thirds, mo, cal))
          more += r.layout.zero >= 2 && std::none_of(rows.begin(), rows.end(), [&](const mt::plan::PlanRow& k) {
                    return k.layout == r.layout;
                  });
        if (more > 0)
          std::printf("%d more ZeRO-2/3 layout%s would fit within %g MiB with --set optim.zero_unit=sublayer (units "
                      "of a third of a block)\n", more, more == 1 ? "" : "s", a.memory_limit_mb);
      }
    }
    return 0;
  } catch (const mt::InputError& e) {
    std::fprintf(stderr, "planner: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "planner: failed: %s\n", e.what());
    return 1;
  }
}
