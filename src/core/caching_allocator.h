// CachingAllocator: hands out device memory from blocks it keeps, so a steady-state step never calls
// cudaMalloc or cudaFree (both synchronise the device). Generic over the backend's allocate/release functions,
// so its bookkeeping is unit-tested on host memory (tests/test_caching_allocator.cpp); the process's device
// allocator (device_allocator()) uses cudaMalloc/cudaFree.
//
// What must stay true: every kernel runs on the one compute stream, so a block freed by the host can be handed
// out again at once, because anything the next owner issues runs after what the last owner issued. Memory used
// on another stream (a communicator's) must not be freed until that use is complete: the step's tensors live in
// arenas and parameter buffers that outlive their communicators' operations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

namespace mt {

class CachingAllocator {
 public:
  // allocate(bytes) returns nullptr when the backend is out of memory; release frees what allocate gave.
  CachingAllocator(std::function<void*(size_t)> allocate, std::function<void(void*)> release);
  ~CachingAllocator();  // releases the cached blocks; blocks still handed out are leaked, not freed under a user
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` (rounded up to the size class), 256-byte aligned when the backend's blocks are. A cached
  // block is reused when it is at most twice the rounded request; on backend failure every cached block is
  // released and the request retried once; then it fails with a message giving the counters.
  void* allocate(size_t bytes);
  void release(void* p);
  void release_cached();  // gives every cached block back to the backend

  // Size classes: multiples of 512 bytes up to 1 MiB, of 2 MiB above (few, large blocks from the driver).
  static size_t round_size(size_t bytes);

  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes_in_use() const { return peak_; }
  size_t bytes_reserved() const { return reserved_; }
  uint64_t backend_allocations() const { return backend_allocations_; }
  void reset_peak() { peak_ = in_use_; }

 private:
  std::function<void*(size_t)> allocate_;
  std::function<void(void*)> release_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;            // free blocks by size
  std::unordered_map<void*, size_t> handed_out_;   // block -> its size
  size_t in_use_ = 0, peak_ = 0, reserved_ = 0;
  uint64_t backend_allocations_ = 0;
};

}  // namespace mt
