// The CUDA implementation of DeviceStaging (device_staging.h): one non-blocking copy stream, a pool of pinned
// host blocks and a pool of "inputs ready" events per communicator. Host code only (CUDA runtime API).
// Who owns what: the blocks and the copy stream belong to the communication thread (the destructor runs after it
// has been joined); the event pool is shared with the issuing threads and guarded by a mutex.
#include "comm/cuda/device_staging.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "core/cuda/cuda_context.h"
#include "core/cuda_check.h"
#include "core/device.h"

namespace mt {
namespace {

// Pinned blocks are rounded up to this, so sizes that differ a little share blocks.
constexpr size_t kBlockGranule = size_t(64) << 10;

class CudaDeviceStaging final : public DeviceStaging {
 public:
  CudaDeviceStaging() : device_(cuda_device_index()) {
    MT_CHECK(device_ >= 0, "device tensors on an MPI communicator before cuda_init()");
    int current = -1;
    CUDA_CHECK(cudaGetDevice(&current));
    MT_CHECK(current == device_, "MPI communicator: the issuing thread has GPU {} current, the process uses GPU {} "
             "(call cuda_init on every thread that issues device operations)", current, device_);
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    // BlockingSync: cudaEventSynchronize sleeps instead of spinning. Several ranks share one GPU and its cores in
    // the correctness tests, and the compute threads need those cores.
    CUDA_CHECK(cudaEventCreateWithFlags(&copies_done_, cudaEventBlockingSync | cudaEventDisableTiming));
  }

  // No CHECKs: a communicator may be destroyed at exit, after a CUDA error was already reported.
  ~CudaDeviceStaging() override {
    cudaStreamSynchronize(copy_stream_);
    for (const Block& b : blocks_) cudaFreeHost(b.ptr);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    cudaEventDestroy(copies_done_);
    cudaStreamDestroy(copy_stream_);
  }

  Event record_inputs_ready() override {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lk(events_mu_);
      if (!free_events_.empty()) {
        e = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (!e) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, compute_stream()));
    return e;
  }

  void begin(Event inputs_ready) override {
    if (!thread_bound_) {
      CUDA_CHECK(cudaSetDevice(device_));  // the communication thread touches the GPU from here on
      thread_bound_ = true;
    }
    auto e = static_cast<cudaEvent_t>(inputs_ready);
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, e, 0));
    // The wait captured the event's latest record, so it may be recorded again at once (CUDA's semantics of
    // cudaStreamWaitEvent): back to the pool.
    std::lock_guard<std::mutex> lk(events_mu_);
    free_events_.push_back(e);
  }

  void* acquire(size_t bytes) override {
    if (bytes == 0) return nullptr;
    Block* best = nullptr;   // the smallest free block that fits
    Block* small = nullptr;  // the largest free block that does not
    for (Block& b : blocks_) {
      if (b.in_use) continue;
      if (b.bytes >= bytes) {
        if (!best || b.bytes < best->bytes) best = &b;
      } else if (!small || b.bytes > small->bytes) {
        small = &b;
      }
    }
    if (!best) {
      // Grow: a free block too small is replaced, so the pool holds as many blocks as operations were ever
      // staged at once (one collective plus the sends/receives in flight), each as large as the largest use.
      const size_t want = (bytes + kBlockGranule - 1) / kBlockGranule * kBlockGranule;
      void* p = nullptr;
      CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocDefault));
      if (small) {
        CUDA_CHECK(cudaFreeHost(small->ptr));  // free, so no copy uses it
        *small = Block{p, want, false};
        best = small;
      } else {
        blocks_.push_back(Block{p, want, false});
        best = &blocks_.back();
      }
    }
    best->in_use = true;
    return best->ptr;
  }

  void release(void* block) override {
    if (!block) return;
    for (Block& b : blocks_)
      if (b.ptr == block) {
        MT_CHECK(b.in_use, "pinned staging block released twice");
        b.in_use = false;
        return;
      }
    MT_CHECK(false, "release of a block that is not a pinned staging block");
  }

  void download(void* host, const void* device, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, copy_stream_));
  }

  void upload(void* device, const void* host, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, copy_stream_));
  }

  void synchronize() override {
    CUDA_CHECK(cudaEventRecord(copies_done_, copy_stream_));
    CUDA_CHECK(cudaEventSynchronize(copies_done_));
  }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool in_use = false;
  };

  const int device_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copies_done_ = nullptr;  // recorded after the queued copies; waited on by synchronize()
  bool thread_bound_ = false;          // the communication thread has made device_ current
  std::vector<Block> blocks_;          // communication thread only

  std::mutex events_mu_;  // guards free_events_ (issuing threads take, the communication thread gives back)
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace

std::unique_ptr<DeviceStaging> make_device_staging() { return std::make_unique<CudaDeviceStaging>(); }

}  // namespace mt
