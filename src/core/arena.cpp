// Arena implementation: blocks are kept across reset(), so a steady-state step allocates nothing.
#include "core/arena.h"

#include <algorithm>
#include <cstdlib>

#include "core/device_memory.h"

namespace mt {

Tensor Arena::alloc(Shape shape, DType dtype) {
  size_t bytes = (static_cast<size_t>(shape.numel()) * dtype_size(dtype) + 63) / 64 * 64;
  if (count_only_) {
    in_use_ += bytes;
    high_water_ = std::max(high_water_, in_use_);
    return Tensor(nullptr, shape, dtype, device_);
  }
  while (current_ < blocks_.size() && offset_ + bytes > blocks_[current_].size) {
    ++current_;
    offset_ = 0;
  }
  if (current_ == blocks_.size()) {
    size_t size = std::max(block_bytes_, bytes);
    if (device_ == Device::CUDA) {
      blocks_.push_back({detail::device_alloc(size), size});
    } else {
      void* p = std::aligned_alloc(64, size);
      CHECK(p != nullptr, "out of host memory: arena block of {} bytes", size);
      blocks_.push_back({std::shared_ptr<void>(p, std::free), size});
    }
    ++block_allocations_;
    offset_ = 0;
  }
  void* p = static_cast<char*>(blocks_[current_].mem.get()) + offset_;
  offset_ += bytes;
  in_use_ += bytes;
  if (device_ == Device::CPU) count_host_tensor_bytes(int64_t(bytes));
  high_water_ = std::max(high_water_, in_use_);
  return Tensor(p, shape, dtype, device_);
}

Arena::~Arena() {
  if (device_ == Device::CPU && !count_only_) count_host_tensor_bytes(-int64_t(in_use_));
}

void Arena::reset() {
  if (device_ == Device::CPU && !count_only_) count_host_tensor_bytes(-int64_t(in_use_));
  current_ = 0;
  offset_ = 0;
  in_use_ = 0;
}

size_t Arena::bytes_reserved() const {
  size_t s = 0;
  for (auto& b : blocks_) s += b.size;
  return s;
}

}  // namespace mt
