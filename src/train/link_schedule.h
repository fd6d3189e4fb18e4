// comm.emulate.schedule: the emulated link changing during a run, "STEP:LATENCY_US:BANDWIDTH_GBPS" entries joined by
// commas (e.g. "200:50:0.1, 400:20:1": from step 200 on 50 us and 0.1 GB/s, from step 400 on 20 us and 1 GB/s), so
// an adaptive run can be shown a link that changes under it. The parser only: the fuzzed config code uses it.
#pragma once
#include <string>
#include <vector>


namespace mt {

struct LinkChange {
  int step = 0;  // the first step on the new link
  double latency_us = 0, bandwidth_gbps = 0;
};

// Parses the schedule (an empty string is none). Throws InputError naming comm.emulate.schedule and the entry when
// an entry is malformed, a value negative, or the steps are not increasing from 1.
std::vector<LinkChange> parse_link_schedule(const std::string& text);

}  // namespace mt
