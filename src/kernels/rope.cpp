// rope_forward / rope_backward: argument checks and device dispatch (kernels/rope.h).
#include "kernels/rope.h"

#include "kernels/cpu/rope_cpu.h"
#include "kernels/cuda/rope_cuda.h"
#include "kernels/kernel_checks.h"

namespace mt::kernels {
using namespace detail;

namespace {
// Checks x and the rotation's arguments; returns N (rows) and W (row width).
void check_rope(const char* op, const char* name, const Tensor& x, int64_t T, int64_t head_size, double theta,
                int64_t col_begin, int64_t col_end, int64_t pos_offset, int64_t& N, int64_t& W) {
  check_defined(x, op, name), check_activation(x, op, name);
  CHECK(x.ndim() >= 1 && x.dim(-1) > 0, "{}: {} {} must be [..., W] with W > 0", op, name, x.shape().str());
  W = x.dim(-1);
  N = x.numel() / W;
  CHECK(T > 0 && N % T == 0, "{}: {} has {} rows, not a whole number of sequences of T={}", op, name, N, T);
  CHECK(head_size > 0 && head_size % 2 == 0, "{}: head_size = {} must be positive and even", op, head_size);
  CHECK(0 <= col_begin && col_begin <= col_end && col_end <= W, "{}: column range [{}, {}) is not within [0, {})", op,
        col_begin, col_end, W);
  CHECK((col_end - col_begin) % head_size == 0, "{}: column range [{}, {}) is not a whole number of heads of {}", op,
        col_begin, col_end, head_size);
  CHECK(std::isfinite(theta) && theta > 0, "{}: theta = {} must be finite and positive", op, theta);
  CHECK(pos_offset >= 0, "{}: pos_offset = {} is negative", op, pos_offset);
}

void rope(const char* op, const char* name, const Tensor& x, int64_t T, int64_t head_size, double theta,
          int64_t col_begin, int64_t col_end, int64_t pos_offset, bool inverse) {
  int64_t N, W;
  check_rope(op, name, x, T, head_size, theta, col_begin, col_end, pos_offset, N, W);
  if (x.device() == Device::CUDA)
    MT_ON_CUDA(op, gpu::rope_rotate(x, T, head_size, theta, col_begin, col_end, pos_offset, inverse));
  dispatch_storage(x.dtype(), [&](auto s) {
    using S = decltype(s);
    cpu::rope_rotate<S>(storage_ptr<S>(x), N, W, T, head_size, theta, col_begin, col_end, pos_offset, inverse);
  });
}
}  // namespace

void rope_forward(const Tensor& x, int64_t T, int64_t head_size, double theta, int64_t col_begin, int64_t col_end,
                  int64_t pos_offset) {
  rope("rope_forward", "x", x, T, head_size, theta, col_begin, col_end, pos_offset, false);
}

void rope_backward(const Tensor& dx, int64_t T, int64_t head_size, double theta, int64_t col_begin, int64_t col_end,
                   int64_t pos_offset) {
  rope("rope_backward", "dx", dx, T, head_size, theta, col_begin, col_end, pos_offset, true);
}

}  // namespace mt::kernels
