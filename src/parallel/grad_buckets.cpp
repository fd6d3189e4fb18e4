// Bucketed, overlapped data-parallel gradient reduction (see grad_buckets.h).
#include "parallel/grad_buckets.h"

namespace mt {

std::vector<Bucket> make_buckets(const ParamTable& table, int64_t total_numel, size_t elem_bytes,
                                 double bucket_bytes) {
  CHECK(bucket_bytes > 0, "bucket size must be positive");
  std::vector<Bucket> out;
  Bucket cur;
  for (const ParamSpec& p : table.specs()) {
    const int64_t end = p.offset + p.numel();
    // Close the current bucket before a parameter that would overflow it (never leaving it empty).
    if (cur.end > cur.begin && double(end - cur.begin) * double(elem_bytes) > bucket_bytes) {
      cur.end = p.offset;
      out.push_back(cur);
      cur.begin = p.offset;
    }
    cur.end = end;
  }
  cur.end = total_numel;
  if (cur.end > cur.begin) out.push_back(cur);
  return out;
}

GradReducer::GradReducer(Communicator& dp, const Tensor& grads, std::vector<Bucket> buckets, bool zero, DType wire)
    : dp_(dp), grads_(grads), buckets_(std::move(buckets)), zero_(zero) {
  if (wire != grads.dtype()) {
    CHECK(dtype_size(wire) < dtype_size(grads.dtype()), "gradient buckets: {} gradients sent as {}",
          dtype_name(grads.dtype()), dtype_name(wire));
    wire_ = Tensor::zeros(grads.shape(), wire, grads.device());
  }
  shard_offsets_.push_back(0);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    shard_offsets_.push_back(shard_offsets_.back() + (zero_ ? shard(b).size() : 0));
}

void GradReducer::launch(int b) {
  const Bucket& k = buckets_[b];
  const Tensor& buf = wire_.defined() ? wire_ : grads_;
  Tensor full = buf.slice(k.begin, {k.numel()});
  if (wire_.defined()) copy_convert(full, grads_.slice(k.begin, {k.numel()}));
  if (zero_)  // in place: the output is this rank's own slice of the input (the backend allows that)
    work_.push_back(dp_.reduce_scatter_async(full, buf.slice(k.begin + shard(b).begin, {shard(b).size()}),
                                             ReduceOp::Avg));
  else
    work_.push_back(dp_.all_reduce_async(full, ReduceOp::Avg));
}

void GradReducer::grads_ready(int64_t end) {
  if (!armed_) return;
  while (next_ < static_cast<int>(buckets_.size()) && buckets_[next_].end <= end) launch(next_++);
}

void GradReducer::finish() {
  while (next_ < static_cast<int>(buckets_.size())) launch(next_++);
  for (auto& w : work_) w->wait();
  work_.clear();
  next_ = 0;
  armed_ = false;
  if (!wire_.defined()) return;
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {  // back into the fp32 gradients
    const Bucket& k = buckets_[b];
    const int64_t begin = zero_ ? k.begin + shard(b).begin : k.begin, n = zero_ ? shard(b).size() : k.numel();
    copy_convert(grads_.slice(begin, {n}), wire_.slice(begin, {n}));
  }
}

void GradReducer::all_gather_params(const Tensor& params) {
  CHECK(zero_, "all_gather_params is for ZeRO-1");
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    const Bucket& k = buckets_[b];
    work_.push_back(dp_.all_gather_async(params.slice(k.begin + shard(b).begin, {shard(b).size()}),
                                         params.slice(k.begin, {k.numel()})));
  }
  for (auto& w : work_) w->wait();
  work_.clear();
}

}  // namespace mt
