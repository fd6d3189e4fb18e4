// The GPUs' energy counters through NVML (see gpu_energy.h). NVML's C interface is declared here by hand (its
// functions return nvmlReturn_t, 0 on success; a device is an opaque handle), so no NVML header is needed.
#include "core/gpu_energy.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

namespace mt {

namespace {

using NvmlDevice = void*;
using InitFn = int (*)();
using CountFn = int (*)(unsigned*);
using HandleFn = int (*)(unsigned, NvmlDevice*);
using EnergyFn = int (*)(NvmlDevice, unsigned long long*);
using ErrorFn = const char* (*)(int);

template <typename F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

GpuEnergyMeter::GpuEnergyMeter(std::string library) {
  if (library.empty()) {
    const char* env = std::getenv("MESHTRAIN_NVML");
    library = env && *env ? env : "libnvidia-ml.so.1";
  }
  // Never closed: NVML stays initialised until the process ends, as nvmlShutdown would have to pair every init.
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    why_ = fmt::format("{} cannot be opened (no NVIDIA driver on this node): {}", library, dlerror());
    return;
  }
  const auto init = symbol<InitFn>(lib, "nvmlInit_v2");
  const auto count = symbol<CountFn>(lib, "nvmlDeviceGetCount_v2");
  const auto handle = symbol<HandleFn>(lib, "nvmlDeviceGetHandleByIndex_v2");
  const auto error = symbol<ErrorFn>(lib, "nvmlErrorString");
  total_energy_ = reinterpret_cast<void*>(symbol<EnergyFn>(lib, "nvmlDeviceGetTotalEnergyConsumption"));
  if (!init || !count || !handle || !total_energy_) {
    why_ = library + " lacks NVML's functions (nvmlInit_v2, nvmlDeviceGetCount_v2, "
                     "nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetTotalEnergyConsumption)";
    return;
  }
  auto failed = [&](const char* call, int rc) {
    why_ = fmt::format("{} failed: {}", call, error ? error(rc) : fmt::format("NVML error {}", rc));
  };
  unsigned n = 0;
  int rc = init();
  if (rc != 0) {
    failed("nvmlInit_v2", rc);
    return;
  }
  if ((rc = count(&n)) != 0 || n == 0) {
    if (rc != 0) failed("nvmlDeviceGetCount_v2", rc);
    else why_ = "NVML lists no GPU";
    return;
  }
  devices_.resize(n);
  for (unsigned i = 0; i < n; ++i)
    if ((rc = handle(i, &devices_[i])) != 0) {
      devices_.clear();
      failed("nvmlDeviceGetHandleByIndex_v2", rc);
      return;
    }
  std::vector<uint64_t> mj;
  if (!read(mj)) {
    why_ = "nvmlDeviceGetTotalEnergyConsumption is not supported on this GPU (it needs Volta or later)";
    return;
  }
  last_mj_ = mj;
}

bool GpuEnergyMeter::read(std::vector<uint64_t>& mj) const {
  const auto energy = reinterpret_cast<EnergyFn>(total_energy_);
  mj.assign(devices_.size(), 0);
  for (size_t i = 0; i < devices_.size(); ++i) {
    unsigned long long v = 0;
    if (energy(devices_[i], &v) != 0) return false;
    mj[i] = v;
  }
  return !devices_.empty();
}

double GpuEnergyMeter::joules() {
  std::vector<uint64_t> now;
  if (!available() || !read(now)) return 0;  // a read that fails counts nothing rather than a guess
  double total_mj = 0;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i] >= last_mj_[i]) total_mj += double(now[i] - last_mj_[i]);  // the counter only grows
    last_mj_[i] = now[i];
  }
  return total_mj * 1e-3;
}

}  // namespace mt
