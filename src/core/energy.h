// Energy the CPUs drew, from Linux's powercap counters of RAPL (running average power limit): one
// `intel-rapl:N` folder per package under /sys/class/powercap, on Intel and on AMD (Zen) alike, each with
// energy_uj (microjoules since some start, wrapping at max_energy_range_uj). Read by one rank per node, since the
// counters are the node's. Where there are none (a VM, a kernel without the driver, no permission), it says why,
// and nothing is estimated in their place.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

class EnergyMeter {
 public:
  // root: the powercap folder; "" = $MESHTRAIN_POWERCAP if set (tests give a folder of their own), else
  // /sys/class/powercap.
  explicit EnergyMeter(std::string root = "");
  bool available() const { return !packages_.empty(); }
  const std::string& why_unavailable() const { return why_; }
  // Joules drawn by every package since the previous call (the first call: since construction).
  double joules();

 private:
  struct Package {
    std::string energy_path;
    uint64_t range_uj = 0, last_uj = 0;
  };
  std::vector<Package> packages_;
  std::string why_;
};

}  // namespace mt
