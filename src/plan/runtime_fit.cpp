// Reading scripts/validate_planner.py --fit's constants (see runtime_fit.h).
#include "plan/runtime_fit.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "core/input_file.h"
#include "core/json.h"

namespace mt::plan {

RuntimeFit load_runtime_fit(const std::string& path) {
  require_regular_file(path, "planner runtime file");
  std::ifstream in(path);
  if (!in) input_error("cannot open the planner runtime file '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = parse_json(text.str());
  } catch (const JsonError& e) {
    input_error("planner runtime file '{}' is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) input_error("planner runtime file '{}' is not a JSON object", path);
  RuntimeFit fit;
  auto read = [&](const char* key, double& into, double hi, bool optional = false) {
    const Json* v = j.get(key);
    if (!v && optional) return;
    if (!v) input_error("planner runtime file '{}' has no \"{}\"", path, key);
    if (!v->is_number() || !std::isfinite(v->number) || v->number < 0 || v->number > hi)
      input_error("planner runtime file '{}': \"{}\" must be a number in [0, {}]", path, key, hi);
    into = v->number;
  };
  read("p2p_latency_us", fit.net.p2p_latency_us, 1e6);
  read("poll_share", fit.net.poll_share, 1.0);
  read("sync_latency_us", fit.net.oversubscribed_sync_us, 1e6);
  read("step_sync_us", fit.net.oversubscribed_step_sync_us, 1e6);
  read("ring_sync_us", fit.net.oversubscribed_ring_us, 1e6);
  read("spread", fit.spread, 1.0);
  // Fit since 2026-11-28: files written before keep the defaults.
  read("comm_cpu_op_us", fit.net.comm_cpu_op_us, 1e6, true);
  read("comm_cpu_ns_per_byte", fit.net.comm_cpu_ns_per_byte, 1e3, true);
  read("p2p_wake_us", fit.net.p2p_wake_us, 1e6, true);  // since 2026-12-04
  // The cache refill was a fitted constant until 2026-12-05 (a flat one per pass, then one per million parameters);
  // the calibration now times each pass cold as well (Calibration::cold). The others were fit beside it: refit.
  for (const char* dropped : {"pass_refill_us", "refill_us_per_mparam"})
    if (j.get(dropped))
      std::fprintf(stderr, "planner: %s: \"%s\" is no longer used (the calibration times the passes with cold "
                   "caches instead): refit with scripts/validate_planner.py --fit\n", path.c_str(), dropped);
  return fit;
}

}  // namespace mt::plan
