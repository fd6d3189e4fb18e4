#include "train/link_schedule.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/errors.h"

namespace mt {

namespace {

bool parse_number(const std::string& s, double& out) {
  char* end = nullptr;
  const char* b = s.c_str();
  while (*b == ' ') ++b;
  out = std::strtod(b, &end);
  while (end && *end == ' ') ++end;
  return end != b && end && *end == '\0' && std::isfinite(out);
}

}  // namespace

std::vector<LinkChange> parse_link_schedule(const std::string& text) {
  std::vector<LinkChange> out;
  if (text.find_first_not_of(" ") == std::string::npos) return out;
  std::stringstream entries(text);
  for (std::string entry; std::getline(entries, entry, ',');) {
    std::vector<std::string> parts;
    std::stringstream fields(entry);
    for (std::string f; std::getline(fields, f, ':');) parts.push_back(f);
    double step = 0;
    LinkChange c;
    if (parts.size() != 3 || !parse_number(parts[0], step) || !parse_number(parts[1], c.latency_us) ||
        !parse_number(parts[2], c.bandwidth_gbps) || step != double(int(step)))
      input_error("comm.emulate.schedule: '{}' is not STEP:LATENCY_US:BANDWIDTH_GBPS (e.g. \"200:50:0.1, "
                  "400:20:1\")", entry);
    c.step = int(step);
    if (c.step < 1 || c.latency_us < 0 || c.bandwidth_gbps < 0)
      input_error("comm.emulate.schedule: '{}': the step must be >= 1, latency and bandwidth >= 0 (0 = no limit)",
                  entry);
    if (!out.empty() && c.step <= out.back().step)
      input_error("comm.emulate.schedule: step {} follows step {}: the entries must be in increasing step order",
                  c.step, out.back().step);
    out.push_back(c);
  }
  return out;
}

bool apply_link_schedule(const std::vector<LinkChange>& schedule, int step, bool first_step, MeshComms& comms,
                         bool log) {
  const LinkChange* now = nullptr;
  for (const LinkChange& c : schedule)
    if (c.step == step || (first_step && c.step <= step)) now = &c;
  if (!now) return false;
  std::vector<Communicator*> seen;
  for (Communicator* c : {comms.world.get(), comms.dp.get(), comms.tp.get(), comms.pp.get(), comms.emb.get()})
    if (c && std::find(seen.begin(), seen.end(), c) == seen.end()) {
      seen.push_back(c);
      c->set_emulated_link(now->latency_us, now->bandwidth_gbps);
    }
  if (log)
    spdlog::info("comm.emulate.schedule: from step {} the emulated link is {:g} us / {:g} GB/s", now->step,
                 now->latency_us, now->bandwidth_gbps);
  return true;
}

}  // namespace mt
