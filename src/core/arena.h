// Arena: a bump allocator for the step loop, in host or GPU memory (GPU blocks come from the caching allocator).
// The first step grows it block by block; reset() rewinds it, and later steps, making the same requests, reuse
// the same memory without allocating. Host arenas count in host_tensor_bytes(); GPU memory is counted by the
// caching allocator (device_memory_stats()).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace mt {

class Arena {
 public:
  explicit Arena(Device device = Device::CPU, size_t block_bytes = size_t(64) << 20)
      : device_(device), block_bytes_(block_bytes) {}
  // An arena that only counts: alloc() hands out tensors of the asked shape with no memory behind them (never to be
  // read or written) and counts their bytes as a real arena does. The planner runs the model's allocation code on
  // one, so its memory figures are the model's own.
  struct CountOnly {};
  explicit Arena(CountOnly) : device_(Device::CPU), block_bytes_(0), count_only_(true) {}
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Uninitialised memory, 64-byte aligned, valid until reset().
  Tensor alloc(Shape shape, DType dtype);
  // Forget every allocation; memory is kept for reuse.
  void reset();
  size_t bytes_in_use() const { return in_use_; }
  size_t high_water_bytes() const { return high_water_; }
  size_t bytes_reserved() const;
  size_t block_allocations() const { return block_allocations_; }  // grows only while the arena is warming up

 private:
  struct Block {
    std::shared_ptr<void> mem;
    size_t size;
  };
  Device device_;
  size_t block_bytes_;
  std::vector<Block> blocks_;
  size_t current_ = 0, offset_ = 0, in_use_ = 0, high_water_ = 0, block_allocations_ = 0;
  bool count_only_ = false;
};

}  // namespace mt
