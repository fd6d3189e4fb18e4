// A stand-in for NVML's library (libnvidia-ml.so.1) in test_core's [energy] case: two GPUs whose energy counters
// grow by 1500 and 2500 mJ at every read, behind the five functions core/gpu_energy.cpp calls.
namespace {
unsigned long long counter[2];
}

extern "C" {
int nvmlInit_v2() { return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** device) {
  *device = &counter[i];
  return 0;
}
int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* mj) {
  unsigned long long* c = static_cast<unsigned long long*>(device);
  *c += c == &counter[0] ? 1500 : 2500;
  *mj = *c;
  return 0;
}
const char* nvmlErrorString(int) { return "fake NVML error"; }
}
