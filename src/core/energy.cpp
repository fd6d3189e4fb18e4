// The CPU packages' energy counters (see energy.h).
#include "core/energy.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace mt {

namespace {

bool read_u64(const std::string& path, uint64_t& out) {
  std::ifstream f(path);
  unsigned long long v = 0;
  if (!(f >> v)) return false;
  out = v;
  return true;
}

}  // namespace

EnergyMeter::EnergyMeter(std::string root) {
  if (root.empty()) {
    const char* env = std::getenv("MESHTRAIN_POWERCAP");
    root = env && *env ? env : "/sys/class/powercap";
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    why_ = root + " does not exist (no powercap driver, as in most virtual machines)";
    return;
  }
  // The packages: intel-rapl:N, not their sub-domains intel-rapl:N:M (core, uncore, dram), counted within them.
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("intel-rapl:", 0) == 0 && name.find(':', 11) == std::string::npos) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    Package p;
    p.energy_path = root + "/" + name + "/energy_uj";
    if (!read_u64(p.energy_path, p.last_uj) || !read_u64(root + "/" + name + "/max_energy_range_uj", p.range_uj)) {
      packages_.clear();
      why_ = p.energy_path + " cannot be read (it is root's only on recent kernels)";
      return;
    }
    packages_.push_back(p);
  }
  if (packages_.empty()) why_ = "no RAPL package (intel-rapl:N) in " + root;
}

double EnergyMeter::joules() {
  double total_uj = 0;
  for (Package& p : packages_) {
    uint64_t now = p.last_uj;
    if (!read_u64(p.energy_path, now)) continue;  // a read that fails counts nothing rather than a guess
    total_uj += double(now >= p.last_uj ? now - p.last_uj : p.range_uj - p.last_uj + now);  // wrapped once
    p.last_uj = now;
  }
  return total_uj * 1e-6;
}

}  // namespace mt
