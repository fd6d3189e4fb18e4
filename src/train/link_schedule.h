// comm.emulate.schedule: the emulated link changing during a run, "STEP:LATENCY_US:BANDWIDTH_GBPS" entries joined by
// commas (e.g. "200:50:0.1, 400:20:1": from step 200 on 50 us and 0.1 GB/s, from step 400 on 20 us and 1 GB/s), so
// an adaptive run can be shown a link that changes under it.
#pragma once
#include <string>
#include <vector>

#include "parallel/mesh.h"

namespace mt {

struct LinkChange {
  int step = 0;  // the first step on the new link
  double latency_us = 0, bandwidth_gbps = 0;
};

// Parses the schedule (an empty string is none). Throws InputError naming comm.emulate.schedule and the entry when
// an entry is malformed, a value negative, or the steps are not increasing from 1.
std::vector<LinkChange> parse_link_schedule(const std::string& text);

// Before step `step`: sets the link of every emulated communicator of the mesh to the schedule's entry for this
// step (at the first step of a run, or of a resumed one, to the latest entry at or before it). Logs the change on
// `log`. Returns whether it changed anything.
bool apply_link_schedule(const std::vector<LinkChange>& schedule, int step, bool first_step, MeshComms& comms,
                         bool log);

}  // namespace mt
