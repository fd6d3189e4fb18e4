// The planner's runtime constants as scripts/validate_planner.py --fit saves them for a machine (JSON): the eight
// NetOptions constants fitted to timed runs, and the run-to-run spread measured meanwhile, within which the planner
// marks rows as ties. build/planner reads the file with --runtime FILE (docs/planner.md, "Calibration").
#pragma once
#include <string>

#include "plan/net_model.h"

namespace mt::plan {

struct RuntimeFit {
  NetOptions net;        // the defaults, with the file's constants over them
  double spread = 0.10;  // relative run-to-run spread of a layout's step time
};

// Reads FILE ({"p2p_latency_us", "poll_share", "sync_latency_us", "step_sync_us", "ring_sync_us", "spread"}, and
// optionally "comm_cpu_op_us", "comm_cpu_ns_per_byte" and "p2p_wake_us"; other keys ignored, the dropped
// "pass_refill_us" and "refill_us_per_mparam" with a note on stderr); a missing, malformed or out-of-range file is an
// InputError naming it and the key.
RuntimeFit load_runtime_fit(const std::string& path);

}  // namespace mt::plan
