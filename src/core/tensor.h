// Tensor: a typed, shaped view of device memory. It either owns its storage (Tensor::empty) or views memory
// owned by something else (an Arena, a flat parameter buffer). Views are cheap value types with a fixed-size
// shape, so building them inside the step loop never touches the heap.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "core/enum_names.h"

namespace mt {

enum class Device : uint8_t { CPU, CUDA };
inline const auto& enum_names(Device) {  // also the config's `device` key
  static constexpr EnumName<Device> names[] = {{Device::CPU, "cpu"}, {Device::CUDA, "cuda"}};
  return names;
}
inline const char* device_name(Device d) { return name_of(d); }

// Up to 4 dimensions, stored inline.
struct Shape {
  static constexpr int kMaxDims = 4;
  std::array<int64_t, kMaxDims> d{};
  int n = 0;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    MT_CHECK(dims.size() <= kMaxDims, "at most {} dims", kMaxDims);
    for (int64_t x : dims) d[n++] = x;
  }
  int64_t operator[](int i) const { return d[i]; }
  int64_t numel() const {
    int64_t p = 1;
    for (int i = 0; i < n; ++i) p *= d[i];
    return p;
  }
  bool operator==(const Shape& o) const {
    if (n != o.n) return false;
    for (int i = 0; i < n; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }

// Host memory in use by this process's tensors: owning tensors (Tensor::empty) plus what Arenas have handed out
// (not the blocks they reserve, most of which a small run never touches): now, and the most at any moment since
// the start or the last reset. The planner's memory model is checked against the peak.
size_t host_tensor_bytes();
size_t peak_host_tensor_bytes();
void reset_peak_host_tensor_bytes();
// Arenas report what they hand out (+) and take back (-) here.
void count_host_tensor_bytes(int64_t delta);

class Tensor {
 public:
  Tensor() = default;
  // A non-owning view of `data`.
  Tensor(void* data, Shape shape, DType dtype, Device device = Device::CPU)
      : data_(data), shape_(shape), dtype_(dtype), device_(device) {}

  // Owning, 64-byte aligned, zero-filled. Not for the step loop (it allocates): use an Arena there.
  static Tensor empty(Shape shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::CPU) { return empty(shape, dtype, device); }

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <typename T> T* data_as() const {
    MT_CHECK(dtype_ == dtype_of<T>(), "tensor is {}, accessed as {}", dtype_name(dtype_), dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.n; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.n + i : i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  // Same memory, another shape with the same number of elements.
  Tensor view(Shape shape) const {
    MT_CHECK(shape.numel() == numel(), "view {} of tensor {}", shape.str(), shape_.str());
    Tensor t = *this;
    t.shape_ = shape;
    return t;
  }
  // A contiguous sub-range of the flattened elements [offset, offset + shape.numel()).
  Tensor slice(int64_t offset, Shape shape) const {
    MT_CHECK(offset >= 0 && offset + shape.numel() <= numel(), "slice [{}, +{}) of {} elements", offset,
          shape.numel(), numel());
    Tensor t = *this;
    t.data_ = static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
    t.shape_ = shape;
    return t;
  }

 private:
  std::shared_ptr<void> owner_;  // set only for owning tensors
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Copies between tensors of equal numel, converting dtype where they differ (fp32/fp64/bf16/fp16).
void copy_convert(const Tensor& dst, const Tensor& src);
// Sets every element to zero.
void zero_(const Tensor& t);

}  // namespace mt
