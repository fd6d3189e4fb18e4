// Energy the GPUs drew, from NVML's counters (nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver
// loaded, Volta and later). NVML is the driver's library (libnvidia-ml.so.1), opened at run time, so every build
// has this and none links it. Read by one rank per node for every GPU NVML lists there (NVML sees the node's GPUs
// whatever CUDA_VISIBLE_DEVICES says: on a node shared with other jobs the figure is the node's). Where there is
// no driver, no GPU or no counter, it says why, and nothing is estimated in its place.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

class GpuEnergyMeter {
 public:
  // library: the NVML library to open; "" = $MESHTRAIN_NVML if set (tests name a file of their own), else
  // libnvidia-ml.so.1.
  explicit GpuEnergyMeter(std::string library = "");

  bool available() const { return !last_mj_.empty(); }
  int gpus() const { return int(last_mj_.size()); }
  const std::string& why_unavailable() const { return why_; }
  // Joules drawn by every GPU since the previous call (the first call: since construction).
  double joules();

 private:
  bool read(std::vector<uint64_t>& mj) const;

  void* total_energy_ = nullptr;  // nvmlDeviceGetTotalEnergyConsumption (the library stays loaded until exit)
  std::vector<void*> devices_;    // nvmlDevice_t handles
  std::vector<uint64_t> last_mj_;
  std::string why_;
};

}  // namespace mt
