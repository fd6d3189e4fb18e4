// DeviceStaging: how the MPI backend (comm/mpi_communicator.cpp) runs operations on device (Device::CUDA) tensors:
// through pinned host buffers, with the copies on a copy stream of the communicator's own. This header is plain
// C++ on purpose (no CUDA header, only an interface), so mpi_communicator.cpp holds one in every build; only
// make_device_staging(), defined in device_staging.cpp (compiled in CUDA builds only), creates one.
//
// One device operation, in order:
//   caller's thread, at issue:  ev = record_inputs_ready()           event on compute_stream()
//   communication thread:       begin(ev)                            the copy stream waits for it
//                               host = acquire(bytes)                a pinned block, reused
//                               download(host, device, n); synchronize()
//                               ... the host MPI algorithm on `host` ...
//                               upload(device, host, n); synchronize()
//                               release(host); then the handle completes
// What must stay true: every copy of an operation is queued on the copy stream after begin(), so the copy stream
// reads inputs, and writes outputs, only after the compute-stream work issued before the operation (its
// producers, and any kernel still reading an output buffer). The host blocks (without spinning) only on the
// communication thread, in synchronize(); a handle completes after its upload finished, so once wait() returns
// the result is in device memory for whatever the caller issues next.
#pragma once
#include <cstddef>
#include <memory>

namespace mt {

class DeviceStaging {
 public:
  using Event = void*;  // a cudaEvent_t, opaque here
  virtual ~DeviceStaging() = default;

  // Caller's thread (one with the process's GPU current, as after cuda_init): an event recorded on
  // compute_stream() after the work issued to it so far. Pass it to begin() exactly once.
  virtual Event record_inputs_ready() = 0;

  // From here on: the communication thread only.
  // Makes the GPU current on this thread (cudaSetDevice(cuda_device_index()), on the first call), orders the
  // copy stream after `inputs_ready` and takes the event back for reuse.
  virtual void begin(Event inputs_ready) = 0;
  // A pinned host block of at least `bytes` (nullptr for 0 bytes), owned by this object until release(). Blocks
  // are kept and handed out again (best fit), so a steady state (the same sizes every step) allocates nothing.
  virtual void* acquire(size_t bytes) = 0;
  virtual void release(void* block) = 0;
  // Queue a copy on the copy stream (0 bytes: nothing). Complete after synchronize().
  virtual void download(void* host, const void* device, size_t bytes) = 0;
  virtual void upload(void* device, const void* host, size_t bytes) = 0;
  // Blocks the calling thread, sleeping rather than spinning (ranks sharing a GPU share the cores too), until
  // every copy queued so far is complete.
  virtual void synchronize() = 0;
};

// Creates the staging of one communicator, on the calling thread's current GPU (CUDA builds only; CHECKs that
// cuda_init ran).
std::unique_ptr<DeviceStaging> make_device_staging();

}  // namespace mt
