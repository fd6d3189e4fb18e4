#include "train/link_schedule.h"

#include <cmath>
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

}  // namespace mt
